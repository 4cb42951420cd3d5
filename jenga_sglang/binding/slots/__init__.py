"""SGLang's slot ids as the tree's pages: the `SlotMemory` boundary, slot-id arrays, the tree's
slots of a request, sliding-window slots, and the KV events they publish. The bottom layer of
the binding."""

"""The SGLang binding, by job (each group imports only the ones below it):

* `plugin` (the entry point), `options` (our flags), `refusals` (SGLang's flags we refuse, and
  why), `vocab_check`, `cpu_snapshots`: hooks on SGLang's server and scheduler;
* `capture/`: how checkpoint states are taken during the prefill (in-pass, or the chunk cut);
* `pools/`: the Jenga pool behind SGLang's pools;
* `cache/`: our tree behind SGLang's `BasePrefixCache`;
* `slots/`: SGLang's slot ids as the tree's pages.

This is the only package that imports sglang, and only inside functions or in modules that the
pure-Python paths never import (`options`, `refusals` and `slots.memory` stay sglang- and
torch-free).
"""

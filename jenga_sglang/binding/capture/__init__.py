"""How checkpoint states are taken during SGLang's prefill: the in-pass capture hooks (Mamba2,
Gated DeltaNet, their geometry) and, where they do not apply, the chunk cut and the shared
prefill wait around SGLang's PrefillAdder. Sits above `cache`."""

"""The Jenga pool behind SGLang's KV and Mamba pools: SGLang pool classes over its views, the
allocators, the pool hooks and SGLang's usage figures over it. Sits above `cache`."""

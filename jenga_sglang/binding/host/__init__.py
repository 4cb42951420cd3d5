"""The live host-memory tier (`--jenga-host-gb`): host memory with real bytes, the copies
between it and SGLang's pools, and the backend's glue (docs/host-tier.md, "The live tier")."""

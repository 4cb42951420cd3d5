"""The simulator: sequential and engine replay over one PrefixCache, the cost model, the
memories that model SGLang's pools, one run's record, and sweeps."""

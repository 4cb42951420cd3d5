"""One run's configuration and flat record, and sweeps of runs in parallel, over whichever
cache is under test: ours in the simulator (bench/simulation/) or driven through SGLang, or
SGLang's own (bench/drivers/)."""

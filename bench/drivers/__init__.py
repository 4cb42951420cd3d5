"""SGLang's own code driven on CPU (its cache stack, its pools, its budget split) and the
live-server plumbing (start and stop on loopback, fault probes, frontend programs, the tiny
model families)."""

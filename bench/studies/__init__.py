"""Studies, each a `jenga-bench` subcommand: fragmentation, long-context batch, scheduler
overhead, eviction throughput, kernel cost, session bounds, policy targets, robustness, CPU
end-to-end serving, online and soak loads, reports."""

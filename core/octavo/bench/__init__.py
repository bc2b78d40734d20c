"""``octavo bench``: the reference workloads, datasets, request arrival, the offline
(latency, throughput) and online (serve) benchmarks, their metrics and reports, auto-tune.
Beside the entrypoints at the top of the core: imports the engine and everything below."""

"""KV connectors for Octavo's disaggregated prefill/decode: shared storage and Mooncake."""

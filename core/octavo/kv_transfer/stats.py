"""KV-transfer counters of one engine (totals since start), reported with the scheduler's
stats and exported on ``/metrics``: they show whether prompt KV was loaded or recomputed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KVTransferStats:
    loads: int = 0  # requests whose prompt KV a connector loaded
    loaded_tokens: int = 0  # prompt tokens loaded instead of computed
    failed_loads: int = 0  # loads that failed: those requests computed their prompt
    saves: int = 0  # requests whose prompt KV a connector saved

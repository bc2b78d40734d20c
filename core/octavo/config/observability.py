"""``ObservabilityConfig``: what the engine reports about itself besides ``/metrics``."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.config.errors import ConfigError


@dataclass
class ObservabilityConfig:
    disable_log_stats: bool = field(default=False, metadata={
        "help": "Do not log throughput, queue and KV-cache figures periodically "
                "(octavo serve)."})
    log_stats_interval: float = 10.0  # seconds between two such log lines

    def __post_init__(self) -> None:
        if not self.log_stats_interval > 0:
            raise ConfigError(f"log_stats_interval must be positive, "
                              f"got {self.log_stats_interval}")

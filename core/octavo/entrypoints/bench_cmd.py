"""``octavo bench``: latency, throughput, online serving and auto-tuning benchmarks."""

from __future__ import annotations

import click


@click.group()
def bench() -> None:
    """Benchmarks: latency, throughput, online serving, auto-tuning."""

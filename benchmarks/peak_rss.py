"""Peak resident memory of a process and everything it starts, per process (Linux).

The kernel keeps each process's RSS high-water mark (``VmHWM`` in ``/proc/<pid>/status``),
so no growth between samples is missed; what sampling adds is the children, which are found
while they live. A child's last reading is taken at most ``interval`` before it exits, which
only misses growth in its final moments.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import psutil


@dataclass
class ProcessPeak:
    pid: int
    name: str  # the process's command name, e.g. "python" or "VLLM::EngineCore"
    peak_bytes: int


@dataclass
class PeakRss:
    """Watches ``pid``'s process tree from a thread until ``stop()``."""

    pid: int
    interval: float = 0.2
    peaks: dict[int, ProcessPeak] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="peak-rss", daemon=True)
        self._thread.start()

    def stop(self) -> list[ProcessPeak]:
        """The peak of every process seen, largest first."""
        self._stop.set()
        self._thread.join()
        return sorted(self.peaks.values(), key=lambda p: -p.peak_bytes)

    def _watch(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval):
                return

    def _sample(self) -> None:
        try:
            root = psutil.Process(self.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in tree:
            peak = _high_water_mark(proc.pid)
            if peak is None:
                continue
            known = self.peaks.get(proc.pid)
            if known is None:
                try:
                    name = proc.name()
                except psutil.NoSuchProcess:
                    continue
                known = self.peaks[proc.pid] = ProcessPeak(proc.pid, name, 0)
            known.peak_bytes = max(known.peak_bytes, peak)


def _high_water_mark(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def describe(peaks: list[ProcessPeak]) -> str:
    """``1.23 GB (python 1.10 GB + VLLM::EngineCore 0.13 GB)``: the sum of every process's
    peak (an upper bound of the tree's peak, since they need not peak together)."""
    total = sum(p.peak_bytes for p in peaks)
    parts = " + ".join(f"{p.name} {p.peak_bytes / 1e9:.2f}" for p in peaks)
    return f"{total / 1e9:.2f} GB ({parts})" if len(peaks) > 1 else f"{total / 1e9:.2f} GB"

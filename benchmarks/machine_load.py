"""How busy the machine was around a benchmark job (Linux), so that a figure taken while
something else ran is marked as such instead of trusted.

Two engines that each bind OpenMP threads to every core slow down by very different amounts
when a third process takes CPU time (benchmarks/RESULTS.md), so a comparison is only worth
what the machine's quiet was. Per job this records the load averages before and after, the
CPU time that processes outside the job took while it ran (all CPU time the kernel counted,
less the job's own process tree's), the hypervisor's steal time, and the processes that were
busy before it started. The gate before a job waits until the CPUs are idle, judged by a
short sample of ``/proc/stat`` rather than the load average, which trails the previous job
by minutes.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field

import psutil

# Whole-machine CPU use below which it counts as idle before a job (a share of all CPUs).
IDLE_BUSY_SHARE = 0.10
# CPU use by others during a job, or steal, above which the job is marked noisy.
NOISY_SHARE = 0.05
SAMPLE_S = 1.0
BUSY_PROCESS_PERCENT = 5.0  # of one CPU: a process listed as competing


@dataclass(frozen=True)
class CpuTimes:
    """Seconds summed over all CPUs since boot (``/proc/stat``'s first line)."""

    busy: float
    steal: float
    total: float

    @classmethod
    def read(cls) -> CpuTimes:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        idle = fields[3] + fields[4]
        steal = fields[7] if len(fields) > 7 else 0
        total = sum(fields[:8])
        return cls(busy=(total - idle - steal) / hz, steal=steal / hz, total=total / hz)


def busy_share(seconds: float = SAMPLE_S) -> float:
    """Share of all CPUs busy over the next ``seconds``."""
    before = CpuTimes.read()
    time.sleep(seconds)
    after = CpuTimes.read()
    return (after.busy - before.busy) / max(after.total - before.total, 1e-9)


def competing_processes(seconds: float = 0.5) -> list[str]:
    """``name (pid): N%`` for each process using over ``BUSY_PROCESS_PERCENT`` of a CPU."""
    me = os.getpid()
    procs = [p for p in psutil.process_iter(["name"]) if p.pid != me]
    for proc in procs:
        try:
            proc.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(seconds)
    busy = []
    for proc in procs:
        try:
            percent = proc.cpu_percent(None)
        except psutil.Error:
            continue
        if percent > BUSY_PROCESS_PERCENT:
            busy.append((percent, f"{proc.info['name']} ({proc.pid}): {percent:.0f}%"))
    return [text for _, text in sorted(busy, reverse=True)]


def wait_for_idle(timeout_s: float) -> tuple[bool, float]:
    """Wait until two successive samples find the CPUs idle; (whether they were, seconds
    waited). ``timeout_s`` 0 takes one sample and does not wait."""
    start = time.monotonic()
    quiet = 0
    while True:
        quiet = quiet + 1 if busy_share() < IDLE_BUSY_SHARE else 0
        waited = time.monotonic() - start
        if quiet >= 2 or (quiet and timeout_s <= 0):
            return True, waited
        if waited >= timeout_s:
            return False, waited


@dataclass
class MachineReport:
    """The machine around one job (stored with the run in compare.py's JSON)."""

    idle_before: bool
    waited_s: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    others_cpu_share: float = 0.0  # CPU time outside the job / (wall time x CPUs)
    steal_share: float = 0.0
    competing_before: list[str] = field(default_factory=list)
    # Started on a busy machine, or others (or the hypervisor) took over NOISY_SHARE.
    noisy: bool = False

    def describe(self) -> str:
        load = "/".join(f"{x:.2f}" for x in self.load_before)
        after = "/".join(f"{x:.2f}" for x in self.load_after)
        text = (f"load {load} -> {after}, others {self.others_cpu_share:.1%} of the CPUs, "
                f"steal {self.steal_share:.1%}")
        if self.competing_before:
            text += "; busy before: " + ", ".join(self.competing_before[:5])
        return ("NOISY: " if self.noisy else "") + text


class JobWatch:
    """Brackets one job: made (after waiting up to ``idle_timeout_s`` for idle CPUs) just
    before the job is launched, ``after()`` once it was waited for. The job's CPU time is
    its process tree's, read from the rusage of waited children (an engine's own workers
    included, once it has waited for them), plus that of the running processes ``serving``
    and their descendants (a server the job sends its requests to)."""

    def __init__(self, idle_timeout_s: float, serving: tuple[int, ...] = ()) -> None:
        idle, waited = wait_for_idle(idle_timeout_s)
        competing = [] if idle else competing_processes()
        self.report = MachineReport(idle, waited, os.getloadavg(), competing_before=competing)
        self._serving = serving
        self._cpu = CpuTimes.read()
        self._children = _children_cpu_s() + tree_cpu_s(serving)
        self._start = time.monotonic()

    def after(self) -> MachineReport:
        cpu = CpuTimes.read()
        wall = time.monotonic() - self._start
        capacity = max(wall * (os.cpu_count() or 1), 1e-9)
        job_cpu = _children_cpu_s() + tree_cpu_s(self._serving) - self._children
        others = max(0.0, cpu.busy - self._cpu.busy - job_cpu)
        self.report.load_after = os.getloadavg()
        self.report.others_cpu_share = others / capacity
        self.report.steal_share = (cpu.steal - self._cpu.steal) / capacity
        self.report.noisy = (not self.report.idle_before
                             or self.report.others_cpu_share > NOISY_SHARE
                             or self.report.steal_share > NOISY_SHARE)
        return self.report


def tree_cpu_s(pids: tuple[int, ...]) -> float:
    """CPU seconds the running processes ``pids`` and their descendants have used."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.Error:  # gone meanwhile: its time is no longer counted anywhere
            continue
    return total


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime

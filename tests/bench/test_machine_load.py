"""``benchmarks/machine_load.py``: a job's CPU time is told apart from other processes', so a
busy neighbour marks the job noisy while the job's own work does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from machine_load import NOISY_SHARE, CpuTimes, JobWatch  # noqa: E402

# Another process busy on the machine changes what these tests measure (scripts/test.sh).
pytestmark = pytest.mark.alone

SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass"


def test_cpu_times_add_up() -> None:
    times = CpuTimes.read()
    assert 0 < times.busy < times.total and 0 <= times.steal < times.total


def test_the_jobs_own_cpu_time_is_not_counted_as_others() -> None:
    """A job spinning one CPU and a job sleeping as long see the same "others" (whatever
    else the machine runs); counted as others, the spin would add 1/CPUs to its share."""
    shares = []
    for job in (SPIN.format(s=2.0), "import time; time.sleep(2.0)"):
        watch = JobWatch(idle_timeout_s=0)
        subprocess.run([sys.executable, "-c", job], check=True)
        report = watch.after()
        assert len(report.load_before) == len(report.load_after) == 3
        shares.append(report.others_cpu_share)
    spinning, sleeping = shares
    assert spinning < sleeping + 0.5 / (os.cpu_count() or 1), shares


def test_a_busy_neighbour_marks_the_job_noisy() -> None:
    watch = JobWatch(idle_timeout_s=0)
    neighbour = subprocess.Popen([sys.executable, "-c", SPIN.format(s=2.0)])
    subprocess.run([sys.executable, "-c", "import time; time.sleep(2.5)"], check=True)
    report = watch.after()  # before the neighbour is reaped: its CPU time is not the job's
    neighbour.wait()
    assert report.others_cpu_share > NOISY_SHARE and report.noisy, report
    assert report.describe().startswith("NOISY: ")

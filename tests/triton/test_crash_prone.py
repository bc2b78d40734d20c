"""Runs ``crash_prone.py`` in a pytest subprocess: those cases probe exactly the accesses
that a wrong mask would make out of bounds, which kills an interpreter process outright.
A crash then fails this one test, with the child's output, instead of ending the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .helpers import REPO


def test_crash_prone_cases_in_a_subprocess() -> None:
    module = Path(__file__).with_name("crash_prone.py").relative_to(REPO)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(module), "-q", "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True, timeout=400)
    crashed = result.returncode < 0 or result.returncode > 128
    assert result.returncode == 0, (
        f"{'crashed' if crashed else 'failed'} with exit code {result.returncode}:\n"
        f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}")
    assert " passed" in result.stdout, result.stdout[-2000:]

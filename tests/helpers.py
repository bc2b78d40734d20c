"""Helpers shared by test folders: running the real ``octavo`` CLI in a subprocess."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path


def run_octavo(*args: str, site: Path | None = None, plugins: str | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m octavo ARGS``; ``site`` is prepended to PYTHONPATH (extra installed
    plugins), ``plugins`` sets OCTAVO_PLUGINS."""
    env = {k: v for k, v in os.environ.items() if k != "OCTAVO_PLUGINS"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    if plugins is not None:
        env["OCTAVO_PLUGINS"] = plugins
    return subprocess.run([sys.executable, "-m", "octavo", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def assert_backend_unavailable(backend: str, looked_for: str) -> None:
    """``--backend NAME`` with the plugin installed but no hardware: exit 2, and the message
    says what was looked for."""
    result = run_octavo("generate", "hello", "--backend", backend)
    assert result.returncode == 2, result.stderr
    assert f"the {backend!r} backend is installed but cannot run here" in result.stderr
    assert looked_for in result.stderr, result.stderr


class Records(logging.Handler):
    """Keeps every log record it is given, for tests that check what was logged."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

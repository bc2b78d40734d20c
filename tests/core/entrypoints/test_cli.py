"""The ``octavo`` command line: backend resolution, exit codes, help."""

from __future__ import annotations

import pytest

from octavo.cpu.platform import CpuPlatform
from octavo.plugins.resolve import PlatformError, resolve_platform
from tests.helpers import run_octavo


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_missing_plugin_says_what_to_install(command: str) -> None:
    args = [command, "hello"] if command == "generate" else [command]
    result = run_octavo(*args, "--backend", "rocm", plugins="hello")
    assert result.returncode == 2, result.stderr
    assert "octavo-rocm distribution, which is not installed" in result.stderr
    assert "pip install ./plugins/triton ./plugins/rocm" in result.stderr


def test_unknown_backend() -> None:
    result = run_octavo("generate", "hello", "--backend", "abacus")
    assert result.returncode == 2
    assert "unknown backend 'abacus'" in result.stderr and "cpu" in result.stderr


def test_auto_resolves_to_cpu_here() -> None:
    assert resolve_platform("auto") is CpuPlatform
    assert resolve_platform("cpu") is CpuPlatform
    with pytest.raises(PlatformError, match="tpu"):
        resolve_platform("tpu")


@pytest.mark.parametrize("command", ["plugins", "serve", "generate", "bench"])
def test_help_is_useful(command: str) -> None:
    result = run_octavo(command, "--help")
    assert result.returncode == 0
    assert "Usage: python -m octavo" in result.stdout and len(result.stdout.splitlines()) > 4

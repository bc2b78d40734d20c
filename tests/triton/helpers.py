"""What the kernel tests share: the device they run on, tolerances, and the
ahead-of-time compile run that the CUDA and ROCm tests use (this module imports no
kernel: kernels imported before tests/triton/conftest.py switches the interpreter on
would stay compiled for a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Absolute tolerances of attention outputs (~unit scale) against an fp64 reference.
ATTENTION_ATOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2.5e-2}



def compile_ahead_of_time(platform: str, targets: list[str], cache_dir: Path,
                          env: dict[str, str] | None = None, gemm: bool = False) -> list[str]:
    """Compile every kernel for ``targets`` with ``platform``'s tuning (``module:Class``)
    in a subprocess without the interpreter (``tests/triton/aot.py``), into an empty
    Triton cache so that nothing is reused; returns the ``ok`` lines, asserting that
    nothing failed. ``env``: the subprocess's environment (default: this one's);
    ``gemm``: the GEMM kernels instead of the layer and attention ones."""
    env = {k: v for k, v in (env or os.environ).items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    family = ["--gemm"] if gemm else []
    result = subprocess.run([sys.executable, "-m", "tests.triton.aot", *family, platform,
                             *targets],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=500)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-3000:]}"
    return [line for line in result.stdout.splitlines() if line.startswith("ok ")]


KERNELS = ("attention", "combine", "reshape_and_cache", "rms_norm", "rotary", "silu_and_mul")


def assert_every_kernel_built(ok_lines: list[str], target: str) -> None:
    """Each kernel has at least one variant built for ``target`` (lines ``ok TARGET NAME``)."""
    built = [line.split(" ", 2)[2] for line in ok_lines if line.startswith(f"ok {target} ")]
    missing = [kernel for kernel in KERNELS if not any(b.startswith(kernel) for b in built)]
    assert not missing, f"{target}: nothing built for {missing}; built: {built}"

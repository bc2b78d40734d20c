"""The GPU path under the oldest Triton it accepts: 3.6.0, the lent H200 machine's (this
machine's is newer). Triton 3.6 is put first on ``PYTHONPATH`` in subprocesses; there every
GPU module imports, every kernel compiles ahead of time for sm_90 and gfx942, and the
Triton tests pass under 3.6 (its interpreter with octavo_triton.interpret's backport of
one 3.7 fix). (torch 2.11, the image's other old pin, cannot
be tried here: PyPI's builds of it are CUDA builds that need the CUDA libraries.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .helpers import REPO, assert_every_kernel_built, compile_ahead_of_time

# A GPU machine runs the kernels under its own Triton, and may have no network to fetch 3.6.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="checks for machines without a GPU")

OLDEST = "3.6.0"
GPU_PACKAGES = ("octavo_triton", "octavo_cuda", "octavo_rocm")


@pytest.fixture(scope="module")
def old_triton_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """This environment with Triton ``OLDEST`` (from the package index) ahead of ours."""
    target = tmp_path_factory.mktemp(f"triton-{OLDEST}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--target", str(target), f"triton=={OLDEST}"], check=True, timeout=900)
    path = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def test_every_gpu_module_imports(old_triton_env: dict[str, str]) -> None:
    script = f"""
import importlib, pkgutil, triton
assert triton.__version__ == {OLDEST!r}, triton.__version__
names = []
for package in {GPU_PACKAGES!r}:
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
        names.append(info.name)
print(len(names), "modules imported under triton", triton.__version__)
"""
    env = {k: v for k, v in old_triton_env.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"under triton {OLDEST}" in result.stdout


def test_every_kernel_compiles_for_sm90_and_gfx942(old_triton_env: dict[str, str],
                                                   tmp_path: Path) -> None:
    cuda = compile_ahead_of_time("octavo_cuda.platform:CudaPlatform", ["sm_90"],
                                 tmp_path / "cuda", old_triton_env)
    assert_every_kernel_built(cuda, "sm_90")
    rocm = compile_ahead_of_time("octavo_rocm.platform:RocmPlatform", ["gfx942"],
                                 tmp_path / "rocm", old_triton_env)
    assert_every_kernel_built(rocm, "gfx942")


def test_the_triton_tests_pass_under_it(old_triton_env: dict[str, str]) -> None:
    """tests/triton but this file: the kernels against their references under 3.6's
    interpreter, the engine on the interpreted kernels, and the ahead-of-time builds."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "tests/triton", f"--ignore={Path(__file__).relative_to(REPO)}"],
                            env=old_triton_env, cwd=REPO, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    assert " passed" in result.stdout.splitlines()[-1]

"""The CPU kernels' library: compiled on first use with the system C compiler, kept in the
user cache folder, loaded by every later process.

The C sources ship with the package. The first process that needs the kernels compiles them
(``cc -O3 -march=native -fopenmp``, a few seconds) into ``<cache>/kernels/``, under a name
keyed by the sources, the compiler, the flags and the CPU: a change to any of them builds
afresh, and an unchanged one loads the file as it is. Processes that start together (the
ranks of a tensor-parallel group) take a lock in that folder, so one compiles while the
others wait and then load its result; the build writes to a temporary name and renames it into
place, so no process ever loads a half-written library, even after a crash mid-build.

The library links the OpenMP runtime torch already loaded (same soname), so both share one
thread pool and ``torch.set_num_threads`` governs the kernels too. Without a compiler, on a
system other than Linux, or with ``OCTAVO_CPU_KERNELS=0``, nothing is loaded and the layers
keep their PyTorch code, which computes the same thing.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from octavo.paths import cache_root

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
# Compiled apart and linked into one library.
SOURCES = [HERE / name
           for name in ("cpu_ops.c", "cpu_attention.c", "cpu_layer.c", "cpu_ssm.c",
                        "cpu_quant.c", "cpu_quant_q8.c", "cpu_quant_gemm.c", "cpu_kv_fp8.c",
                        "cpu_lora.c", "cpu_interface.c")]
INTERFACE = HERE / "octavo_cpu.h"  # what Python calls (octavo.cpu.kernel_header reads it)
HEADERS = [INTERFACE, HERE / "cpu_kernels.h"]
ENABLE_ENV = "OCTAVO_CPU_KERNELS"
# -Werror=missing-prototypes: a function the library exports must be declared in
# octavo_cpu.h, where Python reads its signature (static helpers need no declaration).
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC",
         "-Werror=missing-prototypes"]
# Linked apart, without -ffast-math: given at link time it adds crtfastmath.o, whose
# constructor sets flush-to-zero and denormals-are-zero for the whole process on load, so
# every subnormal float in the engine (a request's top_p=1e-310, say) would read as 0.
LINK_FLAGS = ["-fopenmp", "-shared"]
LIBS = ["-lmvec", "-lm"]  # -ffast-math vectorises expf through glibc's libmvec


def load() -> ctypes.CDLL | None:
    """The compiled library, built first if the cache lacks it; None (with a warning saying
    why) where the kernels are switched off, not built on this system, or fail to build."""
    if os.environ.get(ENABLE_ENV, "1") == "0":
        return None
    if platform.system() != "Linux":
        logger.warning("the CPU backend's fused kernels are built on Linux only: running "
                       "without them (slower)")
        return None
    cc = compiler()
    if cc is None:
        logger.warning("no C compiler found: the CPU backend runs without its fused kernels "
                       "(slower); install gcc to enable them")
        return None
    try:
        return ctypes.CDLL(str(built_library(cc)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        logger.warning("CPU kernels unavailable, using PyTorch ops instead: %s", error)
        return None


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def built_library(compiler: str, flags: list[str] | None = None) -> Path:
    """The library built by ``compiler`` with ``flags`` (default ``FLAGS``), from the cache
    or compiled now; RuntimeError with the compiler's message when it fails."""
    flags = FLAGS if flags is None else flags
    target = library_path(compiler, flags)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / "build.lock", "w") as lock:  # one for every build: they are rare
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not target.is_file():  # else another process built it while this one waited
            _build(compiler, flags, target)
    return target


def library_path(compiler: str, flags: list[str]) -> Path:
    """Where the cache keeps the library of these sources, compiler, flags and CPU."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = "\0".join([*(path.read_text() for path in [*SOURCES, *HEADERS]), version,
                     " ".join(flags + LINK_FLAGS + LIBS), _cpu_identity()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"cpu_ops-{digest}.so"


def _build(compiler: str, flags: list[str], target: Path) -> None:
    """Compile into a temporary folder beside ``target``, then rename into place."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        objects = [str(Path(tmp) / source.with_suffix(".o").name) for source in SOURCES]
        steps = [(source.name, [compiler, *flags, "-c", str(source), "-o", obj])
                 for source, obj in zip(SOURCES, objects)]
        steps.append(("linking", [compiler, *LINK_FLAGS, *objects, "-o", str(built), *LIBS]))
        for what, command in steps:
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"{compiler} failed on {what}:\n{result.stderr[-2000:]}")
        built.replace(target)


def _cpu_identity() -> str:
    """What -march=native compiles for: the CPU model and its feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))

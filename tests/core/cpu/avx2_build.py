"""The CPU kernels' library as an AVX2 CPU (x86-64-v3) builds it, for the tests that check
the paths such a CPU takes (no AVX-512 code): built once into the kernel cache, like the
native one, and bound to the header's signatures."""

from __future__ import annotations

import ctypes

from octavo.cpu import kernel_build, kernels


def avx2_library() -> ctypes.CDLL:
    compiler = kernel_build.compiler()
    assert compiler is not None
    flags = [flag.replace("-march=native", "-march=x86-64-v3") for flag in kernel_build.FLAGS]
    library = ctypes.CDLL(str(kernel_build.built_library(compiler, flags)))
    kernels.HEADER.bind(library)
    return library

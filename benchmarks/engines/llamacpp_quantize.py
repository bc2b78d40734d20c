"""llama.cpp's own quantizer (``llama_model_quantize`` through llama-cpp-python) rewriting a
GGUF in another type: the bf16 file compare.py runs llama.cpp on, and the ``Q4_K_M`` file
issue 45 measures Octavo on. Run with the Python of the environment llama-cpp-python is
installed in (benchmarks/README.md):

    python llamacpp_quantize.py SOURCE.gguf TARGET.gguf TYPE    # TYPE: BF16, Q4_K_M, ...

A quantized source is dequantized first (``allow_requantize``), as llama-quantize does with
``--allow-requantize``; the target is written under a temporary name and renamed when done."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import llama_cpp


def quantize(source: Path, target: Path, type_name: str) -> Path:
    """``target``, written by llama.cpp from ``source`` as ``LLAMA_FTYPE_MOSTLY_<type_name>``,
    unless it is there already."""
    if target.is_file():
        return target
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name.upper()}", None)
    if ftype is None:
        raise SystemExit(f"llama.cpp has no file type {type_name!r} (LLAMA_FTYPE_MOSTLY_*)")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    partial = target.with_suffix(".partial")
    failed = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(),
                                            ctypes.byref(params))
    if failed:
        raise SystemExit(f"llama.cpp could not write {source} as {type_name} (error {failed})")
    partial.rename(target)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    quantize(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])

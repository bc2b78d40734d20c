"""The CPU kernels' one interface (octavo/cpu/octavo_cpu.h) holds on both sides: the ctypes
structs Python builds from it have the compiler's layout, the compiler holds every C
definition to it, the reader refuses what it cannot read, and a kernel that fails (out of
memory, or missing from this build) raises CpuKernelError naming it instead of aborting."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest
import torch

from octavo.cpu import kernel_build, kernels
from octavo.cpu.kernel_header import CStruct, Layout, ctypes_layout, read_header
from tests.core.cpu.avx2_build import avx2_library

pytestmark = pytest.mark.skipif(kernels.library() is None, reason="no C compiler here")

BF16 = torch.bfloat16
NO_ROOM = 2**50  # rows no scratch allocation can hold (beyond any address space)


def differences(python: Layout, compiled: Layout) -> list[str]:
    """Where ctypes' layout of a struct differs from the compiler's, field by field."""
    ours = {name: (offset, size) for name, offset, size in python.fields}
    theirs = {name: (offset, size) for name, offset, size in compiled.fields}
    found = [f"field {name}: Python {_place(ours.get(name))}, C {_place(theirs.get(name))}"
             for name in dict.fromkeys([*ours, *theirs]) if ours.get(name) != theirs.get(name)]
    if python.size != compiled.size:
        found.append(f"size: Python {python.size} bytes, C {compiled.size}")
    return found


def _place(where: tuple[int, int] | None) -> str:
    return "has none" if where is None else f"at offset {where[0]} ({where[1]} bytes)"


def test_every_struct_has_the_compilers_layout() -> None:
    """Each struct of the header, as the ctypes class the wrappers fill and as the compiled
    library lays it out (octavo_layout, made from the same field lists): same fields in the
    same order, at the same offsets, of the same sizes, and the same total size."""
    classes = {cls.c_name: cls for cls in CStruct.__subclasses__()}
    compiled = kernels.compiled_layouts()
    assert set(classes) == set(kernels.HEADER.structs) == set(compiled), (
        "a struct without its ctypes class or its row in octavo_layout")
    for name, cls in classes.items():
        python = ctypes_layout(cls)
        problems = differences(python, compiled[name])
        assert not problems, f"{name}: " + "; ".join(problems)
        assert [f[0] for f in python.fields] == [f[0] for f in compiled[name].fields], name


def test_structs_are_filled_field_by_field() -> None:
    """A field the header gains that a caller does not set is an error naming it, not a
    zero the kernel would read."""
    with pytest.raises(TypeError, match="octavo_decode_step: no value for cos, no value for"):
        kernels.DecodeStep(tokens=1)
    with pytest.raises(TypeError, match="octavo_layout_entry: no field named extra"):
        kernels.LayoutEntry(struct_name=None, field=None, offset=0, size=0, extra=1)


@pytest.mark.parametrize(("source", "complaint"), [
    ("int octavo_undeclared(int x) { return x; }", "no previous prototype"),
    ("void octavo_gemv(bf16 *y) { (void)y; }", "conflicting types"),
], ids=["undeclared", "disagreeing"])
def test_the_compiler_holds_every_definition_to_the_header(tmp_path: Path, source: str,
                                                           complaint: str) -> None:
    """With the library's flags, an exported function the header does not declare, or one
    whose definition disagrees with its declaration, does not compile."""
    compiler = kernel_build.compiler()
    assert compiler is not None
    path = tmp_path / "extra.c"
    path.write_text(f'#include "octavo_cpu.h"\n{source}\n')
    result = subprocess.run([compiler, *kernel_build.FLAGS, f"-I{kernel_build.HERE}", "-c",
                             str(path), "-o", str(tmp_path / "extra.o")],
                            capture_output=True, text=True)
    assert result.returncode != 0 and complaint in result.stderr, result.stderr


@pytest.mark.parametrize(("line", "complaint"), [
    ("extern int64_t octavo_count;", "cannot read 'extern int64_t octavo_count'"),
    ("#define BAD_FIELDS(FIELD) FIELD(long double, x)\n"
     "typedef struct { BAD_FIELDS(OCTAVO_FIELD) } bad;", "no ctype for the C type 'long double'"),
], ids=["statement", "type"])
def test_the_reader_refuses_what_it_cannot_read(tmp_path: Path, line: str,
                                                complaint: str) -> None:
    header = tmp_path / "octavo_cpu.h"
    header.write_text(kernel_build.INTERFACE.read_text().replace("#endif", f"{line}\n#endif"))
    with pytest.raises(ValueError, match=complaint):
        read_header(header)


def test_a_kernel_out_of_memory_raises_naming_it() -> None:
    """Scratch no allocation can hold: the kernel returns before touching any tensor, and
    the wrapper raises; the fused stack names its own entry point."""
    q = torch.zeros(1, 2, 64, dtype=BF16)
    cache = torch.zeros(2, 16, 64, dtype=BF16)
    slots, seq_lens = torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    with pytest.raises(kernels.CpuKernelError,
                       match="octavo_decode_attention failed: out of memory"):
        kernels.decode_attention(q, cache, slots, seq_lens, NO_ROOM, 1, 0.125)
    layer = kernels.LayerWeights(
        input_norm=None, post_norm=None, qkv=None, o=None, gate_up=None, down=None,
        qkv_bias=None, o_bias=None, gate_up_bias=None, down_bias=None, qkv_scale=None,
        o_scale=None, gate_up_scale=None, down_scale=None, qkv_type=0, o_type=0,
        gate_up_type=0, down_type=0, hidden=64, num_heads=2, num_kv_heads=1, head_dim=64,
        intermediate=128, qkv_lora=None, o_lora=None, gate_up_lora=None, down_lora=None,
        eps=1e-5, scale=0.125)
    step = kernels.DecodeStep(tokens=NO_ROOM, cos=None, sin=None, slot_mapping=None,
                              slots=None, seq_lens=None, max_len=1, prefix_slots=None,
                              prefix_len=0,
                              lora_sorted_tokens=None, lora_starts=None, lora_counts=None)
    stack = kernels.LayerStack([layer], [cache])
    with pytest.raises(kernels.CpuKernelError,
                       match="octavo_decode_layers failed: out of memory"):
        kernels.decode_layers(stack, step, torch.zeros(1, 64, dtype=BF16))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="builds for an x86-64 level")
def test_a_build_without_avx512_returns_errors_from_its_missing_kernels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The library built for an AVX2 CPU (x86-64-v3): it says which kernels it lacks, and
    each of them, called anyway, raises naming itself and what it needs."""
    avx2 = avx2_library()
    monkeypatch.setattr(kernels, "library", lambda: avx2)
    assert not (kernels.gemm_available() or kernels.pair_gemm_available())
    x, weight = torch.zeros(2, 32, dtype=BF16), torch.zeros(32, 32, dtype=BF16)
    cache, slots = torch.zeros(2, 16, 64, dtype=BF16), torch.zeros(1, 1, dtype=torch.int64)
    assert not kernels.attention_available(64, cache)
    calls = {
        "octavo_gemm": lambda: kernels.gemm(x, weight, None, 32),
        "octavo_pair_gemm": lambda: kernels.pair_gemm(x, weight, None, 32),
        "octavo_pair_gemm_silu": lambda: kernels.pair_gemm_silu(x, weight, None, 16),
        "octavo_prefill_attention": lambda: kernels.prefill_attention(
            torch.zeros(1, 1, 64, dtype=BF16), torch.zeros(1, 1, 64, dtype=BF16), cache,
            slots, torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64),
            torch.ones(1, dtype=torch.int64), 1, 0.125),
        "octavo_prefix_attention": lambda: kernels.prefix_attention(
            torch.zeros(1, 1, 64, dtype=BF16), cache, slots[0], 1, 0.125),
    }
    for kernel, call in calls.items():
        needs = "AVX-512" if kernel == "octavo_gemm" else "AVX512-BF16"
        with pytest.raises(kernels.CpuKernelError,
                           match=f"{kernel} failed: built without {needs}"):
            call()

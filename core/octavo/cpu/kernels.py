"""Fused bf16 CPU kernels (cpu_ops.c, cpu_attention.c, cpu_layer.c): their typed Python
wrappers.

Why: decoding one token of SmolLM2-135M runs ~80 PyTorch ops per layer. On the CPU each op
costs microseconds of dispatch whatever its size, so a single-stream decode step spent about
as long in RMSNorm, RoPE, SiLU and attention bookkeeping as in its matmuls; and batched
decode copied every request's whole context out of the paged cache in every layer before
attending it. These kernels do each of those chains in one call and attend straight from
the cache.

How: ``octavo.cpu.kernel_build`` compiles the C sources on first use and loads the library;
``octavo.cpu.kernel_header`` reads their interface (octavo_cpu.h), from which every entry
point's ctypes signature, the structs below and the panel sizes come. Each wrapper checks
the tensors it is given, passes their addresses, and raises :class:`CpuKernelError` naming
the kernel when one returns a failure (out of memory, or a kernel this build lacks: callers
choose a path with the ``*_available()`` checks first). A decode step of fused layers is one
call (:func:`decode_layers`), whatever the number of layers.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from octavo.cpu import kernel_build
from octavo.cpu.allocator import weight_arena
from octavo.cpu.kernel_header import CStruct, Layout, read_header

HEADER = read_header(kernel_build.INTERFACE)
GEMM_PANEL = HEADER.constants["GEMM_PANEL"]  # columns per weight panel of the panel GEMM
PAIR_PANEL = HEADER.constants["PAIR_PANEL"]  # output columns per panel of the pair GEMM
_ptr = ctypes.c_void_p


class CpuKernelError(RuntimeError):
    """A CPU kernel returned a failure; the message names the kernel and says what failed."""


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels with every entry point of the header declared, or None (disabled,
    not Linux, or no working compiler: see ``octavo.cpu.kernel_build``)."""
    lib = kernel_build.load()
    if lib is not None:
        HEADER.bind(lib)
    return lib


def _failure(kernel: str, status: int) -> CpuKernelError:
    lib = library()
    assert lib is not None
    return CpuKernelError(f"{kernel} failed: {lib.octavo_status_message(status).decode()} "
                          f"(status {status})")


def check_status(kernel: str, status: int) -> None:
    """Raise :class:`CpuKernelError` naming ``kernel`` when it returned a failure."""
    if status:
        raise _failure(kernel, status)


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels can take these tensors: bf16 on the CPU, library loaded."""
    for tensor in tensors:  # a loop, not all(...): this runs several times per layer
        if tensor.dtype is not torch.bfloat16 or not tensor.is_cpu:
            return False
    return library() is not None


def _rows(x: torch.Tensor) -> tuple[int, int]:
    """Rows and row stride of a 2-D view whose rows are contiguous."""
    assert x.dim() == 2 and x.stride(1) == 1, (x.shape, x.stride())
    return x.shape[0], x.stride(0)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` for one contiguous row ``x`` [1, in] and ``weight``
    [out, in] contiguous: [1, out]."""
    out_features, in_features = weight.shape
    assert x.is_contiguous() and x.numel() == in_features and weight.is_contiguous()
    y = torch.empty((1, out_features), dtype=x.dtype)
    lib = library()
    assert lib is not None
    lib.octavo_gemv(y.data_ptr(), weight.data_ptr(), x.data_ptr(),
                    None if bias is None else bias.data_ptr(), out_features, in_features)
    return y


def gemm_available() -> bool:
    """Whether the panel GEMM was built with AVX-512 here (it has no other path)."""
    lib = library()
    return lib is not None and bool(lib.octavo_gemm_available())


def pack_gemm_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] as the panels :func:`gemm` reads: [out / 32, in, 32], the last
    panel zero-padded, each panel's columns interleaved (0, 16, 1, 17, ...) so that one
    32-bit lane holds two columns the kernel widens apart with a shift and a mask. A copy
    the size of the weight, made once at load."""
    out_features, in_features = weight.shape
    padded = -out_features % GEMM_PANEL
    if padded:
        weight = torch.cat([weight, weight.new_zeros(padded, in_features)])
    half = GEMM_PANEL // 2
    interleave = torch.arange(GEMM_PANEL).view(2, half).T.reshape(-1)
    panels = weight.view(-1, GEMM_PANEL, in_features)[:, interleave].transpose(1, 2)
    return panels.contiguous()


def pack_bias(bias: torch.Tensor, panel: int) -> torch.Tensor:
    """``bias`` in fp32 (added before the single rounding), zero-padded to whole panels of
    ``panel`` columns (``GEMM_PANEL`` or ``PAIR_PANEL``)."""
    return torch.nn.functional.pad(bias.float(), (0, -bias.numel() % panel))


def _packed_gemm(kernel: str, x: torch.Tensor, packed: torch.Tensor,
                 bias32: torch.Tensor | None, out_features: int,
                 scale32: torch.Tensor | None = None) -> torch.Tensor:
    """``kernel(y, x, x_stride, packed, [scale,] bias, rows, out, in)``: a GEMM on a
    prepacked weight, for rows ``x`` [T, in] with contiguous rows; returns ``y`` [T, out].
    The per-column ``scale`` is passed where given (the fp8 GEMM's)."""
    rows, stride = _rows(x)
    y = torch.empty((rows, out_features), dtype=x.dtype)
    lib = library()
    assert lib is not None
    scale = () if scale32 is None else (scale32.data_ptr(),)
    status = getattr(lib, kernel)(y.data_ptr(), x.data_ptr(), stride, packed.data_ptr(),
                                  *scale, None if bias32 is None else bias32.data_ptr(), rows,
                                  out_features, x.shape[1])
    if status:
        raise _failure(kernel, status)
    return y


def gemm(x: torch.Tensor, panels: torch.Tensor, bias32: torch.Tensor | None,
         out_features: int) -> torch.Tensor:
    """``x @ weight.T + bias`` for rows ``x`` [T, in] with contiguous rows, ``weight``
    given as :func:`pack_gemm_weight`'s panels: [T, out]."""
    return _packed_gemm("octavo_gemm", x, panels, bias32, out_features)


def pair_gemm_available() -> bool:
    """Whether the pair GEMM was built here (it needs AVX512-BF16)."""
    lib = library()
    return lib is not None and bool(lib.octavo_pair_gemm_available())


def pack_pair_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] (``in`` even) as the panels :func:`pair_gemm` reads:
    ``[ceil(out / 16), in / 2, 16, 2]``, the last panel zero-padded: row ``i`` of panel
    ``p`` holds, for each of its 16 output columns, the weights of inputs ``2i`` and
    ``2i + 1`` side by side - the operand layout of AVX512-BF16's pair dot product. A copy
    the size of the weight, made once at load, on huge pages (``weight_arena``)."""
    out_features, in_features = weight.shape
    assert in_features % 2 == 0, "the pair GEMM takes an even number of inputs"
    padded = -out_features % PAIR_PANEL
    if padded:
        weight = torch.cat([weight, weight.new_zeros(padded, in_features)])
    panels = weight.view(-1, PAIR_PANEL, in_features // 2, 2).transpose(1, 2)
    packed = weight_arena().empty(tuple(panels.shape), weight.dtype)
    return packed.copy_(panels)


def pair_gemm(x: torch.Tensor, packed: torch.Tensor, bias32: torch.Tensor | None,
              out_features: int) -> torch.Tensor:
    """``x @ weight.T + bias`` for rows ``x`` [T, in] with contiguous rows, ``weight``
    given as :func:`pack_pair_weight`'s panels: [T, out]."""
    return _packed_gemm("octavo_pair_gemm", x, packed, bias32, out_features)


def pair_gemm_silu(x: torch.Tensor, packed: torch.Tensor, bias32: torch.Tensor | None,
                   d: int) -> torch.Tensor:
    """``silu(gate) * up`` of the gate/up projection ``x @ weight.T + bias`` (``weight``
    [2 * d, in] as :func:`pack_pair_weight`'s panels, the gate's d outputs then the up's;
    ``d`` a multiple of ``PAIR_PANEL``) in one pass: [T, d], as :func:`pair_gemm` then
    :func:`silu_and_mul` round it, without writing the [T, 2 * d] projection out."""
    assert d % PAIR_PANEL == 0, "the fused gate/up GEMM takes whole panels of each half"
    return _packed_gemm("octavo_pair_gemm_silu", x, packed, bias32, d)


def fp8_pair_gemm(x: torch.Tensor, packed: torch.Tensor, scale32: torch.Tensor,
                  bias32: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """``(x @ weight.T) * scale + bias`` for an fp8 e4m3 ``weight`` given as
    :func:`pack_pair_weight`'s panels of its bytes (``weight.view(torch.uint8)``), with
    ``scale`` and ``bias`` fp32 per output column padded as :func:`pack_bias` pads: [T, out],
    the bf16 GEMM's result on the dequantized weight."""
    return _packed_gemm("octavo_fp8_pair_gemm", x, packed, bias32, out_features, scale32)


def rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
             eps: float) -> torch.Tensor:
    """``weight * rmsnorm(x)``; with ``residual``, ``x`` first becomes ``x + residual`` in
    place (the next residual stream). ``x``, ``residual``: [rows, dim]."""
    rows, x_stride = _rows(x)
    res_stride = _rows(residual)[1] if residual is not None else 0
    out = torch.empty(x.shape, dtype=x.dtype)
    lib = library()
    assert lib is not None
    lib.octavo_rms_norm(out.data_ptr(), x.data_ptr(),
                        None if residual is None else residual.data_ptr(), weight.data_ptr(),
                        rows, x.shape[1], x_stride, res_stride, eps)
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``x`` = [rows, 2 * d] (gate and up side by side)."""
    rows, stride = _rows(x)
    d = x.shape[1] // 2
    out = torch.empty((rows, d), dtype=x.dtype)
    lib = library()
    assert lib is not None
    lib.octavo_silu_and_mul(out.data_ptr(), x.data_ptr(), rows, d, stride)
    return out


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotary embedding in place: ``q`` [T, heads, D], ``k`` [T, kv_heads, D] (heads
    contiguous within a token), ``cos``/``sin`` [T, 1, D] contiguous, ``sin`` signed."""
    tokens, num_heads, head_dim = q.shape
    assert q.stride()[1:] == (head_dim, 1) and k.stride()[1:] == (head_dim, 1)
    assert cos.is_contiguous() and sin.is_contiguous()
    lib = library()
    assert lib is not None
    lib.octavo_rope(q.data_ptr(), k.data_ptr(), cos.data_ptr(), sin.data_ptr(), tokens,
                    num_heads, k.shape[1], head_dim, q.stride(0), k.stride(0))


def write_kv(cache_rows: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store ``key``/``value`` rows [T, width] at their slots of ``cache_rows``
    [2, slots, width]."""
    tokens, key_stride = _rows(key)
    value_stride = _rows(value)[1]
    assert cache_rows.is_contiguous()
    assert slot_mapping.dtype == torch.int64 and slot_mapping.is_contiguous()
    lib = library()
    assert lib is not None
    lib.octavo_write_kv(cache_rows.data_ptr(), cache_rows.shape[1], key.data_ptr(),
                        value.data_ptr(), slot_mapping.data_ptr(), tokens, key.shape[1],
                        key_stride, value_stride)


@dataclass
class PrefixState:
    """The part of decode rows' attention over a prefix of positions they share
    (:func:`prefix_attention`): per row and query head the running max, the sum of the
    exponentials and the unnormalised output, in fp32."""

    maxes: torch.Tensor  # [B, heads]
    sums: torch.Tensor  # [B, heads]
    outputs: torch.Tensor  # [B, heads, head_dim]


def decode_attention(q: torch.Tensor, cache_rows: torch.Tensor, slots: torch.Tensor,
                     seq_lens: torch.Tensor, max_len: int, num_kv_heads: int,
                     scale: float, prefix: PrefixState | None = None,
                     values_are_keys: bool = False) -> torch.Tensor:
    """One query token per request (``q`` [B, heads, D]) over its context in the paged
    cache (``cache_rows`` [2, slots, kv_heads * D]); ``slots`` [B * max_len] int64,
    ``seq_lens`` [B] int64. With ``prefix``, the positions given follow a prefix the rows
    share, whose part ``prefix`` holds: both parts make the output. ``values_are_keys``:
    ``cache_rows`` is one plane [slots, kv_heads * D] whose rows are the values too (a
    latent attention cache): the kernel finds the values ``num_slots`` rows after the keys,
    and is told 0."""
    batch, num_heads, head_dim = q.shape
    assert q.stride()[1:] == (head_dim, 1) and cache_rows.is_contiguous()
    assert slots.is_contiguous() and seq_lens.is_contiguous()
    out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype)
    shared = (None, None, None) if prefix is None else (
        prefix.maxes.data_ptr(), prefix.sums.data_ptr(), prefix.outputs.data_ptr())
    lib = library()
    assert lib is not None
    status = lib.octavo_decode_attention(out.data_ptr(), q.data_ptr(), cache_rows.data_ptr(),
                                         0 if values_are_keys else cache_rows.shape[1],
                                         slots.data_ptr(),
                                         seq_lens.data_ptr(), batch, max_len, num_heads,
                                         num_kv_heads, head_dim, q.stride(0), scale, *shared)
    if status:
        raise _failure("octavo_decode_attention", status)
    return out


def attention_available(head_dim: int, cache_rows: torch.Tensor) -> bool:
    """Whether :func:`prefill_attention` and :func:`prefix_attention` can run: built here
    (AVX512-BF16), ``head_dim`` a multiple of 16, and every cache row addressable by the
    32-bit gather indices they use."""
    lib = library()
    return (lib is not None and bool(lib.octavo_attention_available()) and head_dim % 16 == 0
            and cache_rows[0].numel() // 2 < 2**31)


def prefill_attention(out: torch.Tensor, q: torch.Tensor, cache_rows: torch.Tensor,
                      slots: torch.Tensor, query_start: torch.Tensor, query_lens: torch.Tensor,
                      seq_lens: torch.Tensor, num_kv_heads: int, scale: float) -> None:
    """Causal attention of prompt chunks over their contexts, read from the paged cache
    (their own keys and values already written there), into their rows of ``out``
    [T, heads, D] (contiguous; other rows untouched). ``q`` [T, heads, D]: request ``r``'s
    chunk is the ``query_lens[r]`` rows from ``query_start[r]``; its context is positions
    ``0 .. seq_lens[r] - 1`` at ``slots[r]`` ([R, max_ctx] int64), and its last query token
    sits at position ``seq_lens[r] - 1``. The [R] arrays are int64."""
    num_heads, head_dim = q.shape[1:]
    assert q.stride()[1:] == (head_dim, 1) and out.is_contiguous() and out.shape == q.shape
    assert cache_rows.is_contiguous() and slots.is_contiguous()
    assert query_start.is_contiguous() and query_lens.is_contiguous()
    assert seq_lens.is_contiguous()
    lib = library()
    assert lib is not None
    status = lib.octavo_prefill_attention(out.data_ptr(), q.data_ptr(), q.stride(0),
                                          cache_rows.data_ptr(), cache_rows.shape[1],
                                          slots.data_ptr(), slots.shape[1],
                                          query_start.data_ptr(), query_lens.data_ptr(),
                                          seq_lens.data_ptr(), len(seq_lens), num_heads,
                                          num_kv_heads, head_dim, scale)
    if status:
        raise _failure("octavo_prefill_attention", status)


def prefix_attention(q: torch.Tensor, cache_rows: torch.Tensor, prefix_slots: torch.Tensor,
                     num_kv_heads: int, scale: float) -> PrefixState:
    """The part of decode rows' attention (``q`` [B, heads, D], one token each) over the
    positions at ``prefix_slots`` [P] int64 that they all share: computed once for all rows
    (cascade attention), to be completed by :func:`decode_attention`."""
    batch, num_heads, head_dim = q.shape
    assert q.stride()[1:] == (head_dim, 1) and cache_rows.is_contiguous()
    assert prefix_slots.is_contiguous()
    state = PrefixState(torch.empty(batch, num_heads), torch.empty(batch, num_heads),
                        torch.empty(batch, num_heads, head_dim))
    lib = library()
    assert lib is not None
    status = lib.octavo_prefix_attention(state.maxes.data_ptr(), state.sums.data_ptr(),
                                         state.outputs.data_ptr(), q.data_ptr(), q.stride(0),
                                         batch, cache_rows.data_ptr(), cache_rows.shape[1],
                                         prefix_slots.data_ptr(), len(prefix_slots), num_heads,
                                         num_kv_heads, head_dim, scale)
    if status:
        raise _failure("octavo_prefix_attention", status)
    return state


class LoRASlots(CStruct):
    """``octavo_lora``: a projection's LoRA adapter slots as the fused layer adds their
    delta (``octavo.cpu.lora.LayerDelta.slots`` fills it)."""

    c_name = "octavo_lora"
    _fields_ = HEADER.fields(c_name)


class LayerWeights(CStruct):
    """``octavo_layer``: a Llama-family decoder layer's packed weights and sizes, fixed for
    the layer's life."""

    c_name = "octavo_layer"
    _fields_ = HEADER.fields(c_name)


class DecodeStep(CStruct):
    """``octavo_decode_step``: what one decode step gives every layer. The tensors it points
    into must outlive it (``octavo.cpu.decode_layer.decode_step`` keeps them)."""

    c_name = "octavo_decode_step"
    _fields_ = HEADER.fields(c_name)


class LayoutEntry(CStruct):
    """``octavo_layout_entry``: a row of the compiler's layout of the header's structs."""

    c_name = "octavo_layout_entry"
    _fields_ = HEADER.fields(c_name)


def compiled_layouts() -> dict[str, Layout]:
    """Every struct of the header as the compiler laid it out (``octavo_layout``)."""
    lib = library()
    assert lib is not None
    count = ctypes.c_int64()
    address = lib.octavo_layout(ctypes.byref(count))
    rows = (LayoutEntry * count.value).from_address(address)
    sizes = {row.struct_name.decode(): row.size for row in rows if row.field is None}
    fields: dict[str, list[tuple[str, int, int]]] = {name: [] for name in sizes}
    for row in rows:
        if row.field is not None:
            fields[row.struct_name.decode()].append((row.field.decode(), row.offset, row.size))
    return {name: Layout(size, tuple(fields[name])) for name, size in sizes.items()}


class LayerStack:
    """What ``octavo_decode_layers`` takes for a model's stack of layers, built once: the
    layers' ``octavo_layer`` structs in one array and their caches' addresses (each cache
    [2, num_slots, kv_heads * head_dim], all of one size)."""

    def __init__(self, layers: list[LayerWeights], caches: list[torch.Tensor]) -> None:
        assert len(layers) == len(caches) > 0
        assert all(c.is_contiguous() and c.shape == caches[0].shape for c in caches)
        self.layers = (LayerWeights * len(layers))(*layers)
        self.caches = (_ptr * len(caches))(*(c.data_ptr() for c in caches))
        self.num_slots = caches[0].shape[1]
        self.cache_ptrs = [c.data_ptr() for c in caches]  # which caches it was built for


def decode_layers(stack: LayerStack, step: DecodeStep, hidden: torch.Tensor,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer of ``stack`` over a step of decode rows, the first layer's input
    ``hidden`` [T, hidden] (contiguous, left as it is): the last layer's output and residual
    stream, as the layers called one by one return them."""
    assert hidden.is_contiguous()
    bufs = [torch.empty_like(hidden) for _ in range(4)]
    count = len(stack.layers)
    pointers = (_ptr * 5)(hidden.data_ptr(), *(b.data_ptr() for b in bufs))
    lib = library()
    assert lib is not None
    status = lib.octavo_decode_layers(stack.layers, count, ctypes.byref(step), pointers,
                                      stack.caches, stack.num_slots)
    if status:
        raise _failure("octavo_decode_layers", status)
    return (bufs[0], bufs[1]) if count % 2 else (bufs[2], bufs[3])


def decode_layer(layer: LayerWeights, step: DecodeStep, hidden: torch.Tensor,
                 residual: torch.Tensor | None, cache_rows: torch.Tensor,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer over a step of decode rows (``hidden`` [T, hidden], contiguous,
    overwritten with the residual stream when ``residual`` is given): the layer's output
    and the next residual stream, as the portable layer returns them."""
    assert hidden.is_contiguous() and cache_rows.is_contiguous()
    assert residual is None or residual.is_contiguous()
    out, residual_out = torch.empty_like(hidden), torch.empty_like(hidden)
    lib = library()
    assert lib is not None
    status = lib.octavo_decode_layer(ctypes.byref(layer), ctypes.byref(step), hidden.data_ptr(),
                                     None if residual is None else residual.data_ptr(),
                                     out.data_ptr(), residual_out.data_ptr(),
                                     cache_rows.data_ptr(), cache_rows.shape[1])
    if status:
        raise _failure("octavo_decode_layer", status)
    return out, residual_out


def ssm_decode(state: torch.Tensor, rows: torch.Tensor, offset: int, x: torch.Tensor,
               dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor, a: torch.Tensor,
               ) -> torch.Tensor:
    """One step of Mamba's selective scan for ``B`` requests (cpu_ssm.c): the scan states at
    ``offset`` of rows ``rows`` [B] int64 of ``state`` [slots, inner, width] (fp32,
    contiguous) updated in place; returns ``y`` [B, inner] (fp32) = the new states times
    ``c``. ``x``, ``dt`` [B, inner], ``b``, ``c`` [B, d_state], ``a`` [inner, d_state]."""
    batch, inner = x.shape
    d_state = a.shape[1]
    assert state.dtype == torch.float32 and state.is_contiguous() and rows.is_contiguous()
    x, dt, b, c, a = (t.float().contiguous() for t in (x, dt, b, c, a))
    y = torch.empty(batch, inner)
    lib = library()
    assert lib is not None, "ssm_decode without the CPU kernels (see usable)"
    lib.octavo_ssm_decode(y.data_ptr(), state.data_ptr(), rows.data_ptr(), batch, inner,
                          d_state, state.stride(0), state.stride(1), offset, x.data_ptr(),
                          dt.data_ptr(), b.data_ptr(), c.data_ptr(), a.data_ptr())
    return y

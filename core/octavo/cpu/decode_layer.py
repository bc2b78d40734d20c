"""The Llama-family decoder layer switched onto one fused call for decode steps.

A step whose tokens are all decode rows (one new token per request) runs each layer as one
call of ``octavo_decode_layer`` (cpu_layer.c): the norm, the q/k/v GEMM, RoPE, the KV write,
the attention (cascade attention over a shared prefix included), the output GEMM, the second
norm and the MLP, each the kernel the portable layers would call, in the same order. On
SmolLM2-135M that saves the ~2 ms a step spent in Python between those kernels (its 30
layers make ~300 calls), a sixth of a single-stream decode step.

Where every layer of the model takes it, ``CpuLlamaModel`` runs the whole stack in one call
(``octavo_decode_layers``), which saves the Python and ctypes around each layer's call too.

It applies where every part is the fused kernels' and nothing else happens in between: a
bf16 layer whose four projections the pair GEMM (AVX512-BF16) or the quantized decode
kernels (GGUF blocks kept by ``--quantization gguf``, ``octavo.cpu.quant``) serve alone, on
one tensor-parallel rank, plain RMSNorms, the CPU's rotary embedding, no per-head q/k norm, no
sliding window, a SiLU MLP. Any other layer or step (prefill chunks, speculative
verification, Qwen3's q/k norms, Gemma) takes the portable layer's path.

LoRA adapters (``--enable-lora``): a projection whose method is a LoRA wrapper with the CPU's
one-call delta over bf16 slots (``octavo.cpu.lora.LayerDelta``), around a base method that
adds nothing after its GEMM itself, hands the fused call its slots (``octavo_layer``'s
``*_lora``), and a step with adapters hands it the step's tokens grouped by slot (the
``TokenGroups`` the LoRA manager makes once per step): the call adds each projection's delta
after its GEMM with the same kernel the layer by layer path calls, so the same bits (the
gate/up projection then writes its product out and applies SiLU after the delta). A W1 decode
step on adapters thus stays one call for the 30 layers rather than ~120 projections and
deltas in Python. A step in which some other method adds to its GEMM's product
(``adds_after_gemm``: a wrapper the fused call does not know, or a LoRA wrapper it cannot
take: fp32 or strided slots, the pair kernels per slice) runs the layers one by one.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import cast

import torch

from octavo.attention.base import AttentionMetadata
from octavo.attention.step_plan import build_plan
from octavo.cpu import kernels
from octavo.cpu.attention import CpuAttentionImpl, decode_rows
from octavo.cpu.fp8_gemm import Fp8Gemm
from octavo.cpu.gemm import CpuGemm
from octavo.cpu.layers import CpuRMSNorm, CpuRotaryEmbedding, CpuSiluAndMul
from octavo.cpu.lora import LayerDelta
from octavo.cpu.quant import QuantGemm
from octavo.cpu.quant_gemm import DECODE_ROWS
from octavo.lora.layers import LoRABatch, LoRALinearMethod
from octavo.lora.ops import TokenGroups
from octavo.models.layers.linear import LinearBase
from octavo.models.layers.quantization import LinearMethodBase
from octavo.models.layers.rotary import RotaryEmbedding
from octavo.models.layers.sequence_parallel import sp_size
from octavo.models.layers.switch import switch_layers
from octavo.models.llama import LlamaDecoderLayer, LlamaMLP, LlamaModel


@dataclass(frozen=True)
class _Projection:
    """A projection as the fused call takes it (``octavo_layer``'s weight, its type and the
    fp32 bias), and the steps it serves there: those of fewer than ``rows`` rows."""

    weight: int
    type: int  # OCTAVO_WEIGHT_(FP8_)PAIRS: packed bf16 pairs (fp8 bytes); else a ggml type
    bias: int | None
    rows: int
    fuses_silu: bool  # as a gate/up projection, its product goes through SiLU in the call
    scale: int | None = None  # an fp8 weight's fp32 scales per output column


WEIGHT_PAIRS = kernels.HEADER.constants["OCTAVO_WEIGHT_PAIRS"]
WEIGHT_FP8_PAIRS = kernels.HEADER.constants["OCTAVO_WEIGHT_FP8_PAIRS"]


def _projection(linear: LinearBase) -> _Projection | None:
    """``linear`` as the fused call takes it, else None. Its GEMM must be the pair GEMM on
    a dense weight (with AMX only for steps of fewer than ``pair_rows`` rows: oneDNN takes
    the others), an :class:`Fp8Gemm` (every step), or a :class:`QuantGemm` whose kernel the
    call runs too (steps of up to ``DECODE_ROWS`` rows), on one tensor-parallel rank, the
    layer reading no weight itself."""
    gemm = linear.cpu_gemm
    if linear.reads_weight_with_cpu_gemm() or linear.tp_size != 1:
        return None
    if linear.quant_method.dense and isinstance(gemm, CpuGemm) and gemm.pairs is not None:
        return _Projection(gemm.pairs.data_ptr(), WEIGHT_PAIRS, _address(gemm.pair_bias),
                           gemm.pair_rows, gemm.fuses_silu)
    if isinstance(gemm, Fp8Gemm):
        return _Projection(gemm.packed.data_ptr(), WEIGHT_FP8_PAIRS, _address(gemm.bias32),
                           sys.maxsize, True, gemm.scale32.data_ptr())
    if isinstance(gemm, QuantGemm) and gemm.runs_in_fused_layers:
        return _Projection(gemm.weight.blocks.data_ptr(), gemm.weight.ggml_type,
                           _address(gemm.bias32), DECODE_ROWS + 1, True)
    return None


def _projections(layer: LlamaDecoderLayer, mlp: LlamaMLP) -> tuple[LinearBase, ...]:
    """``layer``'s qkv, o, gate/up and down projections, in the order the fused call takes
    them."""
    attn = layer.self_attn
    return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _fused_projections(layer: LlamaDecoderLayer, mlp: LlamaMLP) -> list[_Projection | None]:
    """``layer``'s projections as the fused call takes them (:func:`_projection` of each)."""
    return [_projection(linear) for linear in _projections(layer, mlp)]


def _may_add(method: LinearMethodBase) -> bool:
    """Whether ``method`` may add to its GEMM's product: one that keeps the base class's
    ``adds_after_gemm`` never does."""
    return type(method).adds_after_gemm is not LinearMethodBase.adds_after_gemm


def _fused_delta(method: LinearMethodBase) -> LayerDelta | None:
    """The LoRA delta the fused call adds for ``method`` itself (see the module's
    docstring), else None."""
    if (isinstance(method, LoRALinearMethod) and isinstance(method.delta, LayerDelta)
            and method.delta.dtype is torch.bfloat16 and not _may_add(method.base)):
        return method.delta
    return None


def _methods(layers: list[LlamaDecoderLayer]) -> list[LinearMethodBase]:
    """The linear methods of ``layers``' projections that may add to their GEMM's product
    where the fused call does not add for them, asked each step (:func:`_adds_after_gemm`).
    A method that never adds, or whose delta the fused call adds (:func:`_fused_delta`), is
    left out of the list: asking SmolLM2's 120 of them took ~9 us of Python calls a step."""
    return [linear.quant_method for layer in layers
            for linear in _projections(layer, cast(LlamaMLP, layer.mlp))
            if _may_add(linear.quant_method) and _fused_delta(linear.quant_method) is None]


def _lora_batch(layers: list[LlamaDecoderLayer]) -> LoRABatch | None:
    """The LoRA batch (the step's token -> slot map and grouping) of the deltas the fused
    call adds in ``layers``, None where it adds none. The LoRA manager wraps every layer
    over one batch."""
    batches = {id(method.batch): method.batch for layer in layers
               for linear in _projections(layer, cast(LlamaMLP, layer.mlp))
               if isinstance(method := linear.quant_method, LoRALinearMethod)
               and _fused_delta(method) is not None}
    assert len(batches) <= 1, "LoRA layers over several batches"
    return next(iter(batches.values()), None)


def _groups(batch: LoRABatch | None) -> TokenGroups | None:
    """The step's tokens grouped by adapter slot for the fused call's deltas (None: no
    adapter in the step, or no delta in the call)."""
    return None if batch is None else batch.groups


def _adds_after_gemm(methods: list[LinearMethodBase]) -> bool:
    """Whether some method adds to its GEMM's product this step (a LoRA adapter in the
    step): the fused calls compute the products alone, so the layers run one by one."""
    return any(method.adds_after_gemm() for method in methods)


def fused_rows(layer: LlamaDecoderLayer) -> int:
    """Steps of fewer rows than this run in the fused call: every projection of ``layer``
    (one :func:`layer_weights` accepts) serves them with the weights the call reads."""
    assert isinstance(layer.mlp, LlamaMLP)
    return min(p.rows if p is not None else 0 for p in _fused_projections(layer, layer.mlp))


def _address(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _lora_slots(linear: LinearBase) -> int | None:
    """The address of ``linear``'s LoRA slots as the fused call takes them (``octavo_lora``,
    kept alive by the layer's delta), None where the call adds no delta for it."""
    delta = _fused_delta(linear.quant_method)
    return None if delta is None else ctypes.addressof(delta.slots)


def layer_weights(layer: LlamaDecoderLayer) -> kernels.LayerWeights | None:
    """The fused call's view of ``layer``, or None where the layer is not one it runs."""
    attn, mlp = layer.self_attn, layer.mlp
    if not (isinstance(mlp, LlamaMLP) and type(mlp.act) is CpuSiluAndMul
            and type(layer.input_layernorm) is CpuRMSNorm
            and type(layer.post_attention_layernorm) is CpuRMSNorm
            and type(attn.rotary_emb) is CpuRotaryEmbedding and attn.q_norm is None
            and isinstance(attn.attn, CpuAttentionImpl) and attn.attn.sliding_window is None):
        return None
    qkv, o, gate_up, down = _fused_projections(layer, mlp)
    if qkv is None or o is None or gate_up is None or down is None or not gate_up.fuses_silu:
        return None
    return kernels.LayerWeights(
        input_norm=layer.input_layernorm.weight.data_ptr(),
        post_norm=layer.post_attention_layernorm.weight.data_ptr(),
        qkv=qkv.weight, o=o.weight, gate_up=gate_up.weight, down=down.weight,
        qkv_bias=qkv.bias, o_bias=o.bias, gate_up_bias=gate_up.bias, down_bias=down.bias,
        qkv_scale=qkv.scale, o_scale=o.scale, gate_up_scale=gate_up.scale,
        down_scale=down.scale,
        qkv_type=qkv.type, o_type=o.type, gate_up_type=gate_up.type, down_type=down.type,
        qkv_lora=_lora_slots(attn.qkv_proj), o_lora=_lora_slots(attn.o_proj),
        gate_up_lora=_lora_slots(mlp.gate_up_proj), down_lora=_lora_slots(mlp.down_proj),
        hidden=layer.input_layernorm.weight.numel(),
        num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
        intermediate=mlp.down_proj.in_features, eps=layer.input_layernorm.eps,
        scale=attn.attn.scale)


class CpuLlamaDecoderLayer(LlamaDecoderLayer):
    """Decode steps in one fused call (see the module's docstring); the rest as before."""

    _weights: kernels.LayerWeights | None | bool = False  # False: not looked at yet
    _fused_rows = 0  # steps of fewer rows run fused (set with _weights)
    _lora: LoRABatch | None = None  # the batch of the deltas the call adds (set with _weights)
    _methods: list[LinearMethodBase] = []  # its projections' that may add (set with _weights)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        weights = _layer_weights(self)
        step = (None if weights is None or hidden.shape[0] >= self._fused_rows
                or _adds_after_gemm(self._methods)
                or not kernels.usable(hidden, kv_cache) or not hidden.is_contiguous()
                else decode_step(positions, hidden.shape[0], kv_cache, attn_metadata,
                                 self.self_attn.rotary_emb, _groups(self._lora)))
        if step is None or weights is None:
            return super().forward(positions, hidden, residual, kv_cache, attn_metadata)
        cache_rows = kv_cache.view(2, -1, kv_cache.shape[-2] * kv_cache.shape[-1])
        return kernels.decode_layer(weights, step, hidden, residual, cache_rows)


class CpuLlamaModel(LlamaModel):
    """A decode step's whole stack of fused layers in one call (``octavo_decode_layers``):
    the Python and ctypes around each layer's call cost ~60 us, ~1.8 ms of a W1 decode step
    over SmolLM2-135M's 30 layers. Where a layer or the step is not one the fused call runs,
    or a stage starts from another's residual stream, or EAGLE-3 keeps layers' inputs, the
    layers run one by one as before."""

    _stack: kernels.LayerStack | None = None
    _fused_rows = 0  # steps of fewer rows run fused: the least of the layers' (_fused_stack)
    _methods: list[LinearMethodBase] = []  # the stack's projections' (set with _stack)
    _lora: LoRABatch | None = None  # the batch of the deltas the call adds (set with _stack)

    def run_layers(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stack = (None if residual is not None or self.aux_hidden_state_layers
                 or not hidden.is_contiguous() or not kernels.usable(hidden, kv_caches[0])
                 else self._fused_stack(kv_caches))
        if stack is not None and (hidden.shape[0] >= self._fused_rows
                                  or _adds_after_gemm(self._methods)):
            stack = None
        step = None if stack is None else decode_step(
            positions, hidden.shape[0], kv_caches[0], attn_metadata, self._rotary(),
            _groups(self._lora))
        if stack is None or step is None:
            return super().run_layers(positions, hidden, residual, kv_caches, attn_metadata)
        return kernels.decode_layers(stack, step, hidden)

    def _rotary(self) -> CpuRotaryEmbedding:
        """The rotary embedding of the layers (one for all; the first layer's)."""
        first = self.layers[self.layer_range.start]
        assert isinstance(first, CpuLlamaDecoderLayer)  # _fused_stack checked every layer
        rotary = first.self_attn.rotary_emb
        assert isinstance(rotary, CpuRotaryEmbedding)  # as layer_weights checked
        return rotary

    def _fused_stack(self, kv_caches: list[torch.Tensor]) -> kernels.LayerStack | None:
        """The stack's weights and caches for the fused call (built at the first call and
        again if the caches change), or None where some layer is not one it runs."""
        if self._stack is not None and self._stack.cache_ptrs == [c.data_ptr()
                                                                   for c in kv_caches]:
            return self._stack
        layers = self.layers[self.layer_range.start : self.layer_range.stop]
        weights = [w for w in map(_layer_weights, layers) if w is not None]
        if len(weights) < len(layers):
            return None
        self._fused_rows = min(layer._fused_rows for layer in layers
                               if isinstance(layer, CpuLlamaDecoderLayer))
        decoder_layers = [cast(LlamaDecoderLayer, layer) for layer in layers]
        self._methods = _methods(decoder_layers)
        self._lora = _lora_batch(decoder_layers)
        rows = [c.view(2, -1, c.shape[-2] * c.shape[-1]) for c in kv_caches]
        self._stack = kernels.LayerStack(weights, rows)
        return self._stack


def _layer_weights(layer: torch.nn.Module) -> kernels.LayerWeights | None:
    """A fused layer's weights for the fused call (looked up once per layer), else None."""
    if not isinstance(layer, CpuLlamaDecoderLayer):
        return None
    if layer._weights is False:
        layer._weights = layer_weights(layer)
        layer._fused_rows = 0 if layer._weights is None else fused_rows(layer)
        layer._lora = None if layer._weights is None else _lora_batch([layer])
        layer._methods = [] if layer._weights is None else _methods([layer])
    return layer._weights if isinstance(layer._weights, kernels.LayerWeights) else None


def decode_step(positions: torch.Tensor, tokens: int, kv_cache: torch.Tensor,
                metadata: AttentionMetadata, rotary: RotaryEmbedding,
                groups: TokenGroups | None) -> kernels.DecodeStep | None:
    """The step as the fused call takes it, worked out once per step (in the first layer)
    and kept in the metadata; None when the step is not decode rows only. ``groups``: the
    step's tokens grouped by LoRA adapter slot, for the deltas the call adds (None: none)."""
    state = metadata.backend_state
    if "cpu_decode_step" in state:
        return state["cpu_decode_step"]
    plan = state.get("torch")
    if plan is None:
        plan = state["torch"] = build_plan(metadata, kv_cache.shape[2])
    decode = plan.decode
    step = None
    if (decode is not None and not plan.prefills and decode.tokens is None
            and len(decode.seq_lens) == tokens == metadata.num_actual_tokens):
        cache_rows = kv_cache.view(2, -1, kv_cache.shape[-2] * kv_cache.shape[-1])
        rows, prefix = decode_rows(decode, plan, kv_cache.shape[-1], cache_rows)
        cos, sin = rotary.cos_sin(positions, kv_cache.dtype)
        slot_mapping = metadata.slot_mapping[:tokens].contiguous()
        seq_lens = rows.seq_lens.view(-1).contiguous()
        step = kernels.DecodeStep(
            tokens=tokens, cos=cos.data_ptr(), sin=sin.data_ptr(),
            slot_mapping=slot_mapping.data_ptr(), slots=rows.slots.data_ptr(),
            seq_lens=seq_lens.data_ptr(), max_len=rows.max_len,
            prefix_slots=None if prefix is None else prefix.slots.data_ptr(),
            prefix_len=0 if prefix is None else len(prefix.slots),
            lora_sorted_tokens=None if groups is None else groups.sorted_tokens.data_ptr(),
            lora_starts=None if groups is None else groups.starts.data_ptr(),
            lora_counts=None if groups is None else groups.counts.data_ptr())
        # alive while used
        step.keep = (cos, sin, slot_mapping, seq_lens, rows, prefix, groups)
    state["cpu_decode_step"] = step
    return step


def use_fused_decode_layers(model: torch.nn.Module) -> int:
    """Switch ``model``'s Llama-family decoder layers onto :class:`CpuLlamaDecoderLayer`
    (call it after the GEMMs and layers are switched); returns how many. Each one checks at
    its first call whether the fused call can run it, and otherwise stays portable."""
    if kernels.library() is None or sp_size() > 1:
        return 0  # the fused call attends with every head of the rank's own tokens
    switch_layers(model, {LlamaModel: CpuLlamaModel})
    return switch_layers(model, {LlamaDecoderLayer: CpuLlamaDecoderLayer})

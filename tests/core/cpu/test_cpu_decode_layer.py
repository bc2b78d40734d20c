"""Decode steps a layer per call, or the whole stack in one (``octavo.cpu.decode_layer``):
the same kernels in the same order as the portable layers, so an engine with them and one
without give the same tokens and the same logprobs, on plain decode steps and on steps where
many requests share a prefix (cascade attention inside the fused call)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.cpu import decode_layer, kernels
from octavo.cpu.attention import CASCADE_MIN_ROWS
from octavo.cpu.gemm import AMX_ONEDNN_ROWS
from octavo.cpu.platform import CpuPlatform
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.skipif(not kernels.pair_gemm_available(),
                                 reason="the fused call needs the pair GEMM (AVX512-BF16)")]
# With AMX, oneDNN takes steps of AMX_ONEDNN_ROWS rows or more, so they run layer by layer
# and a fused call never has the rows cascade attention needs (it runs outside it).
FUSED_CASCADE = not CpuPlatform.has_amx() or AMX_ONEDNN_ROWS > CASCADE_MIN_ROWS


def generate(folder: Path, shared: list[int], batches: list[list[list[int]]],
             ) -> list[tuple[list[int], list]]:
    """The outputs of each batch of prompts in turn, once ``shared`` is in the prefix cache
    (so that requests starting with it share its blocks)."""
    llm = LLM(model=str(folder), dtype="bfloat16", kv_cache_memory=16 * 2**20,
              max_num_batched_tokens=4096)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    llm.generate([{"prompt_token_ids": shared}], SamplingParams(max_tokens=1), use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for prompts in batches
            for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                  use_tqdm=False)]


def test_fused_decode_steps_match_the_layers(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    seed = draw_seed()
    print(f"this CPU {'has' if CpuPlatform.has_amx() else 'lacks'} AMX: cascade attention "
          f"{'inside' if FUSED_CASCADE else 'outside'} the fused calls")
    save_tiny_model("llama", tmp_path, seed=seed % 1000)
    rng = random.Random(seed)
    shared = [rng.randrange(256) for _ in range(300)]  # 10 requests after one long prompt
    after_shared = [shared + [rng.randrange(256) for _ in range(n)] for n in range(1, 11)]
    unrelated = [[rng.randrange(256) for _ in range(n)] for n in (5, 40, 300)]
    batches = [after_shared, unrelated]
    calls = {"layer": 0, "stack": 0, "cascade": 0}  # fused calls, steps with a shared prefix
    decode, stack, prefix = kernels.decode_layer, kernels.decode_layers, decode_layer.decode_step

    def counted_layer(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["layer"] += 1
        return decode(*args, **kwargs)

    def counted_stack(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["stack"] += 1
        return stack(*args, **kwargs)

    def counted_step(*args, **kwargs):  # type: ignore[no-untyped-def]
        step = prefix(*args, **kwargs)
        calls["cascade"] += bool(step is not None and step.prefix_len)
        return step

    monkeypatch.setattr(kernels, "decode_layer", counted_layer)
    monkeypatch.setattr(kernels, "decode_layers", counted_stack)
    monkeypatch.setattr(decode_layer, "decode_step", counted_step)
    stacked = generate(tmp_path, shared, batches)  # the whole stack in one call
    assert calls["stack"] > 0 and calls["layer"] == 0, calls
    assert calls["cascade"] > 0 or not FUSED_CASCADE, calls
    monkeypatch.setattr(decode_layer.CpuLlamaModel, "_fused_stack", lambda self, caches: None)
    calls.update(stack=0, cascade=0)
    fused = generate(tmp_path, shared, batches)  # one call per layer
    assert calls["layer"] > 0 and calls["stack"] == 0, calls
    assert calls["cascade"] > 0 or not FUSED_CASCADE, calls
    monkeypatch.setattr(decode_layer, "use_fused_decode_layers", lambda model: 0)
    calls.update(layer=0, stack=0)
    portable = generate(tmp_path, shared, batches)
    assert calls["layer"] == calls["stack"] == 0
    for i, want in enumerate(portable):
        assert stacked[i][0] == fused[i][0] == want[0], f"seed={seed} request {i}"
        assert stacked[i][1] == fused[i][1] == want[1], (
            f"seed={seed} request {i}: same kernels, same bits")


def test_layers_it_cannot_run_stay_portable(tmp_path: Path) -> None:
    """Qwen3's per-head q/k norms are not in the fused call: its layers keep their path."""
    save_tiny_model("qwen3", tmp_path, seed=0)
    llm = LLM(model=str(tmp_path), dtype="bfloat16", kv_cache_memory=16 * 2**20)
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}],
                       SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    model = llm.llm_engine.core.executor.worker.runner.model
    layers = [m for m in model.modules() if isinstance(m, decode_layer.CpuLlamaDecoderLayer)]
    assert layers and all(layer._weights is None for layer in layers)


@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_the_stack_call_passes_each_layer_what_the_loop_does(num_layers: int) -> None:
    """``decode_layers`` over 1-3 random layers gives the bits of ``decode_layer`` called
    in a loop (each layer's output and residual stream the next one's input), and leaves
    the first input as it was; whichever of its buffers hold the end, odd or even."""
    seed = draw_seed()
    g = torch.Generator().manual_seed(seed)
    rows, hidden, heads, kv_heads, head_dim, inter, blocks = 5, 64, 4, 2, 32, 96, 16

    def packed(out: int, inp: int) -> torch.Tensor:
        return kernels.pack_pair_weight((torch.randn(out, inp, generator=g) * 0.1).bfloat16())

    keep: list[torch.Tensor] = []
    layers = []
    for _ in range(num_layers):
        ws = [packed((heads + 2 * kv_heads) * head_dim, hidden),
              packed(hidden, heads * head_dim), packed(2 * inter, hidden), packed(hidden, inter)]
        norms = [(1 + 0.1 * torch.randn(hidden, generator=g)).bfloat16() for _ in range(2)]
        keep += ws + norms
        qkv, o, gate_up, down = (w.data_ptr() for w in ws)
        layers.append(kernels.LayerWeights(
            input_norm=norms[0].data_ptr(), post_norm=norms[1].data_ptr(), qkv=qkv, o=o,
            gate_up=gate_up, down=down, qkv_bias=None, o_bias=None, gate_up_bias=None,
            down_bias=None, qkv_scale=None, o_scale=None, gate_up_scale=None,
            down_scale=None, qkv_type=0, o_type=0, gate_up_type=0, down_type=0, hidden=hidden,
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, intermediate=inter,
            qkv_lora=None, o_lora=None, gate_up_lora=None, down_lora=None,
            eps=1e-5, scale=head_dim**-0.5))
    width = kv_heads * head_dim
    caches = [torch.randn(2, blocks * 16, width, generator=g).bfloat16()
              for _ in range(num_layers)]
    seq_lens = torch.tensor([9, 17, 1, 30, 12])
    slots = torch.randperm(blocks * 16, generator=g)[: rows * 30].view(rows, 30).contiguous()
    slot_mapping = slots[torch.arange(rows), seq_lens - 1].contiguous()
    cos, sin = (torch.randn(rows, head_dim, generator=g).bfloat16() for _ in range(2))
    step = kernels.DecodeStep(tokens=rows, cos=cos.data_ptr(), sin=sin.data_ptr(),
                              slot_mapping=slot_mapping.data_ptr(), slots=slots.data_ptr(),
                              seq_lens=seq_lens.data_ptr(), max_len=30, prefix_slots=None,
                              prefix_len=0, lora_sorted_tokens=None, lora_starts=None,
                              lora_counts=None)
    x = torch.randn(rows, hidden, generator=g).bfloat16()

    looped = [c.clone() for c in caches]
    h, residual = x.clone(), None
    for layer, cache in zip(layers, looped):
        h, residual = kernels.decode_layer(layer, step, h, residual, cache)
    stacked = [c.clone() for c in caches]
    given = x.clone()
    out, stream = kernels.decode_layers(kernels.LayerStack(layers, stacked), step, given)
    assert torch.equal(given, x), f"seed={seed}"
    assert torch.equal(out, h) and torch.equal(stream, residual), f"seed={seed}"
    assert all(torch.equal(a, b) for a, b in zip(stacked, looped)), f"seed={seed}"

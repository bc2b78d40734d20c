"""LoRA keeps the CPU's fast paths (issue 50): a wrapped bf16 layer multiplies its base weight
with the platform's prepacked GEMM and adds the delta after it, and decode steps, with
adapters in them or not, run the fused decode stack (``octavo.cpu.decode_layer``), which adds
the deltas inside its call. The delta's arithmetic against HF + PEFT is
test_lora_parity's (fp32, where no prepacked GEMM serves)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from octavo import LLM, LoRARequest, SamplingParams
from octavo.cpu import decode_layer, kernels
from octavo.cpu.gemm import CpuGemm
from octavo.lora.layers import LoRALinearMethod
from octavo.models.layers.linear import LinearBase
from octavo.testing.seeds import draw_seed
from tests.core.lora.peft_adapters import SPECS, make_adapter
from tests.core.tiny_models import save_tiny_model

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.skipif(not kernels.pair_gemm_available(),
                                 reason="the fused stack needs the pair GEMM (AVX512-BF16)")]

MAX_TOKENS = 8


def wrapped_layers(llm: LLM) -> list[LinearBase]:
    model = llm.llm_engine.core.executor.worker.runner.model
    return [m for m in model.modules()
            if isinstance(m, LinearBase) and isinstance(m.quant_method, LoRALinearMethod)]


def check_delta_after_gemm(layer: LinearBase, seed: int) -> None:
    """``layer`` (adapter in slot 0) on three rows, the middle one without the adapter: the
    prepacked GEMM's product, plus ``(x A^T) B^T`` on the adapter's rows."""
    method = layer.quant_method
    assert isinstance(method, LoRALinearMethod) and isinstance(layer.cpu_gemm, CpuGemm)
    assert method.delta is not None, "the CPU's one-call delta (octavo_lora_delta) not bound"
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(seed))
    x = x.to(torch.bfloat16)
    method.batch.set_map(torch.tensor([0, -1, 0], dtype=torch.int32))
    try:
        got = layer(x).float()
    finally:
        method.batch.set_map(None)
    base = layer(x).float()  # no adapter in the step: the GEMM alone
    delta = torch.cat([x.float() @ method.a[i, 0].float().T @ method.b[0, s.offset:s.offset
                                                                         + s.size].float().T
                       for i, s in enumerate(method.slices)], dim=1)
    assert torch.equal(got[1], base[1]), f"seed {seed}: a row without adapter changed"
    # The delta is added to the bf16 product: one bf16 rounding of the sum apart.
    bound = (base[::2].abs() + delta[::2].abs()).max().item() * 2**-7
    assert delta[::2].abs().max().item() > 10 * bound, f"seed {seed}: a delta too small to see"
    error = (got[::2] - base[::2] - delta[::2]).abs().max().item()
    assert error <= bound, f"seed {seed}: delta off by {error:.3g} (bound {bound:.3g})"


def test_decode_steps_with_adapters_take_the_fused_stack(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode steps run in the fused stack with and without adapters; a batch mixing two
    adapters (one on q/v/down only) and the base model gives the tokens and logprobs of the
    fused call per layer and of the layers one by one, bit for bit (the same kernels in the
    same order: the delta added to the GEMM's bf16 product, then SiLU)."""
    seed = draw_seed()
    base = save_tiny_model("llama", tmp_path / "base", seed % 1000)
    loras = []
    for i, spec in enumerate((SPECS[1], SPECS[2])):
        make_adapter(base, spec, tmp_path / f"lora{i}", seed + i)
        loras.append(LoRARequest(f"lora{i}", i + 1, str(tmp_path / f"lora{i}")))
    llm = LLM(model=str(tmp_path / "base"), dtype="bfloat16", enable_lora=True, max_loras=2,
              max_lora_rank=16, kv_cache_memory=16 * 2**20)
    layers = wrapped_layers(llm)
    assert layers and all(isinstance(m.cpu_gemm, CpuGemm) for m in layers), (
        "a LoRA-wrapped bf16 layer lost its prepacked GEMM")
    calls = {"layer": 0, "stack": 0}
    layer_call, stack_call = kernels.decode_layer, kernels.decode_layers

    def counted_layer(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["layer"] += 1
        return layer_call(*args, **kwargs)

    def counted_stack(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["stack"] += 1
        return stack_call(*args, **kwargs)

    monkeypatch.setattr(kernels, "decode_layer", counted_layer)
    monkeypatch.setattr(kernels, "decode_layers", counted_stack)
    rng = random.Random(seed)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (7, 12, 5)]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                            logprobs=3)

    def generate(requests: list[LoRARequest | None]) -> list[tuple[list[int], object]]:
        calls.update(layer=0, stack=0)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                               lora_request=requests, use_tqdm=False)
        return [(list(o.outputs[0].token_ids), o.outputs[0].logprobs) for o in outputs]

    base_only = generate([None, None, None])
    assert calls["stack"] >= MAX_TOKENS - 1, f"seed {seed}: fused stack ran {calls}"
    mixed_requests = [loras[0], None, loras[1]]
    mixed = generate(mixed_requests)
    assert calls["stack"] >= MAX_TOKENS - 1 and calls["layer"] == 0, f"seed {seed}: {calls}"
    monkeypatch.setattr(decode_layer.CpuLlamaModel, "_fused_stack", lambda self, caches: None)
    per_layer = generate(mixed_requests)
    decoder_layers = len(layers) // 4  # four wrapped projections each
    assert calls["layer"] >= decoder_layers * (MAX_TOKENS - 1) and calls["stack"] == 0, calls
    monkeypatch.setattr(decode_layer, "_layer_weights", lambda layer: None)
    one_by_one = generate(mixed_requests)
    assert calls["layer"] == calls["stack"] == 0, calls
    print(f"\nseed {seed}: base-only {[t for t, _ in base_only]}, mixed {[t for t, _ in mixed]}")
    for i, want in enumerate(one_by_one):
        assert mixed[i] == per_layer[i] == want, f"seed {seed} request {i}: same kernels, bits"
    assert mixed[1][0] == base_only[1][0], f"seed {seed}: the base request's tokens moved"
    assert mixed[0][0] != base_only[0][0], f"seed {seed}: adapter 0 changed no token"
    assert mixed[2][0] != base_only[2][0], f"seed {seed}: adapter 1 changed no token"
    for layer in layers[:4]:  # one decoder layer's qkv, o, gate/up and down projections
        check_delta_after_gemm(layer, seed)

"""DeepSeek-V2 (multi-head latent attention, YaRN with DeepSeek's mscales, routed and shared
experts) against HF transformers on tiny random models (``arch_parity``'s checks), in V2-Lite's
form (``q_proj``, greedy top-k, a dense first layer) and V2's (low-rank queries through
``q_a_proj``/``q_b_proj``, group-limited top-k); the latent KV cache's size; the absorbed
decode against the expanded one; the CPU's decode kernel on the latent cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DeepseekV2Config

from octavo import LLM
from octavo.attention.step_plan import DecodeBatch, StepPlan
from octavo.attention.torch_mla import TorchMLAImpl
from octavo.cpu import kernels
from octavo.cpu.attention import CpuAttentionBackend, CpuMLAImpl
from octavo.kv.cache_spec import MLASpec
from octavo.models.build import build_model
from octavo.models.deepseek_v2 import DeepseekV2Attention
from octavo.models.loader import load_model_files
from octavo.worker.worker import Worker
from tests.core import arch_parity
from tests.core.arch_parity import COMMON, Tiny
from tests.core.models.test_models_parity import PagedDriver

pytestmark = pytest.mark.usefixtures("single_thread")

LENGTHS = [5, 77, 700]
MAX_MODEL_LEN = 736
KV_BLOCKS = 52  # of 16 tokens: the 700-token request needs 46, all three 56
MLA = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)
MOE = dict(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=24,
           first_k_dense_replace=1, routed_scaling_factor=1.5)
# YaRN past an original context of 256 (to 1024), with DeepSeek's unequal mscales: cos/sin scaled by
# mscale(4, 1) / mscale(4, 0.5) and the softmax by mscale(4, 0.5) squared.
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.5}
MODELS = {
    "deepseek_v2_lite": DeepseekV2Config(
        **{**COMMON, "num_hidden_layers": 3, "num_key_value_heads": 4,
           "max_position_embeddings": 1024}, **MLA, **MOE, q_lora_rank=None,
        topk_method="greedy", rope_scaling=YARN),
    "deepseek_v2": DeepseekV2Config(
        **{**COMMON, "num_hidden_layers": 3, "num_key_value_heads": 4,
           "max_position_embeddings": 1024}, **MLA, **MOE, q_lora_rank=24,
        topk_method="group_limited_greedy", n_group=4, topk_group=2, rope_scaling=YARN),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory) -> Tiny:  # type: ignore[no-untyped-def]
    name = request.param
    return Tiny(name, MODELS[name], tmp_path_factory.mktemp(name), LENGTHS)


def test_every_position_matches_hf(model: Tiny) -> None:
    arch_parity.check_every_position(model.ours, model.prompts, model.references, 64,
                                     model.seed, model.label)


def test_engine_with_chunks_prefix_hits_and_preemption_matches_hf(model: Tiny) -> None:
    """The engine, its prompts twice: the second copies hit the first ones' cached blocks."""
    llm = arch_parity.check_engine(model, kv_blocks=KV_BLOCKS, max_model_len=MAX_MODEL_LEN,
                                   prompts=model.prompts + [model.prompts[1]],
                                   references=model.references + [model.references[1]])
    stats = llm.llm_engine.core.scheduler.kv_manager.prefix_stats
    assert stats.hits >= 64, stats


def test_tensor_by_pipeline_parallel_matches_hf(model: Tiny) -> None:
    """TP=2 x PP=2: the heads split, the latent whole on each rank, the layers in stages."""
    if model.name != "deepseek_v2":
        pytest.skip("one parallel run covers the heads' split (V2's low-rank queries)")
    arch_parity.check_tensor_parallel(model, MAX_MODEL_LEN, pipeline_parallel_size=2)


def test_kv_blocks_per_gib_are_what_the_latent_predicts(model: Tiny) -> None:
    """A budget holds budget / (block * layers * (kv_lora_rank + qk_rope_head_dim) * 4
    bytes) blocks, (heads * (qk_head_dim + v_head_dim)) / latent times as many as the same
    heads' keys and values would fill (3.6x here; DeepSeek-V2-Lite's 16 heads: 8.9x)."""
    if model.name != "deepseek_v2_lite":
        pytest.skip("the latent's size is the same in both models")
    budget, block, layers = 2**26, 16, MODELS[model.name].num_hidden_layers
    latent = MLA["kv_lora_rank"] + MLA["qk_rope_head_dim"]
    predicted = budget // (block * layers * latent * 4)
    llm = LLM(model=str(model.folder), dtype="float32", max_model_len=MAX_MODEL_LEN,
              kv_cache_memory=budget)
    worker: Worker = llm.llm_engine.core.executor.worker
    try:
        assert llm.llm_engine.core.num_blocks == predicted
        assert worker.runner.model.mla_spec == MLASpec(MLA["kv_lora_rank"],
                                                       MLA["qk_rope_head_dim"])
        assert worker.runner.kv_caches[0].shape == (predicted, block, latent)
    finally:
        llm.shutdown()
    heads = COMMON["num_attention_heads"]
    per_token = heads * (MLA["qk_nope_head_dim"] + MLA["qk_rope_head_dim"] + MLA["v_head_dim"])
    per_gib = 2**30 // budget
    print(f"\n{model.label}: {predicted * per_gib} latent blocks per GiB, "
          f"{budget // (block * layers * per_token * 4) * per_gib} with keys and values "
          "per head")


def decode_steps(ours, prompts: list[list[int]], seed: int) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """Logits of 8 greedy decode steps after each prompt, all decoding together."""
    driver = PagedDriver(ours, seed)
    first = driver.step(dict(enumerate(prompts)))
    tokens = {i: int(logits[-1].argmax()) for i, logits in first.items()}
    steps = []
    for _ in range(8):
        out = driver.step({i: [t] for i, t in tokens.items()})
        steps.append(torch.stack([out[i][-1] for i in range(len(prompts))]))
        tokens = {i: int(logits[-1].argmax()) for i, logits in out.items()}
    return steps


def impls(model: torch.nn.Module) -> list[TorchMLAImpl]:
    return [m.attn for m in model.modules() if isinstance(m, DeepseekV2Attention)]


def test_absorbed_decode_equals_expanded(model: Tiny, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Decode rows through the absorbed projections give the expanded form's logits."""
    prompts = arch_parity.random_prompts(COMMON["vocab_size"], [3, 20, 41], model.seed)
    absorbed = decode_steps(model.ours, prompts, model.seed)
    for impl in impls(model.ours):
        monkeypatch.setattr(impl, "absorbed_decode", False)
    expanded = decode_steps(model.ours, prompts, model.seed)
    diff = max((a - b).abs().max().item() for a, b in zip(absorbed, expanded))
    assert diff < 1e-5, f"{model.label}: absorbed vs expanded decode: {diff:.2e}"


@pytest.mark.skipif(kernels.library() is None,
                    reason="the CPU's fused kernels are not built here")
def test_cpu_decode_kernel_on_the_latent_cache(model: Tiny) -> None:
    """bf16 decode rows on the fused kernel, the latent rows as keys and values: within
    bf16 rounding of the same impl on SDPA."""
    ours = build_model(load_model_files(model.folder), torch.bfloat16, CpuAttentionBackend)
    assert all(isinstance(impl, CpuMLAImpl) for impl in impls(ours))
    dims = impls(ours)[0].dims
    rng = np.random.default_rng(model.seed)
    rows = torch.from_numpy(rng.standard_normal((64, dims.latent_dim))).to(torch.bfloat16)
    queries = torch.from_numpy(rng.standard_normal((3, dims.num_heads, dims.latent_dim)))
    queries = queries.to(torch.bfloat16)
    lens = torch.tensor([[5], [17], [30]])
    slots = torch.from_numpy(rng.integers(0, 64, 3 * 30))  # [B * max_len]
    decode = DecodeBatch(None, slots, lens, 30, False)
    plan = StepPlan(decode, [], 16)
    fused = impls(ours)[0]._latent_decode(queries, rows, decode, plan)
    portable = TorchMLAImpl._latent_decode(impls(ours)[0], queries, rows, decode, plan)
    diff = (fused.float() - portable.float()).abs().max().item()
    assert diff < 0.05, diff


def test_backend_without_latent_attention_is_refused(model: Tiny) -> None:
    arch_parity.check_backend_refuses(model.folder, {"mla_impl_cls": None},
                                      "has no multi-head latent attention")

"""Qwen2-MoE (shared expert with its sigmoid gate, top-k weights as routed) and Qwen3-MoE
(q/k norms, top-k weights renormalised) against HF transformers on tiny random models
(``arch_parity``'s checks): dense and sparse layers mixed by ``decoder_sparse_step`` and
``mlp_only_layers``, 8 experts of which each token takes 2; TP=2 with the experts' features
sliced (Qwen2-MoE) and with expert parallelism, whole experts per rank (Qwen3-MoE)."""

from __future__ import annotations

import pytest
from transformers import Qwen2MoeConfig, Qwen3MoeConfig

from octavo.models.llama import LlamaMLP
from octavo.models.moe_block import SparseMoeBlock
from tests.core import arch_parity
from tests.core.arch_parity import COMMON, Tiny

pytestmark = pytest.mark.usefixtures("single_thread")

LENGTHS = [5, 77, 700]
MAX_MODEL_LEN = 736
# Blocks of 16 tokens: the 700-token request needs 46, all three 56, so one is preempted.
KV_BLOCKS = 52
MOE = dict(num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
           max_position_embeddings=1024)
MODELS = {
    # Layers 1 and 3 sparse (every second), 0 and 2 dense.
    "qwen2_moe": (Qwen2MoeConfig(**{**COMMON, **MOE}, decoder_sparse_step=2, mlp_only_layers=[],
                                 shared_expert_intermediate_size=48, norm_topk_prob=False),
                  ["dense", "moe", "dense", "moe"], {}),
    # Every layer sparse but layer 2.
    "qwen3_moe": (Qwen3MoeConfig(**{**COMMON, **MOE}, decoder_sparse_step=1, mlp_only_layers=[2],
                                 norm_topk_prob=True, head_dim=32),
                  ["moe", "moe", "dense", "moe"], {"enable_expert_parallel": True}),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory) -> tuple[Tiny, list[str], dict]:  # type: ignore[no-untyped-def]
    """(the tiny model, its layers' MLP kinds, its TP=2 engine options)."""
    config, kinds, tp_options = MODELS[request.param]
    tiny = Tiny(request.param, config, tmp_path_factory.mktemp(request.param), LENGTHS)
    return tiny, kinds, tp_options


def test_every_position_matches_hf(model) -> None:  # type: ignore[no-untyped-def]
    tiny, kinds, _ = model
    assert [("moe" if isinstance(layer.mlp, SparseMoeBlock) else
             "dense" if isinstance(layer.mlp, LlamaMLP) else "?")
            for layer in tiny.ours.model.layers] == kinds
    arch_parity.check_every_position(tiny.ours, tiny.prompts, tiny.references, 64, tiny.seed,
                                     tiny.label)


def test_engine_with_chunks_and_preemption_matches_hf(model) -> None:  # type: ignore[no-untyped-def]
    tiny, _, _ = model
    arch_parity.check_engine(tiny, kv_blocks=KV_BLOCKS, max_model_len=MAX_MODEL_LEN)


def test_tensor_parallel_matches_hf(model) -> None:  # type: ignore[no-untyped-def]
    tiny, _, tp_options = model
    arch_parity.check_tensor_parallel(tiny, MAX_MODEL_LEN, **tp_options)

"""Phi-3 (fused projections, longrope on a partial rotation) and Gemma 2 (soft-capped
attention and logits, alternating local and global layers), and the RoPE scalings dynamic
and yarn on the Llama family, against HF transformers on tiny random models
(``arch_parity``'s checks).

Lengths are chosen so every path runs: Phi-3's prompts reach past its original context of
256 (long factors), one of them only while decoding; Gemma 2's past its window of 8; the
dynamic model's past its max_position_embeddings of 128, one only while decoding.
"""

from __future__ import annotations

import pytest
from transformers import Gemma2Config, LlamaConfig, Phi3Config, Qwen2Config

from octavo.models.layers.rotary import ScaledRotaryEmbedding
from tests.core.arch_parity import (
    COMMON,
    Tiny,
    check_backend_refuses,
    check_engine,
    check_every_position,
    check_tensor_parallel,
)

pytestmark = pytest.mark.usefixtures("single_thread")

PHI3_ORIGINAL_CONTEXT = 256
PHI3_WINDOW = 300
# Phi-4-mini's partial rotation: 12 of each 16-dim head rotated, so 6 longrope factors.
PHI3_PARTIAL_ROTARY = 0.75
ROTATED_PAIRS = 6


def phi3_config() -> Phi3Config:
    return Phi3Config(
        **{**COMMON, "max_position_embeddings": 1024}, sliding_window=PHI3_WINDOW,
        original_max_position_embeddings=PHI3_ORIGINAL_CONTEXT,
        partial_rotary_factor=PHI3_PARTIAL_ROTARY,
        rope_scaling={"type": "longrope",
                      "short_factor": [1.0 + 0.1 * i for i in range(ROTATED_PAIRS)],
                      "long_factor": [1.5 + 0.5 * i for i in range(ROTATED_PAIRS)]})


def gemma2_config() -> Gemma2Config:
    # Caps small enough to bite on random weights (the released ones: 50 and 30).
    return Gemma2Config(**{**COMMON, "num_hidden_layers": 3, "tie_word_embeddings": True},
                        head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
                        attn_logit_softcapping=2.0, final_logit_softcapping=3.0)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory) -> Tiny:  # type: ignore[no-untyped-def]
    return Tiny("phi3", phi3_config(), tmp_path_factory.mktemp("phi3"),
                [5, 77, PHI3_ORIGINAL_CONTEXT - 10, 700])


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory) -> Tiny:  # type: ignore[no-untyped-def]
    return Tiny("gemma2", gemma2_config(), tmp_path_factory.mktemp("gemma2"), [5, 77, 700])


def reset_dynamic_rope(hf) -> None:  # type: ignore[no-untyped-def]
    """HF's dynamic RoPE keeps the frequencies of the longest sequence it has seen until a
    shorter-than-original one resets them; each reference prompt starts afresh."""
    rotary = hf.model.rotary_emb
    rotary.inv_freq = rotary.original_inv_freq.clone()
    rotary.max_seq_len_cached = rotary.original_max_seq_len


@pytest.fixture(scope="module")
def llama_dynamic(tmp_path_factory) -> Tiny:  # type: ignore[no-untyped-def]
    config = LlamaConfig(**{**COMMON, "max_position_embeddings": 128},
                         rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    return Tiny("llama_dynamic", config, tmp_path_factory.mktemp("llama_dynamic"),
                [5, 110, 400], before=reset_dynamic_rope)


# -- Phi-3 --------------------------------------------------------------------------------


def test_phi3_every_position_matches_hf(phi3: Tiny) -> None:
    assert isinstance(phi3.ours.rotary_emb, ScaledRotaryEmbedding)
    assert phi3.ours.rotary_emb.dim == 12
    diff = check_every_position(phi3.ours, phi3.prompts, phi3.references, 64, phi3.seed,
                                phi3.label)
    print(f"\n{phi3.label}: every position within {diff:.2e}")


def test_phi3_engine_with_chunks_and_preemption_matches_hf(phi3: Tiny) -> None:
    max_model_len = 736
    # A request holds at most its window and a chunk, 24 blocks; all four need 48.
    blocks = 35
    check_engine(phi3, kv_blocks=blocks, max_model_len=max_model_len)


def test_phi3_tensor_parallel_matches_hf(phi3: Tiny) -> None:
    check_tensor_parallel(phi3, 736, num_prompts=3)  # the third crosses 256 while decoding


# -- Gemma 2 ------------------------------------------------------------------------------


def test_gemma2_every_position_matches_hf(gemma2: Tiny) -> None:
    diff = check_every_position(gemma2.ours, gemma2.prompts, gemma2.references, 64,
                                gemma2.seed, gemma2.label)
    print(f"\n{gemma2.label}: every position within {diff:.2e}")


def test_gemma2_tensor_parallel_matches_hf(gemma2: Tiny) -> None:
    check_tensor_parallel(gemma2, 736)


def test_gemma2_engine_with_chunks_and_preemption_matches_hf(gemma2: Tiny) -> None:
    max_model_len = 736
    check_engine(gemma2, kv_blocks=60, max_model_len=max_model_len)


def test_soft_cap_is_refused_by_a_backend_without_it(gemma2: Tiny) -> None:
    check_backend_refuses(gemma2.folder, {"supports_logits_soft_cap": False},
                          "does not soft-cap")


# -- RoPE scalings on the Llama family ----------------------------------------------------


def test_dynamic_rope_engine_matches_hf(llama_dynamic: Tiny) -> None:
    tiny = llama_dynamic
    check_every_position(tiny.ours, tiny.prompts, tiny.references, 48, tiny.seed, tiny.label)
    check_engine(tiny, kv_blocks=30, max_model_len=448)


def test_yarn_rope_every_position_matches_hf(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    config = Qwen2Config(**{**COMMON, "max_position_embeddings": 512},
                         rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 128})
    tiny = Tiny("qwen2_yarn", config, tmp_path_factory.mktemp("qwen2_yarn"), [5, 300])
    check_every_position(tiny.ours, tiny.prompts, tiny.references, 100, tiny.seed, tiny.label)

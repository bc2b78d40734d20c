"""Jamba (Mamba layers between attention layers, a mixture of experts every second layer)
against HF transformers on a tiny random model (``arch_parity``'s checks: 2 Mamba and 2
attention layers, 4 experts), and the per-request SSM state the engine keeps for it: a pool
of ``max_num_seqs`` slots that 64 concurrent requests fill and give back, preemption
mid-decode, prefix caching off, what it refuses."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from transformers import JambaConfig

from octavo import LLM, SamplingParams
from octavo.config import ConfigError, EngineConfig
from octavo.cpu import kernels
from octavo.cpu.layers import CpuMambaMixer
from octavo.engine.core import check_ssm_state_supported
from octavo.kv.cache_spec import SSMStateSpec
from octavo.kv.coordinator import KVCacheCoordinator
from octavo.models.layers.mamba import MambaMixer
from tests.core import arch_parity
from tests.core.arch_parity import COMMON, Tiny, hf_reference

pytestmark = pytest.mark.usefixtures("single_thread")

LENGTHS = [5, 77, 700]
MAX_MODEL_LEN = 736
KV_BLOCKS = 52  # of 16 tokens for the 2 attention layers: all three requests need 56
CONFIG = JambaConfig(**{**COMMON, "num_hidden_layers": 4, "max_position_embeddings": 1024},
                     num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
                     expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1,
                     mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8)


@pytest.fixture(scope="module")
def jamba(tmp_path_factory) -> Tiny:  # type: ignore[no-untyped-def]
    return Tiny("jamba", CONFIG, tmp_path_factory.mktemp("jamba"), LENGTHS)


def coordinator_of(llm: LLM) -> KVCacheCoordinator:
    manager = llm.llm_engine.core.scheduler.kv_manager
    assert isinstance(manager, KVCacheCoordinator) and manager.state_slots is not None
    return manager


def test_every_position_matches_hf(jamba: Tiny) -> None:
    """Layers 0 and 2 Mamba, 1 and 3 attention: prompt chunks of 64 continue each other's
    convolution and scan state."""
    assert [isinstance(layer.mamba, MambaMixer) if hasattr(layer, "mamba") else "attention"
            for layer in jamba.ours.model.layers] == [True, "attention", True, "attention"]
    arch_parity.check_every_position(jamba.ours, jamba.prompts, jamba.references, 64,
                                     jamba.seed, jamba.label)


def test_engine_with_chunks_and_preemption_mid_decode_matches_hf(jamba: Tiny, caplog) -> None:  # type: ignore[no-untyped-def]
    """A request preempted while it decodes recomputes into a fresh state slot and goes on
    with HF's tokens; prefix caching is off, with the reason logged."""
    with caplog.at_level(logging.INFO, logger="octavo.engine.core"):
        llm = arch_parity.check_engine(jamba, kv_blocks=KV_BLOCKS, max_model_len=MAX_MODEL_LEN)
    assert "prefix caching is off: this model's SSM layers" in caplog.text
    assert any(outputs > 0 for _, outputs in llm.preempted), llm.preempted  # type: ignore[attr-defined]
    coordinator = coordinator_of(llm)
    assert not coordinator.enable_caching
    assert coordinator.state_slots.num_free == coordinator.state_slots.num_slots == 3


def test_64_concurrent_requests_fill_and_return_the_state_pool(jamba: Tiny) -> None:
    """64 requests of 3-120 tokens at once, max_num_seqs 64: every one completes, the pool
    was full at its peak and is whole again after; a sample matches HF."""
    rng = np.random.default_rng(jamba.seed)
    prompts = arch_parity.random_prompts(COMMON["vocab_size"],
                                         rng.integers(3, 120, 64).tolist(), jamba.seed)
    llm = LLM(model=str(jamba.folder), dtype="float32", max_num_seqs=64, max_model_len=256,
              max_num_batched_tokens=2048, kv_cache_memory=arch_parity.kv_budget(
                  jamba.ours, 256, 64 * 16, 64))
    pool = coordinator_of(llm).state_slots
    assert pool.num_slots == 64
    peak, original = [0], pool.take

    def counting(request_id: str) -> int:
        slot = original(request_id)
        peak[0] = max(peak[0], pool.num_slots - pool.num_free)
        return slot

    pool.take = counting  # type: ignore[method-assign]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                           use_tqdm=False)
    assert all(len(out.outputs[0].token_ids) == 8 for out in outputs)
    assert peak[0] == 64 and pool.num_free == 64
    for i in range(0, 64, 16):
        reference = hf_reference(jamba.hf, prompts[i], 8)
        assert outputs[i].outputs[0].token_ids == reference.tokens, f"{jamba.label} prompt {i}"


def test_tensor_parallel_matches_hf(jamba: Tiny) -> None:
    """TP=2: the Mamba channels and the state split over the ranks."""
    arch_parity.check_tensor_parallel(jamba, MAX_MODEL_LEN)


def test_state_larger_than_the_budget_is_refused(jamba: Tiny) -> None:
    with pytest.raises(ValueError, match=r"the SSM layers' state of 64 requests .* takes "
                                         r"\d+ bytes, the whole KV budget of 65536 bytes"):
        LLM(model=str(jamba.folder), dtype="float32", max_num_seqs=64, max_model_len=256,
            kv_cache_memory=65536)


@pytest.mark.parametrize("kwargs", [
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
    {"kv_transfer_config": {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both"}},
])
def test_drafts_and_connectors_are_refused(kwargs: dict) -> None:
    with pytest.raises(ConfigError, match="SSM layers .* keep a state per request, which "
                                          "does not support"):
        check_ssm_state_supported(EngineConfig.from_kwargs(**kwargs), SSMStateSpec((0, 2)))


@pytest.mark.skipif(kernels.library() is None, reason="the CPU's fused kernels are not built here")
def test_cpu_decode_kernel_matches_the_scan_reference(jamba: Tiny) -> None:
    """The CPU's one-pass scan step: the portable step's states and outputs, in fp32."""
    mixer = copy.deepcopy(jamba.ours.model.layers[0].mamba)
    gen = torch.Generator().manual_seed(jamba.seed)
    state = torch.randn(8, mixer.inner, 3 + 8, generator=gen)
    rows = torch.tensor([5, 0, 2])
    x, dt = torch.randn(3, mixer.inner, generator=gen), torch.rand(3, mixer.inner, generator=gen)
    b, c = torch.randn(3, 8, generator=gen), torch.randn(3, 8, generator=gen)
    expected_state = state.clone()
    expected = mixer._scan_step(expected_state, rows, x, dt, b, c)
    mixer.__class__ = CpuMambaMixer
    got = mixer._scan_step(state, rows, x, dt, b, c)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    assert torch.allclose(state, expected_state, atol=1e-6)

"""Kernel cases that would read or write out of bounds if a mask were wrong - padding
tokens with slot -1, requests with no context, rows of a CUDA-graph batch left over from
a larger batch. Under the interpreter an out-of-bounds access kills the process, so these
run in a subprocess of their own (``test_crash_prone.py``), never in the main test run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from octavo.models.build import build_model
from octavo.models.loader import load_model_files
from octavo.sampling_params import SamplingParams
from octavo.testing.seeds import draw_seed
from octavo.worker.input_batch import CachedRequestState, InputBatch
from octavo.worker.step_inputs import StepInputs, prepare_step
from octavo_triton.backend import TritonAttentionBackend
from octavo_triton.cuda_graphs import DecodeGraphs, StaticDecodeInputs
from octavo_triton.kernels.attention import paged_attention
from octavo_triton.kernels.kv_cache import reshape_and_cache
from octavo_triton.layers import use_triton_layers
from tests.attention_cases import dense_reference, make_case
from tests.core.tiny_models import save_tiny_model

from .helpers import DEVICE

BLOCK_SIZE, NUM_BLOCKS, MAX_MODEL_LEN = 16, 40, 128


def test_padding_tokens_never_touch_the_cache() -> None:
    seed = draw_seed()
    gen = torch.Generator().manual_seed(seed)
    key = torch.randn(9, 2, 64, generator=gen).to(DEVICE)
    key[::2] = float("nan")  # the padding tokens: any write of theirs would show
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE, generator=gen)[:9].to(DEVICE)
    slots[::2] = -1
    cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, 2, 64, generator=gen).to(DEVICE)
    want = cache.clone()
    want.view(-1, 2, 64)[slots[1::2]] = key[1::2]
    reshape_and_cache(key, key, cache, cache, slots)
    assert torch.equal(cache, want), f"seed {seed}"


def test_requests_without_context_get_zeros() -> None:
    """Padding rows of a graph batch: one query token, ``seq_len`` 0, a stale block table."""
    seed = draw_seed()
    requests = [(40, 1), (0, 1), (17, 1), (0, 1)]
    case = make_case(requests, 8, 64, BLOCK_SIZE, torch.float32, seed)
    meta = case.metadata
    meta.seq_lens[1::2] = 0
    meta.block_tables[1::2] = NUM_BLOCKS * 1000  # never to be read
    meta.slot_mapping[1::2] = -1
    cache = case.kv_cache.to(DEVICE)
    meta = type(meta)(**{name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value
                         for name, value in vars(meta).items()})
    reshape_and_cache(case.key.to(DEVICE), case.value.to(DEVICE), cache[0], cache[1],
                      meta.slot_mapping)
    out = torch.full_like(case.query, float("nan")).to(DEVICE)
    paged_attention(out, case.query.to(DEVICE), cache[0], cache[1], meta, 0.125)
    out = out.cpu()
    assert torch.equal(out[1::2], torch.zeros_like(out[1::2])), f"seed {seed}"
    want = dense_reference(case, requests, 0.125, None)
    torch.testing.assert_close(out[0::2].double(), want[0::2], rtol=0, atol=2e-5,
                               msg=lambda m: f"seed {seed}: {m}")


class DecodeScenario:
    """A tiny model on the Triton kernels, its paged cache and a persistent batch of
    requests that have had their prompts computed: ready for decode steps."""

    def __init__(self, folder: Path, prompt_lens: list[int], seed: int) -> None:
        save_tiny_model("qwen3", folder, seed)
        self.model = build_model(load_model_files(folder), torch.float32,
                                 TritonAttentionBackend, device=DEVICE)
        use_triton_layers(self.model)
        shape = TritonAttentionBackend.kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE,
                                                      self.model.num_kv_heads,
                                                      self.model.head_dim)
        self.kv_caches = [torch.zeros(shape, device=DEVICE)
                          for _ in range(self.model.num_layers)]
        self.batch = InputBatch(8, MAX_MODEL_LEN, MAX_MODEL_LEN // BLOCK_SIZE)
        gen = torch.Generator().manual_seed(seed)
        blocks = torch.randperm(NUM_BLOCKS, generator=gen).tolist()
        for i, length in enumerate(prompt_lens):
            prompt = torch.randint(0, 256, (length,), generator=gen).tolist()
            self.batch.add(CachedRequestState(str(i), prompt, SamplingParams(), [], None,
                                              [blocks.pop() for _ in range(6)]), 0)
        self.forward(self.step({str(i): n for i, n in enumerate(prompt_lens)}))
        self.advance()

    def step(self, num_scheduled: dict[str, int]) -> StepInputs:
        return prepare_step(self.batch, num_scheduled, BLOCK_SIZE, DEVICE)

    def decode_step(self) -> StepInputs:
        return self.step({req_id: 1 for req_id in self.batch.req_ids})

    @torch.inference_mode()
    def forward(self, step: StepInputs, kv_caches: list[torch.Tensor] | None = None,
                ) -> torch.Tensor:
        return self.model(step.input_ids, step.positions, kv_caches or self.kv_caches,
                          step.metadata)

    def advance(self) -> None:
        """Every request computed what it has and gets one more token."""
        for row in range(self.batch.num_reqs):
            self.batch.num_computed_tokens[row] = self.batch.num_tokens[row]
            self.batch.append_token(row, 7 + row)

    def eager(self, step: StepInputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The step without padding, on a copy of the cache: hidden states, cache after."""
        caches = [cache.clone() for cache in self.kv_caches]
        return self.forward(step, caches), caches


def test_padded_decode_steps_equal_unpadded(tmp_path: Path) -> None:
    """What a CUDA graph replays - a decode step copied into the static buffers and padded
    to a captured size - computes what the step computes eagerly, writes the step's slots
    and nothing else, and rows left over from a larger earlier batch are made padding
    again. (Matmuls over 8 rows instead of 3 round differently: close, not equal.)"""
    seed = draw_seed()
    scenario = DecodeScenario(tmp_path, [5, 20, 33], seed)
    static = StaticDecodeInputs.allocate(8, MAX_MODEL_LEN // BLOCK_SIZE, DEVICE)
    for size in (8, 4):  # 3 requests padded to 8; then 2 requests padded to 4
        step = scenario.decode_step()
        want, want_caches = scenario.eager(step)
        static.fill(step, size)
        with torch.inference_mode():
            got = scenario.model(static.input_ids[:size], static.positions[:size],
                                 scenario.kv_caches, static.metadata(size, MAX_MODEL_LEN))
        n = step.metadata.num_reqs
        where = f"seed {seed}, size {size}"
        torch.testing.assert_close(got[:n], want, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, where=where: f"{where}: {m}")
        written = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool, device=DEVICE)
        written[step.metadata.slot_mapping] = True
        for got_cache, want_cache in zip(scenario.kv_caches, want_caches):
            torch.testing.assert_close(got_cache, want_cache, rtol=1e-5, atol=1e-5)
            untouched = ~written.view(NUM_BLOCKS, BLOCK_SIZE)
            assert torch.equal(got_cache[:, untouched], want_cache[:, untouched]), (
                f"{where}: padding wrote into the cache")
        scenario.advance()
        scenario.batch.remove(scenario.batch.req_ids[-1])


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs need a GPU")
def test_graph_replay_equals_eager(tmp_path: Path) -> None:
    seed = draw_seed()
    scenario = DecodeScenario(tmp_path, [5, 20, 33, 64], seed)
    graphs = DecodeGraphs(scenario.model, scenario.kv_caches, [1, 2, 4, 8],
                          MAX_MODEL_LEN // BLOCK_SIZE, MAX_MODEL_LEN, DEVICE)
    graphs.capture()
    for _ in range(3):
        step = scenario.decode_step()
        assert graphs.fits(step)
        want, _ = scenario.eager(step)
        torch.testing.assert_close(graphs.run(step), want, rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"seed {seed}: {m}")
        scenario.advance()

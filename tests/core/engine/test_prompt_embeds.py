"""Prompt embeddings through ``LLM.generate({"prompt_embeds": tensor})`` (issue 26).

The reference: a prompt's token ids and the model's own embedding of those ids must give
the same greedy tokens (fp32) - through chunked prefill, mixed with token prompts in one
batch, across preemption, and with the prefix cache, where identical embeddings share
blocks and an embedding never matches a token prompt's blocks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.block_hash import update_block_hashes
from octavo.config import ConfigError, EngineConfig
from octavo.engine.errors import InvalidRequestError
from octavo.request import Request
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model

pytestmark = pytest.mark.usefixtures("single_thread")
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
BLOCK = 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    """A tiny random Llama folder and HF's embedding matrix of the same weights."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    hf = save_tiny_model("llama", folder, seed=draw_seed())
    return folder, hf.model.embed_tokens.weight.detach().clone()


@pytest.fixture(scope="module")
def shared_llm(tiny: tuple[Path, torch.Tensor]) -> LLM:
    """One engine for the tests that need no settings of their own (a refused request
    must leave it serving)."""
    return make_llm(tiny[0])


def make_llm(folder: Path, **kwargs) -> LLM:  # type: ignore[no-untyped-def]
    args = dict(dtype="float32", max_num_batched_tokens=24, kv_cache_memory=8 * 2**20,
                enable_prompt_embeds=True)
    return LLM(model=str(folder), **{**args, **kwargs})


def random_prompts(lengths: list[int]) -> list[list[int]]:
    rng = np.random.default_rng(draw_seed())
    return [rng.integers(0, 256, n).tolist() for n in lengths]


def token_ids(outputs) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [o.outputs[0].token_ids for o in outputs]


def test_embeddings_of_a_prompt_give_its_outputs(tiny: tuple[Path, torch.Tensor]) -> None:
    folder, weight = tiny
    # 24-token budget: every prompt is prefilled in chunks, embedded and token requests
    # share steps, and chunks end mid-block and mid-prompt.
    llm = make_llm(folder, enable_prefix_caching=False)
    prompts = random_prompts([37, 5, 50, 1])
    reference = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    mixed = [{"prompt_embeds": weight[p]} if i % 2 == 0 else {"prompt_token_ids": p}
             for i, p in enumerate(prompts)]
    outputs = llm.generate(mixed, GREEDY, use_tqdm=False)
    assert token_ids(outputs) == token_ids(reference)
    for prompt, output in zip(prompts[::2], outputs[::2]):
        assert output.prompt == ""
        assert len(output.prompt_token_ids) == len(prompt)  # usage counts the rows


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_embeddings_are_their_float32_values(
        tiny: tuple[Path, torch.Tensor], shared_llm: LLM, dtype: torch.dtype) -> None:
    weight = tiny[1]
    prompt = random_prompts([30])[0]
    half = weight[prompt].to(dtype)
    outputs = shared_llm.generate([{"prompt_embeds": half}, {"prompt_embeds": half.float()}],
                                  GREEDY, use_tqdm=False)
    assert outputs[0].outputs[0].token_ids == outputs[1].outputs[0].token_ids


def test_preemption_recomputes_from_the_embeddings(tiny: tuple[Path, torch.Tensor]) -> None:
    folder, weight = tiny
    lengths = np.random.default_rng(draw_seed()).integers(20, 40, 4)
    prompts = random_prompts([int(n) for n in lengths])
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    ample = make_llm(folder).generate([{"prompt_token_ids": p} for p in prompts], params,
                                      use_tqdm=False)
    # 160 tokens of KV (as in test_llm's preemption test): running requests get preempted.
    small = make_llm(folder, max_model_len=128, kv_cache_memory=10 * 16 * 2 * 2 * 2 * 16 * 4,
                     enable_prefix_caching=False)
    tight = small.generate([{"prompt_embeds": weight[p]} for p in prompts], params,
                           use_tqdm=False)
    assert sum(o.metrics.num_preemptions for o in tight) > 0
    assert token_ids(tight) == token_ids(ample)


def test_prefix_cache_shares_identical_embeddings_only(tiny: tuple[Path, torch.Tensor]) -> None:
    folder, weight = tiny
    llm = make_llm(folder)
    prompt = random_prompts([45])[0]  # two full blocks and a partial one
    by_tokens = llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0]
    first = llm.generate({"prompt_embeds": weight[prompt]}, GREEDY, use_tqdm=False)[0]
    second = llm.generate({"prompt_embeds": weight[prompt].clone()}, GREEDY, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0  # the token prompt's blocks are not the embeddings'
    assert second.num_cached_tokens == 2 * BLOCK
    assert first.outputs[0].token_ids == second.outputs[0].token_ids \
        == by_tokens.outputs[0].token_ids
    changed = weight[prompt].clone()
    changed[BLOCK + 3] += 0.5  # the second block differs: only the first is shared
    third = llm.generate({"prompt_embeds": changed}, GREEDY, use_tqdm=False)[0]
    assert third.num_cached_tokens == BLOCK


def test_block_hashes_of_embeddings() -> None:
    rng = np.random.default_rng(draw_seed())
    embeds = rng.standard_normal((40, 8)).astype(np.float32)

    def hashes(prompt_embeds: np.ndarray | None, outputs: list[int]) -> list[bytes]:
        request = Request("r", [0] * 40, SamplingParams(), prompt_embeds=prompt_embeds,
                          output_token_ids=outputs)
        return update_block_hashes(request, BLOCK)

    outputs = rng.integers(0, 100, 10).tolist()
    same = hashes(embeds.copy(), outputs)
    assert hashes(embeds, outputs) == same and len(same) == 3
    # Block 2 holds rows 32-39 and the first 8 outputs: the outputs count.
    assert hashes(embeds, [outputs[0] + 1, *outputs[1:]])[:2] == same[:2]
    assert hashes(embeds, [outputs[0] + 1, *outputs[1:]])[2] != same[2]
    other = embeds.copy()
    other[20, 5] = np.nextafter(other[20, 5], np.float32(np.inf))  # one ulp, in block 1
    assert hashes(other, outputs)[0] == same[0] and hashes(other, outputs)[1] != same[1]
    assert not set(hashes(None, outputs)) & set(same)  # the placeholder ids as tokens


@pytest.mark.parametrize(("embeds", "problem"), [
    (torch.randn(5, 63), "hidden size 63; the model's hidden_size is 64"),
    (torch.randn(64), "2-D [num_tokens, hidden_size]"),
    (torch.randn(0, 64), "no rows"),
    (torch.randint(0, 9, (5, 64)), "got int64"),
    (np.ones((5, 64), dtype=np.float64), "got float64"),
    ([[0.0] * 64], "torch tensor or a numpy array, not list"),
    (torch.full((600, 64), 0.5), "600 rows; max_model_len is 512"),
])
def test_bad_embeddings_are_refused(shared_llm: LLM, embeds: object, problem: str) -> None:
    with pytest.raises(InvalidRequestError, match=problem.replace("[", r"\[")):
        shared_llm.generate({"prompt_embeds": embeds}, GREEDY, use_tqdm=False)


def test_non_finite_embeddings_name_the_row(shared_llm: LLM) -> None:
    llm = shared_llm
    for bad in (float("nan"), float("inf")):
        embeds = torch.randn(9, 64)
        embeds[6, 3] = bad
        with pytest.raises(InvalidRequestError, match="non-finite .* first in row 6"):
            llm.generate({"prompt_embeds": embeds}, GREEDY, use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="prompt_logprobs is not available"):
        llm.generate({"prompt_embeds": torch.randn(9, 64)},
                     SamplingParams(prompt_logprobs=1), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.generate({"prompt_embeds": torch.randn(9, 64)}, GREEDY,
                            use_tqdm=False)[0].outputs[0].token_ids) == GREEDY.max_tokens


def test_off_by_default_and_not_with_speculative_decoding(
        tiny: tuple[Path, torch.Tensor]) -> None:
    llm = make_llm(tiny[0], enable_prompt_embeds=False)
    with pytest.raises(InvalidRequestError, match="--enable-prompt-embeds"):
        llm.generate({"prompt_embeds": torch.randn(3, 64)}, GREEDY, use_tqdm=False)
    with pytest.raises(ConfigError, match="enable_prompt_embeds does not run with speculative"):
        EngineConfig.from_kwargs(enable_prompt_embeds=True, speculative_config={
            "method": "ngram", "num_speculative_tokens": 2})


@pytest.mark.slow
def test_smollm2_embeddings_give_the_prompts_outputs() -> None:
    """The default model (tied embeddings): its own embedding of a chat prompt's tokens."""
    llm = LLM(dtype="float32", max_model_len=256, max_num_batched_tokens=32,
              kv_cache_memory=64 * 2**20, enable_prompt_embeds=True)
    tokenizer = llm.get_tokenizer()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                        add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    model = llm.llm_engine.core.executor.worker.runner.model
    with torch.inference_mode():
        embeds = model.get_input_embeddings(torch.tensor(ids)).clone()
    params = SamplingParams(temperature=0.0, max_tokens=16)
    by_tokens = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0]
    by_embeds = llm.generate({"prompt_embeds": embeds}, params, use_tqdm=False)[0]
    again = llm.generate({"prompt_embeds": embeds}, params, use_tqdm=False)[0]
    assert by_embeds.outputs[0].token_ids == by_tokens.outputs[0].token_ids
    assert by_embeds.outputs[0].text == tokenizer.decode(by_embeds.outputs[0].token_ids,
                                                         skip_special_tokens=True)
    assert again.num_cached_tokens == len(ids) // BLOCK * BLOCK > 0
    assert again.outputs[0].token_ids == by_tokens.outputs[0].token_ids

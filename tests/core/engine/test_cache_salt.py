"""``cache_salt`` (vLLM's prompt key): prompts share prefix-cache blocks only with prompts
of the same salt, read from each request's prefix-cache hit count (``num_cached_tokens``),
through the offline ``LLM`` on a tiny random Llama. The OpenAI server's ``cache_salt``
field: tests/e2e/test_serve_cache_salt.py."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from octavo import LLM, SamplingParams
from octavo.engine.errors import InvalidRequestError
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model

BLOCK_SIZE = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model("llama", folder, seed=draw_seed())
    return folder


def make_llm(folder: Path, **kwargs) -> LLM:  # type: ignore[no-untyped-def]
    return LLM(model=str(folder), dtype="float32", kv_cache_memory=4 * 2**20,
               block_size=BLOCK_SIZE, **kwargs)


def test_only_prompts_with_the_same_salt_share_blocks(folder: Path) -> None:
    llm = make_llm(folder)
    prompt = np.random.default_rng(draw_seed()).integers(0, 256, 2 * BLOCK_SIZE + 5).tolist()
    full = 2 * BLOCK_SIZE  # the prompt's full blocks: what a hit can cover
    salt_a, salt_b = f"tenant-{uuid.uuid4()}", f"tenant-{uuid.uuid4()}"

    def run(**salt: str):  # type: ignore[no-untyped-def]
        [output] = llm.generate({"prompt_token_ids": prompt, **salt}, GREEDY, use_tqdm=False)
        return output.num_cached_tokens, output.outputs[0].token_ids

    first, tokens = run(cache_salt=salt_a)
    assert first == 0
    # (cache hits, tokens) in order: another salt and no salt miss; the same one hits.
    runs = [run(cache_salt=salt_b), run(cache_salt=salt_a), run(), run(), run(cache_salt=salt_b)]
    assert [hits for hits, _ in runs] == [0, full, 0, full, full]
    assert all(t == tokens for _, t in runs)  # a salt changes what is shared, not the output
    text = llm.generate({"prompt": "salted text prompt " * 4, "cache_salt": salt_a}, GREEDY,
                        use_tqdm=False)  # the text form takes a salt too
    assert text[0].outputs[0].finish_reason == "length"


def test_a_salt_is_accepted_with_prefix_caching_off(folder: Path) -> None:
    llm = make_llm(folder, enable_prefix_caching=False)
    prompt = np.random.default_rng(draw_seed()).integers(0, 256, 2 * BLOCK_SIZE + 1).tolist()
    for _ in range(2):
        [output] = llm.generate({"prompt_token_ids": prompt, "cache_salt": "s"}, GREEDY,
                                use_tqdm=False)
        assert output.num_cached_tokens == 0
    for bad in ("", 7, ["s"]):
        with pytest.raises(InvalidRequestError, match="cache_salt must be a non-empty string"):
            llm.generate({"prompt_token_ids": prompt, "cache_salt": bad}, GREEDY,
                         use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="cache_salt is not valid Unicode"):
        llm.generate({"prompt": "hi", "cache_salt": "\ud800"}, GREEDY, use_tqdm=False)

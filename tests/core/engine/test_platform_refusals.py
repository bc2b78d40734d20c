"""A request its platform refuses (``Platform.validate_request``) is refused before any step
holds it - in the front end's ``Processor``, and again on arrival at the engine core for a
front end that lacks the platform's plugin - so the requests beside it run on untouched.

On the CPU engine (in process, a tiny random Llama), with a platform that refuses what the
test names; the TPU backend's own refusals run through its interpreter in
tests/tpu/test_tpu_engine.py."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.cpu.platform import CpuPlatform
from octavo.engine.errors import InvalidRequestError
from octavo.request import Request
from tests.core.tiny_models import save_tiny_model

SEED = 5309
PROMPTS = [[5, 9, 2, 7, 1], [3, 3, 8], [11, 4, 6, 2, 9, 10, 12]]
ORDINARY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
REFUSED = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)


def refuse_logprobs(request: Request) -> None:
    if request.sampling_params.logprobs:
        raise ValueError("this platform does not compute logprobs")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model("llama", folder, seed=SEED)
    return LLM(model=str(folder), dtype="float32", kv_cache_memory=2**20, max_num_seqs=8)


def run_to_end(llm: LLM, request_ids: list[str]) -> dict[str, list[int]]:
    engine = llm.llm_engine
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = list(output.outputs[0].token_ids)
    assert sorted(tokens) == sorted(request_ids)
    return tokens


def test_refused_requests_never_reach_a_step(llm: LLM, monkeypatch: pytest.MonkeyPatch,
                                             ) -> None:
    print(f"tiny llama seed {SEED}")
    engine = llm.llm_engine
    alone = run_to_end(llm, [engine.add_request({"prompt_token_ids": p}, ORDINARY, f"a{i}")
                             for i, p in enumerate(PROMPTS)])
    monkeypatch.setattr(CpuPlatform, "validate_request", classmethod(
        lambda cls, request: refuse_logprobs(request)))
    ids = []
    for i, prompt in enumerate(PROMPTS):
        ids.append(engine.add_request({"prompt_token_ids": prompt}, ORDINARY, f"b{i}"))
        # The front end refuses it: nothing of it is left anywhere.
        with pytest.raises(InvalidRequestError, match="does not compute logprobs"):
            engine.add_request({"prompt_token_ids": prompt}, REFUSED, f"refused{i}")
        # A front end without the platform's plugin sends it on: the core refuses it.
        with pytest.raises(ValueError, match="does not compute logprobs"):
            engine.core.add_request(Request(f"raw{i}", prompt, REFUSED))
    scheduler = engine.core.scheduler
    assert len(scheduler.waiting) + len(scheduler.running) == len(PROMPTS)
    together = run_to_end(llm, ids)
    assert [together[f"b{i}"] for i in range(len(PROMPTS))] == \
        [alone[f"a{i}"] for i in range(len(PROMPTS))]

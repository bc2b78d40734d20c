"""Guided decoding through ``LLM`` on a tiny random model (fast; SmolLM2 in tests/e2e): every
output matches its constraint, and a batch mixing constrained and unconstrained requests
gives the unconstrained ones exactly the tokens they get alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from octavo import LLM, SamplingParams
from octavo.engine.errors import InvalidRequestError
from octavo.sampling_params import StructuredOutputsParams as S
from octavo.testing.seeds import draw_seed
from tests.core.tiny_models import save_tiny_model

SCHEMA = {"type": "object",
          "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                         "ok": {"type": "boolean"},
                         "tag": {"type": "string", "enum": ["x", "y"]}},
          "required": ["id", "ok", "tag"]}


@pytest.fixture(scope="module")
def seeded_llm(tmp_path_factory: pytest.TempPathFactory) -> tuple[LLM, int]:
    seed = draw_seed()
    folder: Path = tmp_path_factory.mktemp("tiny-guided")
    save_tiny_model("llama", folder, seed)
    return LLM(model=str(folder), dtype="float32", kv_cache_memory=8 * 2**20), seed


def test_outputs_match_their_constraints(seeded_llm: tuple[LLM, int]) -> None:
    llm, seed = seeded_llm
    cases = [(S(json=SCHEMA), lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
             (S(regex=r"[a-c]{2}-\d{2}"),
              lambda t: re.fullmatch(r"[a-c]{2}-\d{2}", t) or pytest.fail(t)),
             (S(choice=["left", "right"]), lambda t: t in ("left", "right") or pytest.fail(t)),
             (S(grammar='root ::= "(" [0-9] ")"'),
              lambda t: re.fullmatch(r"\([0-9]\)", t) or pytest.fail(t))]
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=64,
                             structured_outputs=constraint)
              for i, (constraint, _) in enumerate(cases) for temperature in (0.0, 1.0)]
    outputs = llm.generate(["abc"] * len(params), params, use_tqdm=False)
    for i, output in enumerate(outputs):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", f"seed {seed}: {completion}"
        cases[i // 2][1](completion.text)


def test_unconstrained_requests_are_untouched(seeded_llm: tuple[LLM, int]) -> None:
    llm, seed = seeded_llm
    plain = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    guided = SamplingParams(temperature=0.0, max_tokens=24, structured_outputs=S(json=SCHEMA))
    prompts = ["hello", "the tiny model", "xyz"]
    alone = [llm.generate(p, plain, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    mixed = llm.generate(prompts + prompts, [plain] * 3 + [guided] * 3, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:3]] == alone, f"seed {seed}"
    assert mixed[3].outputs[0].token_ids != alone[0], f"seed {seed}: the grammar did nothing"


def test_invalid_constraint_is_rejected_before_the_engine(seeded_llm: tuple[LLM, int]) -> None:
    llm, _ = seeded_llm
    bad = SamplingParams(structured_outputs=S(json={"type": "object",
                                                    "properties": {"a": {"type": "nope"}}}))
    with pytest.raises(InvalidRequestError, match='structured json: Unsupported type "nope"'):
        llm.generate("hi", bad, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.generate("hi", SamplingParams(max_tokens=2), use_tqdm=False)[0].finished

"""Acceptance of guided decoding on the default model (SmolLM2-135M-Instruct): 50
generations under each of several JSON schemas (nested objects, arrays, enums, required
fields, bounded numbers), a regex, a choice and an EBNF grammar, greedy and at temperature
1, all in one batch, every output parses and validates; a batch mixing constrained and
unconstrained requests gives the unconstrained ones the tokens they get alone."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import jsonschema
import pytest

from octavo import LLM, SamplingParams
from octavo.sampling_params import StructuredOutputsParams as S
from octavo.testing.seeds import draw_seed

pytestmark = pytest.mark.slow

PER_CONSTRAINT = 50
GREEDY_PER_CONSTRAINT = 10  # with distinct prompts; the rest at temperature 1
# Room for the longest valid output: at temperature 1 the model may fill each 24-character
# string with CJK characters of three byte-level tokens each.
MAX_TOKENS = 256
SUBJECTS = ["a customer", "a city", "a library book", "a football team", "a mountain",
            "a recipe", "a laptop", "a concert", "a hospital", "a train"]

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            "geo": {"type": "object", "properties": {
                "lat": {"type": "number", "minimum": -90, "maximum": 90},
                "lon": {"type": "number", "minimum": -180, "maximum": 180}},
                "required": ["lat", "lon"]}},
            "required": ["city", "zip", "geo"]}},
        "required": ["name", "address"]},
    "arrays": {"type": "object", "properties": {
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 10},
                   "minItems": 1, "maxItems": 5},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                 "maxItems": 3}},
        "required": ["scores", "tags"]},
    "enums": {"type": "object", "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "size": {"type": "string", "enum": ["S", "M", "L", "XL"]},
        "in_stock": {"type": "boolean"},
        "note": {"type": ["string", "null"], "maxLength": 16}},
        "required": ["colour", "size", "in_stock"]},
    "bounded_numbers": {"type": "object", "properties": {
        "price": {"type": "number", "minimum": 0, "maximum": 1000},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
        "discount": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "rating": {"type": "integer", "minimum": -5, "maximum": 5}},
        "required": ["price", "quantity", "discount", "rating"]},
}
REGEX = r"[A-Z]{2}-\d{3}-[a-z]{1,4}"
CHOICES = ["positive", "negative", "neutral"]
GRAMMAR = """root ::= item ("," item){0,3}
item ::= word "=" [0-9]{1,3}
word ::= [a-z]{1,6}"""


def _json_check(schema: dict) -> Callable[[str], None]:
    return lambda text: jsonschema.validate(json.loads(text), schema)


def _match(pattern: str) -> Callable[[str], None]:
    def check(text: str) -> None:
        assert re.fullmatch(pattern, text), text
    return check


CASES: dict[str, tuple[S, Callable[[str], None]]] = {
    **{name: (S(json=schema), _json_check(schema)) for name, schema in SCHEMAS.items()},
    "regex": (S(regex=REGEX), _match(REGEX)),
    "choice": (S(choice=CHOICES), _match("|".join(CHOICES))),
    "grammar": (S(grammar=GRAMMAR), _match(r"[a-z]{1,6}=\d{1,3}(,[a-z]{1,6}=\d{1,3}){0,3}")),
}


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(dtype="float32", max_model_len=1024, kv_cache_memory=512 * 2**20)


def _prompt(name: str, index: int) -> str:
    """Short plain prompts: prefill is most of this test's cost otherwise."""
    return f"{SUBJECTS[index % len(SUBJECTS)]} as {name} #{index}:"


def test_every_output_satisfies_its_constraint(llm: LLM) -> None:
    seed = draw_seed()
    prompts, params, names = [], [], []
    for name, (constraint, _) in CASES.items():
        for i in range(PER_CONSTRAINT):
            greedy = i < GREEDY_PER_CONSTRAINT
            prompts.append(_prompt(name, i))
            params.append(SamplingParams(temperature=0.0 if greedy else 1.0,
                                         seed=None if greedy else seed + i,
                                         max_tokens=MAX_TOKENS, structured_outputs=constraint))
            names.append(name)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for name, output in zip(names, outputs):
        completion = output.outputs[0]
        context = f"{name} (seed {seed}): {completion.text!r}"
        assert completion.finish_reason == "stop", context
        try:
            CASES[name][1](completion.text)
        except Exception as exc:
            raise AssertionError(f"{context}: {exc}") from None
    distinct = {n: len({o.outputs[0].text for o, m in zip(outputs, names) if m == n})
                for n in CASES}
    print(f"\ndistinct outputs per constraint (of {PER_CONSTRAINT}): {distinct}")


def test_unconstrained_requests_get_their_own_tokens(llm: LLM) -> None:
    plain = SamplingParams(temperature=0.0, max_tokens=48)
    texts = ["Write a haiku about rain.", "What is the capital of Italy?",
             "List three fruits.", "Explain gravity to a child."]
    prompts = [{"prompt_token_ids": llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
        return_dict=False)} for t in texts]
    alone = [llm.generate(p, plain, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    guided = [SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=c)
              for c, _ in CASES.values()]
    mixed = llm.generate(prompts + prompts[:1] * len(guided), [plain] * len(prompts) + guided,
                         use_tqdm=False)
    assert [m.outputs[0].token_ids for m in mixed[: len(prompts)]] == alone

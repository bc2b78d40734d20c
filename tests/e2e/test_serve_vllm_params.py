"""vLLM's request parameters through ``octavo serve`` (tiny random model, greedy): each one
changes what it says it does, on completions and chat alike, and equals the offline API
where there is one to compare with. (``top_k``, ``min_p`` and ``ignore_eos``:
test_serve_api.py; ``priority``: test_serve_reasoning_templates.py; ``cache_salt``:
test_serve_cache_salt.py; ``best_of`` and the refused ones: test_serve_errors.py.)"""

from __future__ import annotations

import re
from typing import Any

import pytest
from openai import OpenAI

from octavo import LLM, SamplingParams

from ..core.tiny_models import EOS_ID, PAD_ID
from .conftest import TinyModel

PROMPT = "The tiny model says"
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 12}
USER = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def model(tiny_model: TinyModel) -> str:
    return str(tiny_model.folder)


def byte_id(char: str) -> int:
    """A printable ASCII character's token id in the tiny byte-level tokenizer."""
    return ord(char) - ord("!")


def completion(client: OpenAI, model: str, prompt: Any = PROMPT, **extra: Any) -> Any:
    body = {"ignore_eos": True, "return_token_ids": True, **extra}
    return client.completions.create(model=model, prompt=prompt, **GREEDY,
                                     extra_body=body).choices[0]


def test_token_level_parameters(client: OpenAI, model: str, tiny_model: TinyModel) -> None:
    context = f"model seed {tiny_model.seed}"
    plain = completion(client, model)
    assert len(plain.token_ids) == 12, context  # return_token_ids: the choice's token ids
    third = plain.token_ids[2]
    first_stop = plain.token_ids.index(third)  # where the token first occurs
    stopped = completion(client, model, stop_token_ids=[third], ignore_eos=False)
    assert stopped.token_ids == plain.token_ids[:first_stop + 1], context
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", third)

    held = completion(client, model, stop_token_ids=[plain.token_ids[0]], ignore_eos=False,
                      min_tokens=4)
    assert len(held.token_ids) >= 4, context  # the stop token is held back until then

    allowed = sorted(set(plain.token_ids[:2]) | {byte_id("z")})
    only = completion(client, model, allowed_token_ids=allowed)
    assert len(only.token_ids) == 12 and set(only.token_ids) <= set(allowed), context

    # "a" made the most likely of "abc": every token is "a" until it is a bad word.
    letters = [byte_id(char) for char in "abc"]
    favour = {"allowed_token_ids": letters, "logit_bias": {str(letters[0]): 50}}
    assert completion(client, model, **favour).text == "a" * 12, context
    banned = completion(client, model, bad_words=["a"], **favour)
    assert set(banned.text) <= {"b", "c"} and len(banned.token_ids) == 12, (banned, context)

    chat = client.chat.completions.create(model=model, messages=USER, **GREEDY, extra_body={
        "ignore_eos": True, "allowed_token_ids": allowed, "return_token_ids": True})
    assert set(chat.choices[0].token_ids) <= set(allowed), context


def test_text_level_parameters(client: OpenAI, model: str, tiny_model: TinyModel) -> None:
    context = f"model seed {tiny_model.seed}"
    plain = completion(client, model)
    stop = plain.text[3:5]
    cut = plain.text.index(stop)
    kept = completion(client, model, stop=[stop], include_stop_str_in_output=True)
    assert kept.text == plain.text[:cut + len(stop)] and kept.finish_reason == "stop", context
    dropped = completion(client, model, stop=[stop])
    assert dropped.text == plain.text[:cut], context

    # Only special tokens to choose from: skip_special_tokens decides whether they show.
    specials = [PAD_ID, EOS_ID]
    shown = completion(client, model, allowed_token_ids=specials, skip_special_tokens=False)
    assert re.fullmatch(r"(<\|pad\|>|<\|eos\|>)+", shown.text), (shown.text, context)
    assert completion(client, model, allowed_token_ids=specials).text == ""

    echoed = completion(client, model, echo=True)
    assert echoed.text == PROMPT + plain.text, context
    continued = client.chat.completions.create(
        model=model, messages=[*USER, {"role": "assistant", "content": "Well,"}], **GREEDY,
        extra_body={"ignore_eos": True, "echo": True, "add_generation_prompt": False,
                    "continue_final_message": True})
    assert continued.choices[0].message.content.startswith("Well,"), context


def test_prompt_parameters(client: OpenAI, model: str, tiny_model: TinyModel,
                           offline: LLM) -> None:
    context = f"model seed {tiny_model.seed}"
    ids = completion(client, model, max_tokens=1).prompt_token_ids
    last = ids[-4:]
    truncated = completion(client, model, truncate_prompt_tokens=4)
    assert truncated.prompt_token_ids == last, context
    assert truncated.text == completion(client, model, prompt=last).text, context

    response = client.completions.create(model=model, prompt=PROMPT, max_tokens=2,
                                         temperature=0.0, extra_body={"prompt_logprobs": 3})
    served = response.choices[0].model_extra["prompt_logprobs"]
    [expected] = offline.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=2,
                                                         prompt_logprobs=3), use_tqdm=False)
    assert served[0] is None and len(served) == len(ids) == len(expected.prompt_logprobs)
    for position, (got, want) in enumerate(zip(served[1:], expected.prompt_logprobs[1:])):
        assert want is not None and ids[position + 1] in want, context
        assert {int(token) for token in got} == set(want), (position, context)
        for token, entry in got.items():
            assert entry["logprob"] == pytest.approx(want[int(token)].logprob, abs=1e-4)
            assert entry["rank"] == want[int(token)].rank
            assert entry["decoded_token"] == want[int(token)].decoded_token

    chat = client.chat.completions.create(model=model, messages=USER, max_tokens=1,
                                          extra_body={"prompt_logprobs": 1})
    assert len(chat.model_extra["prompt_logprobs"]) == chat.usage.prompt_tokens


def test_sampling_parameters_equal_the_offline_api(client: OpenAI, model: str,
                                                   tiny_model: TinyModel,
                                                   offline: LLM) -> None:
    context = f"model seed {tiny_model.seed}"
    penalised = completion(client, model, repetition_penalty=1.8)
    assert penalised.text != completion(client, model).text, context
    sampled = client.completions.create(model=model, prompt=PROMPT, max_tokens=12,
                                        temperature=1.0, seed=7,
                                        extra_body={"ignore_eos": True, "min_p": 0.2})
    for served, params in (
            (penalised.text, SamplingParams(temperature=0.0, repetition_penalty=1.8)),
            (sampled.choices[0].text, SamplingParams(temperature=1.0, seed=7, min_p=0.2))):
        params.max_tokens, params.ignore_eos = 12, True
        [expected] = offline.generate(PROMPT, params, use_tqdm=False)
        assert served == expected.outputs[0].text, (params, context)


def test_structured_outputs_and_token_ids_in_logprobs(client: OpenAI, model: str) -> None:
    regex = r"[a-c]{3}-[0-9]{2}"
    constrained = client.completions.create(model=model, prompt=PROMPT, max_tokens=12,
                                            extra_body={"structured_outputs": {"regex": regex}})
    assert re.fullmatch(regex, constrained.choices[0].text), constrained
    chat = client.chat.completions.create(
        model=model, messages=USER, max_tokens=12,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert chat.choices[0].message.content in ("yes", "no")

    logprobs = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=3, logprobs=2, temperature=0.0,
        extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True}).choices[0]
    expected = [f"token_id:{token}" for token in logprobs.model_extra["token_ids"]]
    assert logprobs.logprobs.tokens == expected
    assert all(re.fullmatch(r"token_id:\d+", top) for step in logprobs.logprobs.top_logprobs
               for top in step)
    chat_logprobs = client.chat.completions.create(
        model=model, messages=USER, max_tokens=3, logprobs=True, top_logprobs=1,
        extra_body={"return_tokens_as_token_ids": True}).choices[0].logprobs.content
    assert all(entry.token.startswith("token_id:") for entry in chat_logprobs)

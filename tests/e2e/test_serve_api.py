"""``octavo serve`` driven by the official ``openai`` client, on a tiny random model:
completions and chat (plain and streamed), n, seeds, logprobs, stop strings, the sampling
extensions, batched prompts, and the model, version and tokenizer routes."""

from __future__ import annotations

from typing import Any

import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from octavo import LLM, SamplingParams, __version__
from octavo.testing.seeds import draw_seed

from .conftest import TinyModel
from .server import API_KEY, Server

GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def model(tiny_model: TinyModel) -> str:
    return str(tiny_model.folder)  # the served name defaults to the --model path


@pytest.fixture(scope="module")
def tokenizer(tiny_model: TinyModel) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model.folder)


def test_greedy_completion_matches_offline_and_its_stream(
        client: OpenAI, model: str, tiny_model: TinyModel, tokenizer: Any, offline: LLM) -> None:
    prompt = "The tiny model says"
    full = client.completions.create(model=model, prompt=prompt, max_tokens=24, **GREEDY)
    choice = full.choices[0]
    expected = offline.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24,
                                                       ignore_eos=True), use_tqdm=False)
    assert choice.text == expected[0].outputs[0].text, f"model seed {tiny_model.seed}"
    assert choice.finish_reason == "length"
    assert full.usage.prompt_tokens == len(tokenizer.encode(prompt))
    assert full.usage.completion_tokens == 24

    chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=24,
                                            stream=True, stream_options={"include_usage": True},
                                            **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_chat_goes_through_the_chat_template(client: OpenAI, model: str, tokenizer: Any,
                                             tiny_model: TinyModel, offline: LLM) -> None:
    reply = client.chat.completions.create(model=model, messages=MESSAGES,
                                           max_completion_tokens=12, **GREEDY)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
    assert reply.usage.prompt_tokens == len(prompt)
    expected = offline.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=12,
                                                     ignore_eos=True), use_tqdm=False)
    content = reply.choices[0].message.content
    assert content == expected[0].outputs[0].text, f"model seed {tiny_model.seed}"
    assert reply.choices[0].message.role == "assistant"

    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12,
                                                 stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_and_seed(client: OpenAI, model: str, tiny_model: TinyModel) -> None:
    seed = draw_seed()
    args = dict(model=model, prompt="Pick", max_tokens=16, temperature=1.0, n=2, logprobs=0,
                extra_body={"ignore_eos": True})
    first = client.completions.create(seed=seed, **args)
    again = client.completions.create(seed=seed, **args)
    other = client.completions.create(seed=seed + 7, **args)
    context = f"seed {seed}, model seed {tiny_model.seed}"

    def tokens(response: Any) -> list[list[str]]:
        return [c.logprobs.tokens for c in sorted(response.choices, key=lambda c: c.index)]

    assert [c.index for c in first.choices] == [0, 1]
    assert first.usage.completion_tokens == 32
    assert tokens(first) == tokens(again), context
    assert tokens(first)[0] != tokens(first)[1], context  # each sample has its own seed
    assert tokens(first) != tokens(other), context

    streamed: dict[int, str] = {0: "", 1: ""}
    finished = []
    for chunk in client.completions.create(seed=seed, stream=True, **args):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
            if choice.finish_reason:
                finished.append(choice.index)
    assert streamed == {c.index: c.text for c in first.choices}, context
    assert sorted(finished) == [0, 1]


def test_completion_logprobs(client: OpenAI, model: str, tiny_model: TinyModel) -> None:
    response = client.completions.create(model=model, prompt="Numbers", max_tokens=8,
                                         logprobs=3, **GREEDY)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 8
    offset = 0
    for token, value, top, at in zip(logprobs.tokens, logprobs.token_logprobs,
                                     logprobs.top_logprobs, logprobs.text_offset):
        assert 1 <= len(top) <= 4 and value <= 0.0
        # Greedy picks the most likely token: its logprob is the top one.
        assert value == pytest.approx(max(top.values())), f"model seed {tiny_model.seed}"
        assert at == offset
        offset += len(token)


def test_chat_logprobs(client: OpenAI, model: str, tiny_model: TinyModel) -> None:
    response = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6,
                                              logprobs=True, top_logprobs=2, **GREEDY)
    content = response.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 2 and values == sorted(values, reverse=True)
        assert entry.logprob == pytest.approx(values[0]), f"model seed {tiny_model.seed}"
        assert entry.bytes == list(entry.token.encode())


def test_stop_string_ends_the_text_and_is_never_streamed(
        client: OpenAI, model: str, tokenizer: Any, tiny_model: TinyModel) -> None:
    # logit_bias confines the random model to "abc " so that stop strings are easy to find.
    bias = {str(tokenizer.encode(ch, add_special_tokens=False)[0]): 100 for ch in "abc "}
    seed = draw_seed()
    args = dict(model=model, prompt="letters:", max_tokens=40, temperature=1.0, seed=seed,
                logit_bias=bias, extra_body={"ignore_eos": True})
    context = f"seed {seed}, model seed {tiny_model.seed}"
    text = client.completions.create(**args).choices[0].text
    assert len(text) == 40 and set(text) <= set("abc "), (text, context)
    # A 4-character stop string whose first occurrence starts at `cut`.
    cut = next((i for i in range(4, 30) if text.find(text[i : i + 4]) == i), None)
    assert cut is not None, (text, context)
    stop = text[cut : cut + 4]

    stopped = client.completions.create(stop=[stop, "zzzz"], **args).choices[0]
    assert (stopped.text, stopped.finish_reason) == (text[:cut], "stop"), (text, stop, context)
    assert stopped.model_extra["stop_reason"] == stop

    pieces = [c.choices[0].text for c in client.completions.create(stop=stop, stream=True,
                                                                    **args)]
    assert "".join(pieces) == text[:cut], (pieces, stop, context)


def test_sampling_extensions(client: OpenAI, model: str, tiny_model: TinyModel) -> None:
    args = dict(model=model, prompt="Once upon", max_tokens=12)
    greedy = client.completions.create(**args, **GREEDY).choices[0].text
    context = f"model seed {tiny_model.seed}"
    # top_k=1 and min_p=1 leave only the most likely token: greedy, whatever the temperature.
    for extension in ({"top_k": 1}, {"min_p": 1.0}):
        sampled = client.completions.create(**args, temperature=1.0,
                                            extra_body={"ignore_eos": True, **extension})
        assert sampled.choices[0].text == greedy, (extension, context)
    accepted = client.completions.create(
        **args, temperature=0.7, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.5,
        user="tester", extra_body={"repetition_penalty": 1.2, "min_tokens": 12,
                                   "priority": 3})
    assert accepted.usage.completion_tokens == 12  # min_tokens == max_tokens: no early EOS


def test_batched_prompts(client: OpenAI, model: str, tokenizer: Any) -> None:
    prompts = ["First prompt", "A second, longer prompt"]
    singles = [client.completions.create(model=model, prompt=p, max_tokens=10, **GREEDY)
               for p in prompts]
    batch = client.completions.create(model=model, prompt=prompts, max_tokens=10, **GREEDY)
    assert [c.text for c in batch.choices] == [s.choices[0].text for s in singles]
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in prompts)
    ids = tokenizer.encode(prompts[0])
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=10, **GREEDY)
    assert by_ids.choices[0].text == singles[0].choices[0].text


def test_models_version_and_tokenizer_routes(client: OpenAI, model: str, tokenizer: Any,
                                             tiny_server: Server) -> None:
    assert [m.id for m in client.models.list().data] == [model]
    status, _, version = tiny_server.request("GET", "/version")
    assert status == 200 and version["version"] == __version__ and version["engine_pid"] > 0

    status, _, body = tiny_server.request("POST", "/tokenize", {"prompt": "hello world"},
                                          api_key=API_KEY)
    assert status == 200 and body["tokens"] == tokenizer.encode("hello world")
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 512
    status, _, back = tiny_server.request("POST", "/detokenize", {"tokens": body["tokens"]},
                                          api_key=API_KEY)
    assert status == 200 and back["prompt"] == "hello world"
    status, _, chat = tiny_server.request("POST", "/tokenize", {"messages": MESSAGES},
                                          api_key=API_KEY)
    assert chat["tokens"] == tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_reset_prefix_cache(client: OpenAI, model: str, tiny_server: Server) -> None:
    prompt = "a prompt long enough to fill a few KV blocks " * 3

    def hits_after_request() -> float:
        client.completions.create(model=model, prompt=prompt, max_tokens=2, **GREEDY)
        return tiny_server.metrics()["vllm:prefix_cache_hits_total"]

    first = hits_after_request()
    assert hits_after_request() > first  # the second time its blocks come from the cache
    status, _, _ = tiny_server.request("POST", "/reset_prefix_cache", api_key=API_KEY)
    assert status == 200
    before = tiny_server.metrics()["vllm:prefix_cache_hits_total"]
    assert hits_after_request() == before  # the cache was emptied

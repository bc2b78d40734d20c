"""The OpenAI server applies the model's generation_config.json (``--generation-config
auto``, the default): a field a request leaves out takes the file's default, one it sets
keeps its value, and the file's extra EOS id ends requests with vLLM's stop reason. The
offline ``LLM`` on the same folder is the reference (tests/core checks it against HF)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM

from octavo import LLM, SamplingParams

from ..core.generation_reference import hf_greedy, model_copy, pick_stop_ids
from ..core.tiny_models import EOS_ID, TinyModel
from .conftest import start_tiny_server
from .server import Server

DEFAULT_MAX = 5
MESSAGES = [{"role": "user", "content": "Say something."}]


class Served:
    def __init__(self, tiny_model: TinyModel, folder: Path) -> None:
        rng = random.Random(tiny_model.seed)
        self.prompts = [[rng.randrange(256) for _ in range(rng.randrange(3, 10))]
                        for _ in range(6)]
        hf_model = AutoModelForCausalLM.from_pretrained(tiny_model.folder, dtype=torch.float32)
        # Within the first DEFAULT_MAX - 1 tokens: on the last one, "length" would win.
        [self.extra] = pick_stop_ids(hf_greedy(hf_model, self.prompts, DEFAULT_MAX), 1, rng,
                                     DEFAULT_MAX - 1)
        self.model = TinyModel(model_copy(tiny_model.folder, folder, generation_config={
            "eos_token_id": [EOS_ID, self.extra], "temperature": 0.0,
            "max_new_tokens": DEFAULT_MAX}), tiny_model.seed)


@pytest.fixture(scope="module")
def served(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return Served(tiny_model, tmp_path_factory.mktemp("generation-config") / "model")


@pytest.fixture(scope="module")
def server(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with start_tiny_server(served.model, tmp_path_factory.mktemp("gc-server")) as server:
        yield server


@pytest.fixture(scope="module")
def client(server: Server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def offline(served: Served) -> LLM:
    return LLM(model=str(served.model.folder), dtype="float32", kv_cache_memory=4 * 2**20)


def completions(client: OpenAI, served: Served, **fields):  # type: ignore[no-untyped-def]
    response = client.completions.create(model=str(served.model.folder),
                                         prompt=served.prompts, **fields)
    return sorted(response.choices, key=lambda c: c.index)


def test_unset_fields_take_the_generation_config_defaults(
        client: OpenAI, served: Served, offline: LLM, server: Server) -> None:
    assert "Default sampling parameters have been overridden" in server.log()
    choices = completions(client, served)  # no temperature, no max_tokens
    expected = offline.generate([{"prompt_token_ids": p} for p in served.prompts],
                                use_tqdm=False)  # the same defaults, offline
    assert [(c.text, c.finish_reason, c.stop_reason) for c in choices] == [
        (o.outputs[0].text, o.outputs[0].finish_reason, o.outputs[0].stop_reason)
        for o in expected], f"model seed {served.model.seed}"
    assert all(len(o.outputs[0].token_ids) <= DEFAULT_MAX for o in expected)
    assert served.extra in [c.stop_reason for c in choices]  # the file's EOS id stopped one


def test_fields_a_request_sets_keep_their_values(
        client: OpenAI, served: Served, offline: LLM) -> None:
    choices = completions(client, served, max_tokens=9, temperature=0.0,
                          extra_body={"ignore_eos": True})
    expected = offline.generate([{"prompt_token_ids": p} for p in served.prompts],
                                SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
                                use_tqdm=False)
    assert [c.text for c in choices] == [o.outputs[0].text for o in expected]
    assert all(c.finish_reason == "length" for c in choices)
    assert all(len(o.outputs[0].token_ids) == 9 for o in expected)


def test_chat_takes_the_defaults_too(client: OpenAI, served: Served, offline: LLM) -> None:
    reply = client.chat.completions.create(model=str(served.model.folder), messages=MESSAGES)
    [expected] = offline.chat(MESSAGES, use_tqdm=False)
    assert reply.choices[0].message.content == expected.outputs[0].text
    assert reply.usage.completion_tokens == len(expected.outputs[0].token_ids) <= DEFAULT_MAX

"""The OpenAI server's ``cache_salt`` (vLLM's request field), with the official client:
completions and chat with the same prompt and salt share prefix-cache blocks, with another
salt or none they do not, read from the server's prefix-cache hit counter."""

from __future__ import annotations

import uuid

import numpy as np
import openai
import pytest
from openai import OpenAI

from octavo.testing.seeds import draw_seed

from .conftest import TinyModel
from .server import Server

GREEDY = {"temperature": 0.0, "max_tokens": 2}


def test_completions_share_blocks_only_under_one_salt(client: OpenAI, tiny_model: TinyModel,
                                                      tiny_server: Server) -> None:
    model = str(tiny_model.folder)
    prompt = np.random.default_rng(draw_seed()).integers(0, 256, 40).tolist()  # 2 full blocks of 16
    salt_a, salt_b = f"a-{uuid.uuid4()}", f"b-{uuid.uuid4()}"

    def new_hits(**salt: str) -> float:
        before = tiny_server.metrics()["vllm:prefix_cache_hits_total"]
        client.completions.create(model=model, prompt=prompt, extra_body=salt, **GREEDY)
        return tiny_server.metrics()["vllm:prefix_cache_hits_total"] - before

    assert new_hits(cache_salt=salt_a) == 0
    assert new_hits(cache_salt=salt_b) == 0
    assert new_hits() == 0
    assert new_hits(cache_salt=salt_a) == 32
    assert new_hits(cache_salt=salt_b) == 32


def test_chat_takes_a_salt(client: OpenAI, tiny_model: TinyModel, tiny_server: Server) -> None:
    model = str(tiny_model.folder)
    run = uuid.uuid4()  # no earlier request has these salts
    messages = [{"role": "user", "content": f"a long enough message {run} " * 3}]
    hits = []
    for salt in ("x", "y", "x"):
        before = tiny_server.metrics()["vllm:prefix_cache_hits_total"]
        client.chat.completions.create(model=model, messages=messages,
                                       extra_body={"cache_salt": f"{salt}-{run}"},
                                       **GREEDY)
        hits.append(tiny_server.metrics()["vllm:prefix_cache_hits_total"] - before)
    assert hits[0] == hits[1] == 0 and hits[2] > 0


@pytest.mark.parametrize("bad", ["", 3])
def test_a_bad_salt_is_a_400_naming_it(client: OpenAI, tiny_model: TinyModel, bad) -> None:
    with pytest.raises(openai.BadRequestError, match="cache_salt"):
        client.completions.create(model=str(tiny_model.folder), prompt="hi",
                                  extra_body={"cache_salt": bad}, **GREEDY)

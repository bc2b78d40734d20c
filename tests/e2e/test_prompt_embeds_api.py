"""``prompt_embeds`` on ``/v1/completions`` (issue 26), with the official client against a
real ``octavo serve --enable-prompt-embeds``: base64 of a safetensors file works and gives
the outputs of the prompt whose token embeddings it holds; every bad payload - a pickle
(``torch.save``) above all - is a 400 naming the problem, and the server serves on."""

from __future__ import annotations

import base64
import io
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from openai import BadRequestError, OpenAI
from safetensors.torch import load_file, save

from octavo.testing.seeds import draw_seed

from .conftest import TinyModel, start_tiny_server
from .server import Server


@pytest.fixture(scope="module")
def embeds_server(tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[Server]:
    with start_tiny_server(tiny_model, tmp_path_factory.mktemp("embeds-server"),
                           "--enable-prompt-embeds") as server:
        yield server


@pytest.fixture(scope="module")
def embeds_client(embeds_server: Server) -> OpenAI:
    return OpenAI(base_url=f"{embeds_server.url}/v1", api_key="unused", max_retries=0,
                  timeout=60)


@pytest.fixture(scope="module")
def weight(tiny_model: TinyModel) -> torch.Tensor:
    """The served model's token embedding matrix, read from its checkpoint."""
    return load_file(Path(tiny_model.folder) / "model.safetensors")["model.embed_tokens.weight"]


PRINTABLE_ASCII_IDS = 94


def encode(tensors: dict[str, torch.Tensor]) -> str:
    return base64.b64encode(save(tensors)).decode()


def complete(client: OpenAI, tiny_model: TinyModel, prompt: object = "",
             prompt_embeds: object = None, **kwargs):  # type: ignore[no-untyped-def]
    extra = {"ignore_eos": True, **({} if prompt_embeds is None
                                    else {"prompt_embeds": prompt_embeds})}
    return client.completions.create(model=str(tiny_model.folder), prompt=prompt,
                                     temperature=0.0, max_tokens=10, extra_body=extra, **kwargs)


def test_embeddings_give_the_token_prompts_completion(
        embeds_client: OpenAI, tiny_model: TinyModel, weight: torch.Tensor) -> None:
    rng = np.random.default_rng(draw_seed())
    # Ids 0-93 are the bytes '!'..'~' (the tiny tokenizer's sorted byte alphabet): the token
    # prompt then ends on a whole character, as an embeddings prompt (no text) always does.
    # A prompt ending inside a UTF-8 sequence would let the detokenizer join the first
    # output byte to it, so the same tokens would read differently.
    prompts = [rng.integers(0, PRINTABLE_ASCII_IDS, int(n)).tolist() for n in (23, 40)]
    by_tokens = complete(embeds_client, tiny_model, prompt=prompts)
    encoded = [encode({"embeds": weight[p]}) for p in prompts]
    by_embeds = complete(embeds_client, tiny_model, prompt_embeds=encoded)
    assert [c.text for c in by_embeds.choices] == [c.text for c in by_tokens.choices], \
        f"model seed {tiny_model.seed}"
    assert by_embeds.usage.prompt_tokens == 23 + 40  # one per row
    one = complete(embeds_client, tiny_model, prompt_embeds=encode({"e": weight[prompts[1]]}))
    assert one.choices[0].text == by_tokens.choices[1].text
    half = encode({"e": weight[prompts[1]].to(torch.bfloat16)})
    chunks = list(complete(embeds_client, tiny_model, prompt_embeds=half, stream=True))
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 1


def pickled(tensor: torch.Tensor) -> str:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def nan_rows() -> torch.Tensor:
    rows = torch.randn(6, 64)
    rows[4, 10] = float("nan")
    return rows


BAD_PAYLOADS = [
    ("hidden", lambda: encode({"e": torch.randn(5, 32)}), "hidden size 32; the model's "
                                                         "hidden_size is 64"),
    ("nan", lambda: encode({"e": nan_rows()}), r"non-finite values .*first in row 4"),
    ("torch.save", lambda: pickled(torch.randn(5, 64)), "must be base64 of a safetensors file"),
    ("pickle", lambda: base64.b64encode(pickle.dumps([[0.5] * 64])).decode(),
     "must be base64 of a safetensors file"),
    ("base64", lambda: "this is %% not base64!", "it is not valid base64"),
    ("two tensors", lambda: encode({"a": torch.randn(2, 64), "b": torch.randn(2, 64)}),
     "it holds 2 tensors"),
    ("int", lambda: encode({"e": torch.ones(3, 64, dtype=torch.int32)}), "got int32"),
    ("1-D", lambda: encode({"e": torch.randn(64)}), "2-D"),
    ("too long", lambda: encode({"e": torch.randn(600, 64)}), "600 rows; max_model_len"),
]


@pytest.mark.parametrize(("case", "payload", "problem"), BAD_PAYLOADS,
                         ids=[case for case, _, _ in BAD_PAYLOADS])
def test_bad_payloads_are_400s_and_the_server_serves_on(
        embeds_client: OpenAI, tiny_model: TinyModel, case: str, payload, problem: str,
        ) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BadRequestError, match=problem) as caught:
        complete(embeds_client, tiny_model, prompt_embeds=payload())
    assert caught.value.status_code == 400
    after = complete(embeds_client, tiny_model, prompt="Still serving")
    assert after.choices[0].finish_reason == "length"


def test_a_text_prompt_with_embeddings_is_refused(
        embeds_client: OpenAI, tiny_model: TinyModel, weight: torch.Tensor) -> None:
    with pytest.raises(BadRequestError, match='prompt must be empty'):
        complete(embeds_client, tiny_model, prompt="text",
                 prompt_embeds=encode({"e": weight[:3]}))


def test_off_without_the_flag(client: OpenAI, tiny_model: TinyModel,
                              weight: torch.Tensor) -> None:
    with pytest.raises(BadRequestError, match="--enable-prompt-embeds"):
        complete(client, tiny_model, prompt_embeds=encode({"e": weight[:3]}))

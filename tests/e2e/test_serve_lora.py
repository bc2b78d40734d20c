"""LoRA adapters behind ``octavo serve`` (issue 50), with the official client: one served
from the start (``--lora-modules``), runtime loading and unloading through vLLM's routes
(``OCTAVO_ALLOW_RUNTIME_LORA_UPDATING``), tokens equal to HF + PEFT, and a name re-loaded
with other weights giving the new weights' tokens with no prefix-cache hit on the blocks
the old weights computed (read from the server's hit counter)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from openai import OpenAI

from octavo.entrypoints.openai.lora_routes import RUNTIME_UPDATING_ENV
from octavo.testing.seeds import draw_seed

from ..core.lora.peft_adapters import SPECS, make_adapter
from ..core.parity import hf_greedy
from ..core.tiny_models import save_tiny_model
from .conftest import TINY_SERVER_ARGS
from .server import API_KEY, Server

MAX_TOKENS = 8


def test_runtime_lora_load_serve_reload_unload(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seed = draw_seed()
    base = save_tiny_model("llama", tmp_path / "base", seed)
    old = make_adapter(base, SPECS[1], tmp_path / "old", seed + 1)
    new = make_adapter(base, SPECS[1], tmp_path / "new", seed + 2)
    # Two full blocks of 16 tokens and a partial one: 32 tokens a later request may reuse.
    prompt = np.random.default_rng(seed).integers(0, 256, 40).tolist()
    monkeypatch.setenv(RUNTIME_UPDATING_ENV, "1")
    args = ["--model", str(tmp_path / "base"), *TINY_SERVER_ARGS, "--api-key", API_KEY,
            "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
            "--lora-modules", f"start={tmp_path / 'old'}"]
    with Server(args, tmp_path / "server.log") as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                        timeout=60)

        def tokens_and_hits(model: str) -> tuple[list[int], float]:
            before = server.metrics()["vllm:prefix_cache_hits_total"]
            reply = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                              temperature=0.0,
                                              extra_body={"return_token_ids": True})
            hits = server.metrics()["vllm:prefix_cache_hits_total"] - before
            assert reply.model == model, "a reply names the adapter, as vLLM's do"
            return reply.choices[0].model_extra["token_ids"], hits

        def load(name: str, path: Path, key: str | None = API_KEY) -> int:
            return server.request("POST", "/v1/load_lora_adapter",
                                  {"lora_name": name, "lora_path": str(path)}, api_key=key)[0]

        def unload(name: str) -> tuple[int, str]:
            status, _, body = server.request("POST", "/v1/unload_lora_adapter",
                                             {"lora_name": name}, api_key=API_KEY)
            return status, str(body)

        cards = {card.id: card for card in client.models.list().data}
        assert cards["start"].model_extra["parent"] == str(tmp_path / "base"), cards
        old_tokens = hf_greedy(old, prompt, MAX_TOKENS)[0]
        new_tokens = hf_greedy(new, prompt, MAX_TOKENS)[0]
        assert old_tokens != new_tokens, f"seed {seed}: the two adapters agree"
        assert tokens_and_hits("start") == (old_tokens, 0), f"seed {seed}"
        hello = [{"role": "user", "content": "hello"}]
        assert client.chat.completions.create(model="start", messages=hello,
                                              max_tokens=2).model == "start"
        assert client.responses.create(model="start", input="hello",
                                       max_output_tokens=2).model == "start"

        # Runtime loading: behind the API key, a bad folder refused naming the problem.
        assert load("mine", tmp_path / "old", key=None) == 401
        status, _, body = server.request("POST", "/v1/load_lora_adapter",
                                         {"lora_name": "bad", "lora_path": str(tmp_path)},
                                         api_key=API_KEY)
        assert status == 400 and "no adapter_config.json" in str(body), body
        assert load("mine", tmp_path / "old") == 200
        assert tokens_and_hits("mine") == (old_tokens, 32), f"seed {seed}"  # same content

        # Unloading while a request runs with it fails (409); after, the name is gone. The
        # engine core is stopped once the request has its first token, so the request is
        # surely still running (on the tiny model it would end in half a second).
        engine_pid = server.engine_pid()
        stream = client.completions.create(model="mine", prompt=prompt, max_tokens=400,
                                           temperature=0.0, stream=True,
                                           extra_body={"ignore_eos": True})
        assert next(iter(stream)).model == "mine"
        os.kill(engine_pid, signal.SIGSTOP)
        try:
            status, body = unload("mine")
            metrics = server.request("GET", "/metrics")[2]
        finally:
            os.kill(engine_pid, signal.SIGCONT)
        assert status == 409 and "in use by 1 request" in body, body
        assert 'running_lora_adapters="mine"' in metrics, "no vllm:lora_requests_info sample"
        for _ in stream:
            pass
        assert unload("mine")[0] == 200

        # Re-loaded with other weights under the same name: their tokens, no stale blocks.
        assert load("mine", tmp_path / "new") == 200
        assert tokens_and_hits("mine") == (new_tokens, 0), f"seed {seed}"
        assert tokens_and_hits("mine") == (new_tokens, 32), f"seed {seed}"
        assert tokens_and_hits(str(tmp_path / "base"))[0] == hf_greedy(base, prompt,
                                                                        MAX_TOKENS)[0]

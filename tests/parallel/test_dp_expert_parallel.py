"""``octavo serve -dp 2 --enable-expert-parallel`` (and with ``-tp 2``): a tiny random Mixtral
(8 experts, top-2) whose experts are spread over every worker of both engines, tokens
moved to them by all-to-all, through the real server and the real openai client.

One server per configuration, reused by its checks, in order:
- 32 concurrent greedy requests: every request's tokens equal one rank's (in-process, one
  worker), and both engines served some;
- one request alone (one engine serves, the other is idle and runs dummy batches): it
  completes, with one rank's tokens;
- last, SIGKILL of one worker of engine 1 while 32 streams run: every stream ends within
  5 s of the kill, and the server reports the engines dead (``/health`` not ok).
Then a tiny Qwen2-MoE, whose shared expert runs beside the dispatched ones, at ``-dp 2``
and ``-dp 2 -tp 2``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import psutil
import pytest
from openai import OpenAI

from octavo.testing.seeds import draw_seed

from ..core.tiny_models import save_tiny_model
from ..e2e.server import Server
from ..e2e.test_serve_data_parallel import requests_per_engine
from .engines import KV_BYTES, one_thread, run
from .test_tensor_parallel import random_prompts

MAX_TOKENS = 12
STREAM_TOKENS = 400  # long enough that the kill lands mid-stream
STREAMS_END_S = 5.0
CONFIGS = {"dp2": ["-dp", "2"], "dp2-tp2": ["-dp", "2", "-tp", "2"]}


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[list[int]]]:
    """The model folder and 32 prompts (printed seed)."""
    folder = tmp_path_factory.mktemp("mixtral-8e")
    seed = draw_seed()
    save_tiny_model("mixtral", folder, seed, num_local_experts=8)
    return str(folder), random_prompts(np.random.default_rng(seed), 32)


@pytest.fixture(scope="module")
def reference(mixtral: tuple[str, list[list[int]]]) -> list[list[int]]:
    """One rank's greedy tokens for the prompts."""
    model, prompts = mixtral
    with one_thread():
        return run(model, prompts, MAX_TOKENS).tokens


@pytest.fixture(scope="module", params=list(CONFIGS))
def server(request: pytest.FixtureRequest, mixtral: tuple[str, list[list[int]]],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model, _ = mixtral
    log = tmp_path_factory.mktemp(request.param) / "server.log"
    args = ["--model", model, "--dtype", "float32", "--max-model-len", "512",
            "--kv-cache-memory", str(KV_BYTES), "--seed", "0", "--enable-expert-parallel",
            *CONFIGS[request.param]]
    with Server(args, log) as running:
        yield running


def client(server: Server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def greedy_tokens(server: Server, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's greedy token ids, all requests sent at once."""
    api = client(server)

    def one(prompt: list[int]) -> list[int]:
        choice = api.completions.create(
            model=server_model(server), prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True}).choices[0]
        return list(choice.token_ids)  # type: ignore[attr-defined]

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


def server_model(server: Server) -> str:
    return client(server).models.list().data[0].id


def health_of(server: Server) -> tuple[int, object]:
    """/health's status and body; (0, the error) once the server no longer answers."""
    try:
        status, _, body = server.request("GET", "/health")
    except OSError as exc:
        return 0, exc
    return status, body


def test_32_concurrent_requests_equal_one_rank(server: Server, mixtral: tuple[str, list],
                                               reference: list[list[int]],
                                               request: pytest.FixtureRequest) -> None:
    _, prompts = mixtral
    before = requests_per_engine(server)
    tokens = greedy_tokens(server, prompts)
    served = {engine: count - before.get(engine, 0)
              for engine, count in requests_per_engine(server).items()}
    print(f"\n32 concurrent requests: {served} per engine")
    assert sorted(served) == ["0", "1"] and all(served.values()), served
    status, _, health = server.request("GET", "/health")
    assert status == 200 and [e["alive"] for e in health["engines"]] == [True, True], health
    differing = [i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b]
    assert not differing, f"prompts {differing} differ from one rank's tokens"


def test_one_engine_idle_while_the_other_serves(server: Server, mixtral: tuple[str, list],
                                                reference: list[list[int]]) -> None:
    """One request at a time: one engine has work, the other runs dummy batches."""
    _, prompts = mixtral
    for index in (0, 1):
        assert greedy_tokens(server, [prompts[index]]) == [reference[index]]


def test_sigkill_of_one_worker_ends_every_stream(server: Server,
                                                 mixtral: tuple[str, list]) -> None:
    """Last: it leaves the module's server without engines."""
    _, prompts = mixtral
    _, _, health = server.request("GET", "/health")
    engine = psutil.Process(health["engines"][1]["pid"])
    victim = engine.children()[-1]  # a worker process of engine 1
    api, model = client(server), server_model(server)
    ended: list[float] = []

    def stream(prompt: list[int]) -> str:
        try:
            for _ in api.completions.create(model=model, prompt=prompt, stream=True,
                                            max_tokens=STREAM_TOKENS, temperature=0,
                                            extra_body={"ignore_eos": True}):
                pass
            outcome = "completed"
        except openai.APIError as exc:
            outcome = type(exc).__name__
        ended.append(time.monotonic())
        return outcome

    with ThreadPoolExecutor(len(prompts)) as pool:
        outcomes = pool.map(stream, prompts)
        time.sleep(2.0)
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        results = list(outcomes)
    last_end_s = max(ended) - killed
    status, body = health_of(server)
    while status == 200 and time.monotonic() - killed < STREAMS_END_S:
        time.sleep(0.1)
        status, body = health_of(server)
    group_ended_s = time.monotonic() - killed
    print(f"\nworker {victim.pid} of engine 1 killed: {results.count('completed')} streams "
          f"completed, {len(results) - results.count('completed')} ended with an error; the "
          f"last ended {last_end_s:.2f} s after the kill; /health {status} after "
          f"{group_ended_s:.2f} s: {body}")
    assert len(results) == len(prompts)
    assert last_end_s < STREAMS_END_S, results
    assert status != 200, f"the surviving engine still serves without its experts: {body}"
    log = Path(server.log_path).read_text(errors="replace")
    assert "died" in log and "expert group is broken" in log


@pytest.mark.parametrize("parallel", list(CONFIGS))
def test_qwen2_moe_with_a_shared_expert_equals_one_rank(parallel: str, tmp_path: Path) -> None:
    """A tiny random Qwen2-MoE (8 routed experts, top-2, a gated shared expert beside them
    that every rank runs on its own tokens; dense and sparse layers mixed) at
    ``-dp 2 --enable-expert-parallel`` (and ``-tp 2``): 32 concurrent greedy requests give
    one rank's tokens, and both engines served some."""
    from transformers import Qwen2MoeConfig

    from ..core.arch_parity import COMMON, save_hf_model

    seed = draw_seed()
    config = Qwen2MoeConfig(**{**COMMON, "num_hidden_layers": 4}, num_experts=8,
                            num_experts_per_tok=2, moe_intermediate_size=32,
                            shared_expert_intermediate_size=48, decoder_sparse_step=2,
                            mlp_only_layers=[], norm_topk_prob=False,
                            max_position_embeddings=1024)
    save_hf_model(config, tmp_path / "model", seed)
    model = str(tmp_path / "model")
    prompts = random_prompts(np.random.default_rng(seed), 32)
    with one_thread():
        reference = run(model, prompts, MAX_TOKENS).tokens
    args = ["--model", model, "--dtype", "float32", "--max-model-len", "512",
            "--kv-cache-memory", str(KV_BYTES), "--seed", "0", "--enable-expert-parallel",
            *CONFIGS[parallel]]
    with Server(args, tmp_path / "server.log") as server:
        tokens = greedy_tokens(server, prompts)
        served = requests_per_engine(server)
    differing = [i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b]
    assert not differing, f"seed={seed}: prompts {differing} differ from one rank's tokens"
    assert sorted(served) == ["0", "1"] and all(served.values()), served

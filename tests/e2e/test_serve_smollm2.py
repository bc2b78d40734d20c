"""``octavo serve`` on the default model (SmolLM2-135M-Instruct): greedy output equals the
offline ``LLM``'s for the same prompt, and SIGTERM shuts it down cleanly."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from openai import OpenAI

from octavo import LLM, SamplingParams

from .server import Server, port_is_free, still_running

pytestmark = pytest.mark.slow

# The same engine settings on both sides, so both run the same computation.
MAX_MODEL_LEN = 1024
KV_CACHE_MEMORY = 64 * 2**20
SERVER_ARGS = ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
               "--kv-cache-memory", str(KV_CACHE_MEMORY)]
DEFAULT_NAME = "SmolLM2-135M-Instruct"
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name three colours."}]
MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Launched, not yet waited for: the offline engine loads while the server does."""
    server = Server(SERVER_ARGS, tmp_path_factory.mktemp("smollm2-server") / "server.log")
    try:
        yield server
    finally:
        server.stop()


def test_greedy_output_equals_offline_llm(smol_server: Server) -> None:
    llm = LLM(dtype="float32", max_model_len=MAX_MODEL_LEN, kv_cache_memory=KV_CACHE_MEMORY)
    smol_server.wait_ready(timeout=600)
    print(f"\nSmolLM2 server healthy {smol_server.ready_s:.1f}s after launch")
    client = OpenAI(base_url=f"{smol_server.url}/v1", api_key="unused", max_retries=0,
                    timeout=120)
    assert [m.id for m in client.models.list().data] == [DEFAULT_NAME]
    expected = llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].text
    served = client.completions.create(model=DEFAULT_NAME, prompt=PROMPT,
                                       max_tokens=MAX_TOKENS, temperature=0.0)
    assert served.choices[0].text == expected
    reply = client.chat.completions.create(model=DEFAULT_NAME, messages=MESSAGES,
                                           max_tokens=MAX_TOKENS, temperature=0.0)
    expected_reply = llm.chat(MESSAGES, GREEDY, use_tqdm=False)[0].outputs[0].text
    assert reply.choices[0].message.content == expected_reply
    assert ".gguf" in smol_server.log()  # the start-up log names the model file


def test_a_prompt_the_tokenizer_empties_is_refused(smol_server: Server) -> None:
    """SmolLM2's tokenizer drops "\u0004"; that prompt of no tokens
    killed the engine core at bbec36b. Now a 400, and the engine serves on."""
    smol_server.wait_ready(timeout=600)
    status, _, payload = smol_server.request("POST", "/v1/completions",
                                             {"prompt": "\u0004", "max_tokens": 4})
    assert status == 400 and "no tokens once tokenized" in payload["error"]["message"], payload
    status, _, payload = smol_server.request("POST", "/v1/completions",
                                             {"prompt": "Hello", "max_tokens": 4})
    assert status == 200, payload


def test_sigterm_stops_server_and_engine_and_frees_the_port(smol_server: Server) -> None:
    smol_server.wait_ready(timeout=600)
    children = smol_server.processes()[1:]
    assert smol_server.engine_pid() in [p.pid for p in children]
    smol_server.proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    smol_server.proc.wait(timeout=30)
    print(f"\nSIGTERM: server exited after {time.monotonic() - start:.2f}s")
    assert still_running(children, timeout=10) == [], children
    assert port_is_free(smol_server.port)
    log = smol_server.log()
    assert "Application shutdown complete" in log and "did not stop" not in log, log[-2000:]

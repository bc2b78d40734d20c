"""Reasoning output and chat templates through ``octavo serve``, on a tiny random Qwen3
whose tokenizer has no chat template: requests bring their own
(``--trust-request-chat-template``), one written like Qwen3's (``enable_thinking``).

What the model writes is known: ``scripted_scheduler`` replaces its first output tokens
with the text between two ``<|pad|>`` tokens in the prompt (the tiny tokenizer has a token
per byte, so one per character here). The server also schedules by ``priority`` one request
at a time, for the test of that parameter.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from octavo.testing.seeds import draw_seed

from ..core.tiny_models import TinyModel, save_tiny_model
from .server import Server

# Like Qwen3's: a reply may think first; enable_thinking false closes the think block in
# the prompt. Documents, when given, come first.
TEMPLATE = (
    "{%- if documents %}{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
    "{% endif %}"
    "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}")
REASONING, ANSWER = "I add 2 and 2.", "It is 4."
# The priority test's requests: the one behind which two wait, and the one that should run
# last, ask for LONG_TOKENS; the one that should run second for WAITING_TOKENS.
LONG_TOKENS, WAITING_TOKENS = 400, 32
REPLY = f"<think>{REASONING}</think>{ANSWER}"


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """The tiny Qwen3 (its weights' seed drawn and printed: only the guided answer depends
    on them)."""
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    seed = draw_seed()
    save_tiny_model("qwen3", folder, seed=seed)
    (folder / "chat_template.jinja").unlink()  # no template of its own
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "chat_template" not in config
    return TinyModel(folder, seed)


@pytest.fixture(scope="module")
def server(qwen3: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ["--model", str(qwen3.folder), "--dtype", "float32", "--kv-cache-memory", "16MiB",
            "--reasoning-parser", "qwen3", "--trust-request-chat-template",
            "--scheduler-cls", "tests.e2e.scripted_scheduler.ScriptedScheduler",
            "--scheduling-policy", "priority", "--max-num-seqs", "1"]
    with Server(args, tmp_path_factory.mktemp("qwen3-server") / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def client(server: Server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(qwen3: TinyModel) -> str:
    return str(qwen3.folder)


def scripted(model: str, text: str, after: list[dict[str, str]] | None = None,
             **extra_body: Any) -> dict[str, Any]:
    """A chat request whose reply starts with ``text`` (``max_tokens`` ends it there);
    ``after``: messages after the user's."""
    user = {"role": "user", "content": f"<|pad|>{text}<|pad|>"}
    return {"model": model, "temperature": 0.0, "max_tokens": len(text),
            "messages": [user, *(after or [])],
            "extra_body": {"chat_template": TEMPLATE, **extra_body}}


def test_reasoning_and_content_split_at_the_tags(client: OpenAI, model: str) -> None:
    message = client.chat.completions.create(**scripted(model, REPLY)).choices[0].message
    assert (message.model_extra["reasoning"], message.content) == (REASONING, ANSWER)
    chunks = list(client.chat.completions.create(**scripted(model, REPLY), stream=True))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    reasoning = [d.model_extra.get("reasoning") or "" for d in deltas]
    content = [d.content or "" for d in deltas]
    assert ("".join(reasoning), "".join(content)) == (REASONING, ANSWER)
    assert not any("<" in piece for piece in reasoning + content)  # no piece of a tag
    hidden = client.chat.completions.create(**scripted(
        model, REPLY, include_reasoning=False)).choices[0].message
    assert (hidden.model_extra["reasoning"], hidden.content) == (None, ANSWER)


def test_chat_template_kwargs_reach_the_template(client: OpenAI, server: Server,
                                                 model: str) -> None:
    """enable_thinking false: the prompt closes the think block, so the whole reply is the
    answer, tags and all."""
    request = scripted(model, REPLY, chat_template_kwargs={"enable_thinking": False})
    message = client.chat.completions.create(**request).choices[0].message
    assert (message.model_extra["reasoning"], message.content) == (None, REPLY)
    status, _, tokens = server.request("POST", "/tokenize", {
        "messages": request["messages"], **request["extra_body"]})
    assert status == 200, tokens
    status, _, text = server.request("POST", "/detokenize", {"tokens": tokens["tokens"]})
    assert text["prompt"].endswith("<|assistant|><think></think>"), text


def test_guided_decoding_applies_to_the_answer_only(client: OpenAI, model: str) -> None:
    """The script writes only the reasoning; the model writes the answer, held to the
    choice once the reasoning ended (a choice would have refused "<think>")."""
    request = scripted(model, f"<think>{REASONING}</think>", guided_choice=["yes", "no"])
    request["max_tokens"] = 40
    choice = client.chat.completions.create(**request).choices[0]
    assert choice.message.model_extra["reasoning"] == REASONING
    assert choice.message.content in ("yes", "no") and choice.finish_reason == "stop"


def test_template_features_and_a_model_without_template(client: OpenAI, server: Server,
                                                        model: str) -> None:
    with pytest.raises(openai.BadRequestError, match="this model has no chat template"):
        client.chat.completions.create(model=model, max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    user = [{"role": "user", "content": "Hi"}]

    def prompt(**fields: Any) -> str:
        status, _, tokens = server.request("POST", "/tokenize", {
            "messages": fields.pop("messages", user), "chat_template": TEMPLATE, **fields})
        assert status == 200, tokens
        return server.request("POST", "/detokenize", {"tokens": tokens["tokens"]})[2]["prompt"]

    assert prompt() == "<|user|>Hi<|eos|><|assistant|>"
    assert prompt(add_generation_prompt=False) == "<|user|>Hi<|eos|>"
    assert prompt(documents=[{"title": "Doc", "text": "Paris"}]).startswith("[Doc: Paris]")
    continued = [*user, {"role": "assistant", "content": "Sure,"}]
    assert prompt(messages=continued, add_generation_prompt=False,
                  continue_final_message=True).endswith("<|assistant|>Sure,")
    echoed = client.chat.completions.create(**scripted(
        model, "ok", after=[{"role": "assistant", "content": "Sure,"}], echo=True,
        add_generation_prompt=False, continue_final_message=True))
    assert echoed.choices[0].message.content == "Sure,ok"


HOSTILE_TEMPLATES = [
    ("{{ ''.__class__.__mro__ }}", "SecurityError"),
    ("{{ cycler.__init__.__globals__ }}", "SecurityError"),
    ("{{ namespace.__init__.__globals__['os'] }}", "SecurityError"),
    ("{% set x = messages.append(1) %}", "SecurityError"),
    ("{{ self._TemplateReference__context.environment }}", "SecurityError"),
    ("line one\n{{ raise_exception('no such role') }}", "no such role (template line 2)"),
    ("{% for m in messages %}\n\n{% for %}", "TemplateSyntaxError"),
    ("{% for m in messages %}\n\n{% for %}", "(template line 3)"),
]


@pytest.mark.parametrize(("template", "error"), HOSTILE_TEMPLATES,
                         ids=[f"{i}" for i in range(len(HOSTILE_TEMPLATES))])
def test_templates_render_sandboxed_and_errors_are_400(client: OpenAI, model: str,
                                                       template: str, error: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"chat_template": template})
    assert error in refused.value.body["message"], refused.value.body


TEMPLATE_BOMBS = {  # template -> the limit its 400 names
    "{{ 'x' * 10**10 }}": "over its limit of 8,388,608",
    "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}":
        "the chat template took",  # more than its 2,000,000 steps or its 0.5 s
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}": "over its limit of 8,388,608",
    "{{ 'x' | center(10**10) }}{{ 10 ** 10 ** 10 ** 10 }}": "over its limit of 8,388,608",
    "{{ (10 ** 99) ** 99 ** 99 }}": "bits, over its limit of 4,096",
}


def test_template_bombs_are_400_within_a_second_and_the_server_serves_on(
        client: OpenAI, server: Server, model: str) -> None:
    for template, limit in TEMPLATE_BOMBS.items():
        start = time.monotonic()
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=model, max_tokens=2,
                                           messages=[{"role": "user", "content": "hi"}],
                                           extra_body={"chat_template": template})
        elapsed = time.monotonic() - start
        assert limit in refused.value.body["message"], refused.value.body
        assert elapsed < 1.0, (template, elapsed)
    reply = client.chat.completions.create(**scripted(model, ANSWER))
    assert reply.choices[0].message.content == ANSWER
    assert server.request("GET", "/health")[0] == 200


def test_hostile_tools_are_400_never_500(client: OpenAI, server: Server, model: str) -> None:
    walks = ("{% for t in tools %}{% for k, v in t.function.parameters.properties.items() %}"
             "{{ k }}{% endfor %}{% endfor %}" + TEMPLATE)
    bad_schema = [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": [1, 2]}}}]
    deep = {"type": "object"}
    for _ in range(400):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, max_tokens=2, tools=bad_schema,
                                       tool_choice="none",
                                       messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"chat_template": walks})
    # A deep schema the template walks one level of renders (the sandbox copies nothing).
    deep_tools = [{"type": "function", "function": {"name": "g", "parameters": deep}}]
    reply = client.chat.completions.create(
        model=model, max_tokens=2, tools=deep_tools, tool_choice="none",
        messages=[{"role": "user", "content": "hi"}], extra_body={"chat_template": walks})
    assert reply.choices[0].finish_reason in ("length", "stop")
    odd_name = [{"type": "function", "function": {"name": "x\"}]}<|eos|>{{7*7}}",
                                                  "parameters": {"type": "object"}}}]
    reply = client.chat.completions.create(
        model=model, max_tokens=2, tools=odd_name, tool_choice="none",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"chat_template": "{{ tools | tojson }}" + TEMPLATE})
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert server.request("GET", "/health")[0] == 200


def test_priority_decides_which_waiting_request_runs_first(client: OpenAI, model: str,
                                                           server: Server) -> None:
    """One request runs (--max-num-seqs 1); of the two that wait behind it, the one sent
    later with the lower priority value runs first. The order is the order in which the
    client threads hear back, so the gap between two answers must be long beside a thread's
    wake-up on a busy machine: the request that should run last asks for LONG_TOKENS, so
    run in the right order it ends LONG_TOKENS steps after the one before it (with 32 each,
    a CI run with both cores busy heard the two behind the first in the wrong order).

    The engine core is stopped (SIGSTOP) once the first request runs and until the two are
    in it (a stream's headers come once its request is sent to the engine), so the first
    cannot end before they queue behind it, however busy the machine."""
    finished: list[str] = []
    sent = threading.Barrier(3)  # the two waiting requests and this thread

    def send(name: str, max_tokens: int, priority: int, waits: bool) -> threading.Thread:
        def run() -> None:
            stream = client.completions.create(
                model=model, prompt=name, max_tokens=max_tokens, stream=True,
                extra_body={"ignore_eos": True, "priority": priority})
            if waits:
                sent.wait(60)
            for _ in stream:
                pass
            finished.append(name)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    threads = [send("running", LONG_TOKENS, 0, waits=False)]
    deadline = time.monotonic() + 60
    while server.metrics()["vllm:num_requests_running"] != 1:
        assert time.monotonic() < deadline, "the first request did not run within 60 s"
        time.sleep(0.02)
    pid = server.engine_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        threads += [send("later", LONG_TOKENS, 5, waits=True),
                    send("sooner", WAITING_TOKENS, -1, waits=True)]
        sent.wait(60)
        assert finished == [], "the first request ended before the others queued behind it"
    finally:
        os.kill(pid, signal.SIGCONT)
    for thread in threads:
        thread.join(timeout=120)
    assert finished == ["running", "sooner", "later"]

"""Bad requests get OpenAI-shaped errors with the documented status, and the server stays
healthy: a normal request right after each one succeeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import TinyModel, start_tiny_server
from .server import API_KEY, Server

OK_COMPLETION = {"prompt": "hello", "max_tokens": 2}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]

# (id, path, body, status, param the error names or None, text its message contains)
CASES: list[tuple[str, str, Any, int, str | None, str]] = [
    ("malformed-json", COMPLETIONS, b'{"prompt": "hi", ', 400, None, "not valid JSON"),
    ("not-an-object", COMPLETIONS, b'["hi"]', 400, None, "JSON object"),
    ("missing-prompt", COMPLETIONS, {"max_tokens": 2}, 400, "prompt", "required"),
    ("prompt-wrong-type", COMPLETIONS, {"prompt": 5}, 400, "prompt", "valid"),
    ("max-tokens-wrong-type", COMPLETIONS, {"prompt": "hi", "max_tokens": "ten"}, 400,
     "max_tokens", "integer"),
    ("temperature-negative", COMPLETIONS, {"prompt": "hi", "temperature": -1}, 400,
     "temperature", "greater than or equal to 0"),
    ("top-p-above-1", COMPLETIONS, {"prompt": "hi", "top_p": 1.5}, 400, "top_p", "1"),
    ("n-zero", COMPLETIONS, {"prompt": "hi", "n": 0}, 400, "n", "greater than or equal to 1"),
    ("logprobs-too-many", COMPLETIONS, {"prompt": "hi", "logprobs": 21}, 400, "logprobs",
     "less than or equal to 20"),
    ("presence-penalty-range", COMPLETIONS, {"prompt": "hi", "presence_penalty": 3}, 400,
     "presence_penalty", "2"),
    ("min-tokens-above-max", COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "min_tokens": 5},
     400, None, "min_tokens"),
    ("logit-bias-outside-vocab", COMPLETIONS, {"prompt": "hi", "logit_bias": {"99999": 1}},
     400, "logit_bias", "outside the vocabulary"),
    ("logit-bias-value-range", COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": 500}}, 400,
     None, "[-100, 100]"),
    ("prompt-ids-outside-vocab", COMPLETIONS, {"prompt": [1, 2, 99999]}, 400, None,
     "outside the vocabulary"),
    ("empty-prompt", COMPLETIONS, {"prompt": ""}, 400, None, "empty"),
    ("beyond-context", COMPLETIONS, {"prompt": "hi", "max_tokens": 100000}, 400, None,
     "exceeds the context length 512"),
    ("prompt-beyond-context", COMPLETIONS, {"prompt": [7] * 600, "max_tokens": 1}, 400, None,
     "max_model_len is 512"),
    ("unsupported-field", COMPLETIONS, {"prompt": "hi", "logprobz": 2}, 400, None,
     "unsupported field 'logprobz'"),
    ("best-of-above-n", COMPLETIONS, {"prompt": "hi", "best_of": 2}, 400, None,
     "best_of is not supported (as in vLLM V1)"),
    ("beam-search", COMPLETIONS, {"prompt": "hi", "use_beam_search": True}, 400, None,
     "use_beam_search: beam search is not supported"),
    ("logits-processors", CHAT, {"messages": USER, "logits_processors": ["m.P"]}, 400, None,
     "custom logits processors are not supported"),
    ("suffix", COMPLETIONS, {"prompt": "hi", "suffix": "x"}, 400, None, "suffix is not supported"),
    ("prompt-logprobs-stream", COMPLETIONS, {"prompt": "hi", "prompt_logprobs": 1,
                                             "stream": True}, 400, None,
     "prompt_logprobs are not available when stream is true"),
    ("allowed-token-ids-outside-vocab", COMPLETIONS,
     {"prompt": "hi", "allowed_token_ids": [1, 99999]}, 400, None,
     "allowed_token_ids has token ids outside the vocabulary"),
    ("allowed-token-ids-empty", COMPLETIONS, {"prompt": "hi", "allowed_token_ids": []}, 400,
     "allowed_token_ids", "at least 1"),
    ("stop-token-ids-outside-vocab", COMPLETIONS,
     {"prompt": "hi", "stop_token_ids": [99999]}, 400, None, "stop_token_ids has token ids"),
    ("truncate-zero", COMPLETIONS, {"prompt": "hi", "truncate_prompt_tokens": 0}, 400, None,
     "truncate_prompt_tokens must be -1 or at least 1"),
    ("chat-continue-and-generation-prompt", CHAT,
     {"messages": USER, "continue_final_message": True}, 400, None,
     "continue_final_message and add_generation_prompt cannot both be true"),
    ("chat-request-template-untrusted", CHAT, {"messages": USER, "chat_template": "{{ 1 }}"},
     400, "chat_template", "--trust-request-chat-template"),
    ("chat-template-kwargs-reserved", CHAT,
     {"messages": USER, "chat_template_kwargs": {"tokenize": True}}, 400,
     "chat_template_kwargs", "may not set tokenize"),
    ("structured-outputs-two", COMPLETIONS,
     {"prompt": "hi", "structured_outputs": {"regex": "a", "choice": ["a"]}}, 400, None,
     "exactly one of"),
    ("stream-options-without-stream", COMPLETIONS,
     {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, None, "stream"),
    ("unknown-model", COMPLETIONS, {"prompt": "hi", "model": "gpt-4"}, 404, "model",
     "does not exist"),
    ("chat-no-messages", CHAT, {"messages": []}, 400, "messages", "at least 1"),
    ("chat-bad-role", CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages.0.role", "user"),
    ("chat-top-logprobs-alone", CHAT, {"messages": USER, "top_logprobs": 2}, 400, None,
     "logprobs"),
    ("chat-tool-without-function", CHAT, {"messages": USER, "tools": [{"type": "function"}]},
     400, "tools.0.function", "required"),
    ("chat-tools-auto", CHAT, {"messages": USER, "tools": [
        {"type": "function", "function": {"name": "f"}}]}, 400, "tool_choice",
     "needs the server started with --enable-auto-tool-choice"),
    ("chat-unknown-model", CHAT, {"messages": USER, "model": "nope"}, 404, "model",
     "does not exist"),
    ("chat-beyond-context", CHAT, {"messages": USER, "max_completion_tokens": 5000}, 400,
     None, "exceeds the context length"),
    # Values that once passed the front end and killed the engine core: each is now refused
    # in the front end, and the engine lives on.
    ("top-k-past-int64", COMPLETIONS, {"prompt": "hi", "top_k": 2**63}, 400, None,
     "top_k must be between -1 and 9223372036854775807"),
    ("top-k-past-uint64", COMPLETIONS, {"prompt": "hi", "top_k": 2**64}, 400, None, "top_k"),
    ("chat-min-tokens-past-room", CHAT, {"messages": USER, "min_tokens": 10**9}, 400, None,
     "min_tokens (1000000000) must not exceed max_tokens"),
    ("completion-min-tokens-past-room", COMPLETIONS,
     {"prompt": "hi", "max_tokens": None, "min_tokens": 8500}, 400, None, "min_tokens"),
    ("stop-lone-surrogate", COMPLETIONS, {"prompt": "hi", "stop": ["\ud800"]}, 400, None,
     "not valid Unicode text"),
    ("choice-lone-surrogate", COMPLETIONS, {"prompt": "hi", "guided_choice": ["a\ud800"]},
     400, None, "not valid Unicode text"),
    ("prompt-lone-surrogate", COMPLETIONS, {"prompt": "hi \ud800"}, 400, None,
     "the prompt is not valid Unicode text"),
    ("chat-lone-surrogate", CHAT, {"messages": [{"role": "user", "content": "hi \ud800"}]},
     400, "messages", "not valid Unicode text"),
    ("priority-past-int64", COMPLETIONS, {"prompt": "hi", "priority": 2**64}, 400, None,
     "priority must be between"),
    ("seed-past-int64", COMPLETIONS, {"prompt": "hi", "seed": 2**64 - 1, "n": 2}, 400, None,
     "seed must be between"),
    ("logit-bias-nan", COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": float("nan")}}, 400,
     None, "logit_bias"),
    ("repetition-penalty-inf", COMPLETIONS, b'{"prompt": "hi", "repetition_penalty": Infinity}',
     400, None, "repetition_penalty must be a finite number"),
    ("presence-penalty-nan", COMPLETIONS, b'{"prompt": "hi", "presence_penalty": NaN}', 400,
     "presence_penalty", "presence_penalty"),
    ("600k-stop-strings", COMPLETIONS,  # 6.6 MB, the probe's: it stalled /health 6-7 s
     {"prompt": "hi", "stop": [f"s{i}" for i in range(600_000)]}, 400, None,
     "stop holds 600000 strings; at most 1024"),
    ("stop-strings-too-long", COMPLETIONS, {"prompt": "hi", "stop": ["s" * 20_000] * 2}, 400,
     None, "stop strings hold 40000 characters together; at most 32768"),
    ("tokenize-lone-surrogate", "/tokenize", {"prompt": "hi \ud800"}, 400, "prompt",
     "prompt is not valid Unicode text"),
    ("tokenize-neither", "/tokenize", {"model": None}, 400, None, "prompt or messages"),
    ("detokenize-outside-vocab", "/detokenize", {"tokens": [99999]}, 400, "tokens",
     "outside the vocabulary"),
]


@pytest.mark.parametrize(("path", "body", "status", "param", "text"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_request_then_a_good_one(tiny_server: Server, tiny_model: TinyModel, path: str,
                                     body: Any, status: int, param: str | None,
                                     text: str) -> None:
    got, _, payload = tiny_server.request("POST", path, body, api_key=API_KEY)
    assert got == status, payload
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}, payload
    assert error["type"] == "invalid_request_error" and error["param"] == param, payload
    assert text in error["message"], payload
    ok, _, answer = tiny_server.request("POST", COMPLETIONS,
                                        {**OK_COMPLETION, "model": str(tiny_model.folder)},
                                        api_key=API_KEY)
    assert ok == 200 and answer["usage"]["completion_tokens"] >= 1, answer


# Odd but valid values that reach the kernels (a subnormal top_p was flushed to 0
# by fast-math kernels and killed the engine): each is served, and the engine lives on.
ODD_BUT_VALID = [{"top_p": 1e-310, "temperature": 1.0}, {"top_p": 5e-324},
                 {"repetition_penalty": 1e300}, {"repetition_penalty": 1e-300},
                 {"temperature": 1e-300}, {"min_p": 5e-324, "temperature": 1.0},
                 {"logit_bias": {"5": 100, "6": -100}}]


@pytest.mark.parametrize("extra", ODD_BUT_VALID, ids=[str(e) for e in ODD_BUT_VALID])
def test_odd_but_valid_values_are_served(tiny_server: Server, extra: dict[str, Any]) -> None:
    body = {**OK_COMPLETION, "max_tokens": 4, "ignore_eos": True, **extra}
    got, _, payload = tiny_server.request("POST", COMPLETIONS, body, api_key=API_KEY)
    assert got == 200 and payload["usage"]["completion_tokens"] == 4, payload
    assert tiny_server.request("GET", "/health")[0] == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-key"},
                                     {"Authorization": f"Basic {API_KEY}"}],
                         ids=["no-key", "wrong-key", "wrong-scheme"])
def test_api_key_is_required(tiny_server: Server, headers: dict[str, str]) -> None:
    for method, path, body in (("POST", COMPLETIONS, OK_COMPLETION), ("GET", "/v1/models", None),
                               ("POST", "/tokenize", {"prompt": "x"})):
        status, _, payload = tiny_server.request(method, path, body, headers=headers)
        assert status == 401, (path, payload)
        assert payload["error"]["code"] == "invalid_api_key"
    for open_path in ("/health", "/version", "/metrics"):  # probes and scrapers need no key
        assert tiny_server.request("GET", open_path, headers=headers)[0] == 200


def test_unknown_route_is_404_in_openai_shape(tiny_server: Server) -> None:
    status, _, payload = tiny_server.request("GET", "/v1/nothing", api_key=API_KEY)
    assert status == 404 and payload["error"]["message"] == "Not Found"


def test_refused_requests_leave_nothing_waiting(tiny_model: TinyModel,
                                                tmp_path: Path) -> None:
    """Requests that failed after registration leaked their state, and
    with --max-waiting-requests N, N of them made the server answer 503 to everyone."""
    server = start_tiny_server(tiny_model, tmp_path, "--max-waiting-requests", "2")
    try:
        server.wait_ready(timeout=180)
        bad_bodies = [{"prompt": "hi", "stop": ["\ud800"]}, {"prompt": "hi", "top_k": 2**64},
                      {"prompt": "hi", "priority": 2**64},
                      {"prompt": "hi", "guided_choice": ["\ud800"]}] * 2
        for body in bad_bodies:
            assert server.request("POST", COMPLETIONS, body)[0] == 400, body
        status, _, answer = server.request("POST", COMPLETIONS, OK_COMPLETION)
        assert status == 200, answer
        assert server.metrics()["vllm:num_requests_waiting"] == 0
    finally:
        server.stop()

"""``ServerSettings``: what ``octavo serve`` configures beyond the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str = DEFAULT_MODEL_NAME  # what clients pass as ``model``
    # (name, folder) of the LoRA adapters served from the start (--lora-modules); a
    # request's ``model`` picks one by name.
    lora_modules: tuple[tuple[str, str], ...] = ()
    api_key: str | None = None  # None: no authentication
    # Web-origin safety (see web_safety.py). Host names the server answers for (any port;
    # "*": all); None: the loopback names when bound to a loopback address, else all.
    allowed_hosts: tuple[str, ...] | None = None
    allowed_origins: tuple[str, ...] = ()  # CORS origins ("*": any); empty: CORS off
    allowed_methods: tuple[str, ...] = ("*",)  # with allowed_origins
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    disable_docs: bool = False  # no /docs, /redoc, /openapi.json
    disable_playground: bool = False  # no web page at / and /playground
    # Fair admission (see admission.py). Sequences (prompts x n) accepted but not yet
    # producing tokens beyond which new requests get 503 with Retry-After (None: no cap),
    # so overload shows up as a quick answer, not a timeout.
    max_waiting_requests: int | None = None
    max_sequences_per_request: int = 4096  # a request creating more gets 400
    request_sequence_window: int = 64  # sequences of one request in the engine at once
    retry_after_s: int = 1
    # Limits on what one client can hold (see http_guard.py and body_limit.py).
    max_request_body_size: int = 8 * 1024 * 1024  # bytes; larger bodies get 413
    # Bytes of request bodies processed at once, beyond which 503 with Retry-After (see
    # body_budget.py); None: sized to the machine's memory.
    max_inflight_body_size: int | None = None
    body_timeout_s: float = 30.0  # to receive a request's body, else 408
    header_timeout_s: float = 10.0  # to receive a request's head, else the connection closes
    max_connections: int | None = None  # None: what the descriptor limit allows
    # After SIGTERM, seconds running requests get to finish before they end with an error.
    shutdown_timeout_s: float = 30.0
    restart_engine: bool = False  # on engine death: restart it (True) or exit non-zero
    # An engine with work and no finished step for this long is stalled (see stall.py;
    # 0: never); "keep" its requests waiting for it, or "fail" them.
    engine_stall_timeout: float = 300.0
    engine_stall_action: Literal["keep", "fail"] = "keep"
    # Chat (see chat_template.py, tool_calls.py, reasoning_parsers.py; vLLM's flags).
    chat_template: str | None = None  # the template text (--chat-template, read at start)
    trust_request_chat_template: bool = False  # requests may bring their own template
    enable_auto_tool_choice: bool = False  # tool_choice "auto" reads and constrains calls
    tool_call_parser: str | None = None  # the format of the model's tool calls
    reasoning_parser: str | None = None  # splits <think>...</think> off as reasoning
    max_stored_responses: int = 1000  # /v1/responses kept for previous_response_id

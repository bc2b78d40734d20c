"""``ServerSettings``: what ``octavo serve`` configures beyond the engine."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str = DEFAULT_MODEL_NAME  # what clients pass as ``model``
    api_key: str | None = None  # None: no authentication
    # Requests accepted but not yet producing tokens beyond which new ones get 503 with
    # Retry-After (None: no cap), so overload shows up as a quick answer, not a timeout.
    max_waiting_requests: int | None = None
    retry_after_s: int = 1

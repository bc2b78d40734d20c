"""Shortest prompt first: admits short requests ahead of long ones, which lowers the mean
time to first token when prompts vary a lot (at the risk of starving long prompts)."""

from __future__ import annotations

from typing import Any

from octavo.plugin_api import Request, SchedulingPolicy


class ShortestPromptFirst(SchedulingPolicy):
    name = "shortest-prompt-first"

    def sort_key(self, request: Request) -> tuple[Any, ...]:
        return (request.num_prompt_tokens, request.arrival_time, request.request_id)

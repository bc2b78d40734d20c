"""``Processor``: turns user input into engine requests - tokenize, validate, fan out n.

Everything a user can get wrong is caught here with a message naming the field, before
anything reaches the engine core.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from octavo.request import Request
from octavo.sampling_params import (
    SamplingParams,
    StructuredOutputsParams,
    check_int,
    check_text,
)

# A prompt: text, token ids, or vLLM's dict forms {"prompt": str} / {"prompt_token_ids": [...]}.
PromptType = str | list[int] | dict[str, Any]


class InvalidRequestError(ValueError):
    """The request cannot be served as asked; the message says which field and why."""


@dataclass
class ProcessedPrompt:
    prompt: str | None
    prompt_token_ids: list[int]


class Processor:
    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int,
                 eos_token_id: int | None) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def process_prompt(self, prompt: PromptType) -> ProcessedPrompt:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return self._token_prompt(list(prompt["prompt_token_ids"]))
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise InvalidRequestError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("the prompt is empty")
            try:
                check_text("the prompt", prompt)
            except ValueError as exc:
                raise InvalidRequestError(str(exc)) from None
            ids = self.tokenizer.encode(prompt)
            if not ids:
                raise InvalidRequestError("the prompt has no tokens once tokenized (the "
                                          "tokenizer drops every character of it)")
            return ProcessedPrompt(prompt, ids)
        if isinstance(prompt, list):
            return self._token_prompt(prompt)
        raise InvalidRequestError(f"a prompt must be a string or a list of token ids, "
                                  f"not {type(prompt).__name__}")

    def _token_prompt(self, ids: list[int]) -> ProcessedPrompt:
        if not ids:
            raise InvalidRequestError("the prompt has no tokens")
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"prompt token ids outside the vocabulary "
                                      f"[0, {self.vocab_size}): {bad[:5]}")
        return ProcessedPrompt(None, ids)

    def make_requests(self, request_id: str, prompt: ProcessedPrompt, params: SamplingParams,
                      priority: int = 0, strict_length: bool = False,
                      arrival_time: float | None = None) -> list[Request]:
        """One engine request per sample (``n``); children of n>1 are ``{id}_{i}``. They
        arrived at ``arrival_time`` (``time.monotonic()``; default: now)."""
        num_prompt = len(prompt.prompt_token_ids)
        if num_prompt >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {num_prompt} tokens; max_model_len is {self.max_model_len}, "
                "which leaves no room to generate")
        room = self.max_model_len - num_prompt
        params = replace(params)  # a private copy: the engine fills in fields below
        if params.max_tokens is None:
            params.max_tokens = room
        elif strict_length and params.max_tokens > room:
            raise InvalidRequestError(
                f"prompt ({num_prompt} tokens) plus max_tokens ({params.max_tokens}) exceeds "
                f"the context length {self.max_model_len}")
        try:
            params.update_from_tokenizer(self.tokenizer)
            # Again, with every default filled in: the engine gets exactly what was checked
            # (min_tokens against a max_tokens the context decided, say).
            params.validate()
            check_int("priority", priority)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        from octavo.sample.metadata import check_token_ids  # torch: not before spawning

        if params.structured_outputs is not None:
            check_structured(params.structured_outputs)
        try:
            check_token_ids(0, params, self.vocab_size)
        except ValueError as exc:
            raise InvalidRequestError(str(exc).removeprefix("row 0: ")) from None
        arrival = time.monotonic() if arrival_time is None else arrival_time
        if params.n == 1:
            return [self._request(request_id, prompt, params, priority, arrival)]
        children = []
        for index in range(params.n):
            seed = None if params.seed is None else params.seed + index
            child = replace(params, n=1, seed=seed)
            children.append(self._request(f"{request_id}_{index}", prompt, child, priority,
                                          arrival))
        return children

    def _request(self, request_id: str, prompt: ProcessedPrompt, params: SamplingParams,
                 priority: int, arrival: float) -> Request:
        return Request(request_id=request_id, prompt_token_ids=list(prompt.prompt_token_ids),
                       sampling_params=params, arrival_time=arrival, priority=priority,
                       eos_token_id=self.eos_token_id)


def check_structured(params: StructuredOutputsParams) -> None:
    """Reject a malformed schema, regex or grammar here, before it reaches the engine core."""
    from octavo.structured.grammar import validate  # imports xgrammar: only when needed

    try:
        validate(params)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None

"""``Processor``: turns user input into engine requests - tokenize, validate, fan out n.

Everything a user can get wrong is caught here with a message naming the field, before
anything reaches the engine core.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from octavo.config import PoolerConfig
from octavo.engine.errors import InvalidRequestError
from octavo.platforms import Platform
from octavo.pooling_params import PoolingParams, check_dimensions
from octavo.request import Request
from octavo.sampling_params import (
    SamplingParams,
    StructuredOutputsParams,
    check_int,
    check_text,
)

if TYPE_CHECKING:
    import numpy as np

# A prompt: text, token ids, or vLLM's dict forms {"prompt": str} / {"prompt_token_ids": [...]}
# / {"prompt_embeds": tensor} (with enable_prompt_embeds); a dict may carry a "cache_salt" (str).
PromptType = str | list[int] | dict[str, Any]


@dataclass
class ProcessedPrompt:
    prompt: str | None
    prompt_token_ids: list[int]
    # float32 [len(prompt_token_ids), hidden]; the ids are then placeholders (zeros).
    prompt_embeds: np.ndarray | None = None
    # Mixed into the prefix-cache block hashes: only requests with the same salt share
    # cached blocks (vLLM's cache_salt, e.g. one per tenant).
    cache_salt: str | None = None


class Processor:
    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int,
                 eos_token_id: int | None, hidden_size: int | None = None,
                 enable_prompt_embeds: bool = False, extra_eos_token_ids: Sequence[int] = (),
                 default_max_tokens: int | None = None,
                 platform: type[Platform] | None = None, pooler: PoolerConfig | None = None,
                 hf_config: dict[str, Any] | None = None) -> None:
        """``hidden_size``: the width prompt embeddings must have (with
        ``enable_prompt_embeds``; without it they are refused). ``extra_eos_token_ids``:
        the model's EOS ids besides ``eos_token_id``; as in vLLM they join a request's
        ``stop_token_ids`` unless it ignores EOS (so they report themselves as its stop
        reason; ``eos_token_id`` reports none). ``default_max_tokens``: the model's
        ``max_new_tokens``, the most a request with ``max_tokens=None`` generates.
        ``platform``: the engine's, whose ``validate_request`` refuses here what its
        worker cannot run (None: the front end does not know it; nothing is refused).
        ``pooler``: a pooling engine's settled pooler config (None: a generation engine;
        each refuses the other's requests); ``hf_config``: the model's, whose Matryoshka
        sizes a request's ``dimensions`` must be one of."""
        self.platform = platform
        self.pooler = pooler
        self.hf_config = hf_config or {}
        self.extra_eos_token_ids = [t for t in extra_eos_token_ids if t != eos_token_id]
        self.default_max_tokens = default_max_tokens
        self.hidden_size = hidden_size
        self.enable_prompt_embeds = enable_prompt_embeds
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def process_prompt(self, prompt: PromptType) -> ProcessedPrompt:
        if isinstance(prompt, dict):
            salt = _cache_salt(prompt)
            return replace(self._process_prompt(prompt), cache_salt=salt)
        return self._process_prompt(prompt)

    def _process_prompt(self, prompt: PromptType) -> ProcessedPrompt:
        if isinstance(prompt, dict):
            if "prompt_embeds" in prompt:
                return self._embeds_prompt(prompt["prompt_embeds"])
            if "prompt_token_ids" in prompt:
                return self._token_prompt(list(prompt["prompt_token_ids"]))
            if "prompt" not in prompt:
                raise InvalidRequestError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
            return self._text_prompt(prompt["prompt"], prompt.get("add_special_tokens", True))
        if isinstance(prompt, str):
            return self._text_prompt(prompt)
        if isinstance(prompt, list):
            return self._token_prompt(prompt)
        raise InvalidRequestError(f"a prompt must be a string or a list of token ids, "
                                  f"not {type(prompt).__name__}")

    def _text_prompt(self, prompt: Any, add_special_tokens: bool = True) -> ProcessedPrompt:
        """``add_special_tokens``: the tokenizer's BOS and the like (vLLM's prompt dict key;
        a rendered chat template already holds them)."""
        if not isinstance(prompt, str):
            raise InvalidRequestError(f"a prompt must be a string or a list of token ids, "
                                      f"not {type(prompt).__name__}")
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        try:
            check_text("the prompt", prompt)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        ids = self.tokenizer.encode(prompt, add_special_tokens=bool(add_special_tokens))
        if not ids:
            raise InvalidRequestError("the prompt has no tokens once tokenized (the "
                                      "tokenizer drops every character of it)")
        return ProcessedPrompt(prompt, ids)

    def _token_prompt(self, ids: list[int]) -> ProcessedPrompt:
        if not ids:
            raise InvalidRequestError("the prompt has no tokens")
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"prompt token ids outside the vocabulary "
                                      f"[0, {self.vocab_size}): {bad[:5]}")
        return ProcessedPrompt(None, ids)

    def _embeds_prompt(self, value: Any) -> ProcessedPrompt:
        if not self.enable_prompt_embeds or self.hidden_size is None:
            raise InvalidRequestError("prompt_embeds needs the engine started with "
                                      "--enable-prompt-embeds (LLM(enable_prompt_embeds=True))")
        from octavo.engine.prompt_embeds import check_prompt_embeds

        try:
            embeds = check_prompt_embeds(value, self.hidden_size)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        if len(embeds) >= self.max_model_len:
            raise InvalidRequestError(
                f"prompt_embeds has {len(embeds)} rows; max_model_len is {self.max_model_len}, "
                "which leaves no room to generate")
        return ProcessedPrompt("", [0] * len(embeds), embeds)

    def make_requests(self, request_id: str, prompt: ProcessedPrompt,
                      params: SamplingParams | PoolingParams, priority: int = 0,
                      strict_length: bool = False,
                      arrival_time: float | None = None) -> list[Request]:
        """One engine request per sample (``n``); children of n>1 are ``{id}_{i}``. They
        arrived at ``arrival_time`` (``time.monotonic()``; default: now). ``PoolingParams``
        make one pooling request (vLLM's ``add_request`` takes either kind)."""
        if isinstance(params, PoolingParams):
            return [self._pooling_request(request_id, prompt, params, priority, arrival_time)]
        self.check_generation()
        prompt = self._truncated(prompt, params.truncate_prompt_tokens)
        num_prompt = len(prompt.prompt_token_ids)
        if num_prompt >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {num_prompt} tokens; max_model_len is {self.max_model_len}, "
                "which leaves no room to generate")
        room = self.max_model_len - num_prompt
        params = replace(params)  # a private copy: the engine fills in fields below
        if params.max_tokens is None:
            params.max_tokens = min(room, self.default_max_tokens or room)
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
        if prompt.prompt_embeds is not None and params.prompt_logprobs is not None:
            raise InvalidRequestError("prompt_logprobs is not available with prompt_embeds: "
                                      "the prompt has no token ids to score")
        try:
            check_token_ids(0, params, self.vocab_size)
        except ValueError as exc:
            raise InvalidRequestError(str(exc).removeprefix("row 0: ")) from None
        if not params.ignore_eos and self.extra_eos_token_ids:
            params.stop_token_ids = list(dict.fromkeys([*params.stop_token_ids,
                                                        *self.extra_eos_token_ids]))
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

    def check_generation(self) -> None:
        """Refuse generation on a pooling engine (the server asks before the chat template)."""
        if self.pooler is not None:
            raise InvalidRequestError("this model is served by the pooling runner (--runner "
                                      "pooling): it computes embeddings (/v1/embeddings, "
                                      "LLM.embed), not text")

    def _pooling_request(self, request_id: str, prompt: ProcessedPrompt,
                             params: PoolingParams, priority: int = 0,
                             arrival_time: float | None = None) -> Request:
        """A pooling request, its unset ``params`` filled from the model's pooler config.
        The prompt is computed whole (an encoder never splits it), so it may be at most
        ``max_model_len`` tokens: a longer one is refused, never cut."""
        if self.pooler is None:
            raise InvalidRequestError("this model is served for text generation; embeddings "
                                      "need the pooling runner (--runner pooling)")
        num_prompt = len(prompt.prompt_token_ids)
        if num_prompt > self.max_model_len:
            raise InvalidRequestError(f"the prompt has {num_prompt} tokens; this model takes at "
                                      f"most {self.max_model_len} (max_model_len)")
        try:
            if params.dimensions is not None:
                check_dimensions(params.dimensions, self.hf_config)
            check_int("priority", priority)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        use_activation = params.use_activation
        settled = PoolingParams(
            dimensions=params.dimensions or self.pooler.dimensions,
            use_activation=(self.pooler.use_activation if use_activation is None
                            else use_activation))
        arrival = time.monotonic() if arrival_time is None else arrival_time
        return self._check_platform(Request(
            request_id=request_id, prompt_token_ids=list(prompt.prompt_token_ids),
            sampling_params=SamplingParams(), arrival_time=arrival, priority=priority,
            cache_salt=prompt.cache_salt, pooling_params=settled))

    def _truncated(self, prompt: ProcessedPrompt, keep: int | None) -> ProcessedPrompt:
        """The prompt's last ``keep`` tokens (vLLM's ``truncate_prompt_tokens``; -1: as many
        as leave room for one token). The text is dropped: it no longer matches the ids."""
        if keep is None:
            return prompt
        if keep == -1:
            keep = self.max_model_len - 1
        if len(prompt.prompt_token_ids) <= keep:
            return prompt
        if prompt.prompt_embeds is not None:
            raise InvalidRequestError("truncate_prompt_tokens is not available with "
                                      "prompt_embeds")
        return replace(prompt, prompt=None, prompt_token_ids=prompt.prompt_token_ids[-keep:])

    def _request(self, request_id: str, prompt: ProcessedPrompt, params: SamplingParams,
                 priority: int, arrival: float) -> Request:
        request = Request(request_id=request_id, prompt_token_ids=list(prompt.prompt_token_ids),
                          sampling_params=params, arrival_time=arrival, priority=priority,
                          eos_token_id=self.eos_token_id, prompt_embeds=prompt.prompt_embeds,
                          cache_salt=prompt.cache_salt)
        return self._check_platform(request)

    def _check_platform(self, request: Request) -> Request:
        """``request``, unless the engine's platform refuses it (``InvalidRequestError``)."""
        if self.platform is not None:
            try:
                self.platform.validate_request(request)
            except ValueError as exc:
                raise InvalidRequestError(str(exc)) from None
        return request


def _cache_salt(prompt: dict[str, Any]) -> str | None:
    """A prompt dict's ``cache_salt``: a non-empty string, or absent (None). Accepted with
    prefix caching off too, as vLLM does: it then changes nothing."""
    salt = prompt.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise InvalidRequestError(f"cache_salt must be a non-empty string, got {salt!r}")
    try:
        check_text("cache_salt", salt)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    return salt


def check_structured(params: StructuredOutputsParams) -> None:
    """Reject a malformed schema, regex or grammar here, before it reaches the engine core."""
    from octavo.structured.grammar import validate  # imports xgrammar: only when needed

    try:
        validate(params)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None

"""The completions endpoint's ``prompt_embeds``: base64 of a safetensors file holding one
tensor ``[num_tokens, hidden_size]`` (float32, float16 or bfloat16).

vLLM takes base64 of ``torch.save`` output there, and unpickling what a client sent runs
whatever code the client put in it (CVE-2025-62164). safetensors is a JSON header plus raw
bytes: parsing it builds tensors and nothing else, so this server accepts that format
only, and a pickle (``torch.save``) payload is a 400. A client makes one with
``base64.b64encode(safetensors.torch.save({"prompt_embeds": tensor}))``.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

from octavo.entrypoints.openai.errors import OpenAIError

if TYPE_CHECKING:
    import torch

FORMAT = ("prompt_embeds must be base64 of a safetensors file holding one tensor "
          "(torch.save and other pickle payloads are refused)")


def encoded_prompt_embeds(prompt: object, prompt_embeds: str | list[str] | None,
                          enabled: bool) -> list[str] | None:
    """The request's encoded embeddings, one per prompt, or None when it has none; a 400
    when the server runs without ``--enable-prompt-embeds`` or a text prompt is given too
    (it must be empty: the OpenAI client insists on sending one)."""
    if prompt_embeds is None:
        return None
    if not enabled:
        raise OpenAIError(400, "prompt_embeds: this server was started without "
                               "--enable-prompt-embeds", param="prompt_embeds")
    if prompt not in ("", []):
        raise OpenAIError(400, 'prompt must be empty ("") when prompt_embeds is given',
                          param="prompt")
    encoded = [prompt_embeds] if isinstance(prompt_embeds, str) else prompt_embeds
    if not encoded:
        raise OpenAIError(400, "prompt_embeds: the list is empty", param="prompt_embeds")
    return encoded


def decode_prompt_embeds(encoded: str) -> torch.Tensor:
    """The one tensor of a base64 safetensors file (checked further by the engine's
    processor: shape, hidden size, dtype, finite values); a 400 naming the problem."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise OpenAIError(400, f"{FORMAT}: it is not valid base64",
                          param="prompt_embeds") from None
    try:
        tensors = load(data)
    except (SafetensorError, ValueError, TypeError) as exc:
        raise OpenAIError(400, f"{FORMAT}: {exc}", param="prompt_embeds") from None
    if len(tensors) != 1:
        raise OpenAIError(400, f"{FORMAT}: it holds {len(tensors)} tensors",
                          param="prompt_embeds")
    return next(iter(tensors.values()))

"""``POST /v1/embeddings``: OpenAI's embeddings endpoint, served by the pooling runner.

The request (OpenAI's fields plus vLLM's ``use_activation`` and ``priority``) is one
input or a batch - strings or token ids -, each an engine pooling request; the answer has
one embedding per input, in input order, as floats or as base64 of little-endian float32
(what OpenAI's client decodes; it asks for base64 by default), and the prompt tokens in
``usage``. ``dimensions`` shortens a Matryoshka model's embeddings (other models refuse
it, 400). An input longer than the model's ``max_model_len`` is refused (400), never
truncated; so is the endpoint itself on a server that generates text, and the generation
endpoints on a pooling server (the engine's ``Processor`` says which runner serves what).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Awaitable, Callable
from typing import Literal

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from octavo.engine.async_llm import AsyncLLM
from octavo.engine.processor import PromptType
from octavo.entrypoints.openai.errors import OpenAIError
from octavo.entrypoints.openai.openapi_doc import BODY_ROUTE, errors, ok_json
from octavo.entrypoints.openai.protocol import OpenAIRequest
from octavo.entrypoints.openai.serving_engine import (
    OpenAIServing,
    final_outputs,
    unless_disconnected,
)
from octavo.entrypoints.openai.settings import ServerSettings
from octavo.entrypoints.openai.web_safety import require_json
from octavo.pooling_params import PoolingParams


class EmbeddingRequest(OpenAIRequest):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None  # None: the served model
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None  # an end-user id for the caller's records; not used here
    # Extensions (vLLM's names).
    use_activation: bool | None = None  # normalise; None: the model's setting
    priority: int = 0  # lower is served first (with --scheduling-policy priority)


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # floats, or base64 of little-endian float32


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage


class OpenAIServingEmbedding(OpenAIServing):
    async def create(self, request: EmbeddingRequest, raw: Request) -> Response:
        self.check_model(request.model)
        prompts = input_list(request.input)
        self.check_capacity(len(prompts))
        params = PoolingParams(dimensions=request.dimensions,
                               use_activation=request.use_activation)
        request_id = f"embd-{uuid.uuid4().hex}"
        streams = await self.start(request_id, prompts, params, request.priority)
        outputs = await unless_disconnected(raw, final_outputs(streams))
        if outputs is None:
            return Response(status_code=499)  # nobody is listening
        data = [EmbeddingData(index=i, embedding=encoded(out.outputs.embedding,
                                                         request.encoding_format))
                for i, out in enumerate(outputs)]
        tokens = sum(len(out.prompt_token_ids) for out in outputs)
        body = EmbeddingResponse(id=request_id, model=self.model_name, data=data,
                                 usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))
        return JSONResponse(body.model_dump())


def input_list(given: str | list[str] | list[int] | list[list[int]]) -> list[PromptType]:
    """The ``input`` field as engine prompts: text, or token ids."""
    if isinstance(given, str):
        return [given]
    if not given:
        raise OpenAIError(400, "input: the input list is empty", param="input")
    if isinstance(given[0], int):
        return [{"prompt_token_ids": given}]
    return [item if isinstance(item, str) else {"prompt_token_ids": item} for item in given]


def encoded(embedding: list[float], encoding_format: str) -> list[float] | str:
    """The embedding as floats, or as base64 of its little-endian float32 bytes."""
    if encoding_format == "float":
        return embedding
    array = np.asarray(embedding, dtype="<f4")
    return base64.b64encode(array.tobytes()).decode("ascii")


def generation_only(engine: AsyncLLM) -> Callable[[], Awaitable[None]]:
    """A dependency of the generation routes: a 400 naming the pooling runner on a pooling
    server, before any work (a chat template the model may not even have)."""
    async def check() -> None:
        engine.processor.check_generation()

    return check


def embeddings_router(engine: AsyncLLM, settings: ServerSettings) -> APIRouter:
    router = APIRouter()
    serving = OpenAIServingEmbedding(engine, settings)

    @router.post("/v1/embeddings", dependencies=[Depends(require_json)], responses={
        **ok_json(EmbeddingResponse), **errors(*BODY_ROUTE, 404)})
    async def create_embedding(request: EmbeddingRequest, raw: Request) -> Response:
        return await serving.create(request, raw)

    return router



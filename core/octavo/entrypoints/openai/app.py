"""The FastAPI app: OpenAI's endpoints plus health, version, metrics and tokenizer routes.

``/health``, ``/version`` and ``/metrics`` are open (for probes and scrapers); with an API
key, every other route needs ``Authorization: Bearer KEY``.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from octavo.engine.async_llm import AsyncLLM
from octavo.entrypoints.openai.errors import OpenAIError, install_error_handlers
from octavo.entrypoints.openai.metrics import PrometheusMetrics
from octavo.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from octavo.entrypoints.openai.serving_chat import OpenAIServingChat, apply_chat_template
from octavo.entrypoints.openai.serving_completion import OpenAIServingCompletion
from octavo.entrypoints.openai.serving_engine import OpenAIServing
from octavo.entrypoints.openai.settings import ServerSettings
from octavo.version import __version__


def build_app(engine: AsyncLLM, settings: ServerSettings) -> FastAPI:
    """The app serving ``engine``; shutting the app down shuts the engine down."""
    metrics = PrometheusMetrics(settings.served_model_name)
    engine.stat_loggers.append(metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.shutdown()

    app = FastAPI(title="Octavo", version=__version__, lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(_open_routes(engine, metrics))
    app.include_router(_protected_routes(engine, settings),
                       dependencies=[Depends(_api_key_check(settings.api_key))])
    return app


def _api_key_check(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    async def check(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(),
                                                                    api_key.encode()):
            raise OpenAIError(401, "Incorrect or missing API key: send the header "
                                   "'Authorization: Bearer <key>'", code="invalid_api_key")

    return check


def _open_routes(engine: AsyncLLM, metrics: PrometheusMetrics) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        engine.check_health()  # EngineDeadError -> 503
        return Response(status_code=200)

    @router.get("/version")
    async def version() -> dict[str, Any]:
        ready = engine.ready
        return {"version": __version__, "engine_pid": ready.pid, "platform": ready.platform}

    @router.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router


def _protected_routes(engine: AsyncLLM, settings: ServerSettings) -> APIRouter:
    router = APIRouter()
    completions = OpenAIServingCompletion(engine, settings)
    chat = OpenAIServingChat(engine, settings)
    common = OpenAIServing(engine, settings)

    @router.get("/v1/models")
    async def models() -> JSONResponse:
        card = ModelCard(id=settings.served_model_name, root=engine.ready.model,
                         max_model_len=engine.max_model_len)
        return JSONResponse(ModelList(data=[card]).model_dump())

    @router.post("/v1/completions")
    async def create_completion(request: CompletionRequest, raw: Request) -> Response:
        return await completions.create(request, raw)

    @router.post("/v1/chat/completions")
    async def create_chat_completion(request: ChatCompletionRequest, raw: Request) -> Response:
        return await chat.create(request, raw)

    @router.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> JSONResponse:
        common.check_model(request.model)
        if request.messages is not None:
            tokens = apply_chat_template(engine.tokenizer, request.messages,
                                         request.add_generation_prompt)
        else:
            tokens = list(engine.tokenizer.encode(
                request.prompt, add_special_tokens=request.add_special_tokens))
        body = TokenizeResponse(count=len(tokens), max_model_len=engine.max_model_len,
                                tokens=tokens)
        return JSONResponse(body.model_dump())

    @router.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> JSONResponse:
        common.check_model(request.model)
        vocab_size = engine.processor.vocab_size
        outside = [t for t in request.tokens if not 0 <= t < vocab_size]
        if outside:
            raise OpenAIError(400, f"tokens: ids outside the vocabulary [0, {vocab_size}): "
                                   f"{outside[:5]}", param="tokens")
        return JSONResponse(DetokenizeResponse(
            prompt=engine.tokenizer.decode(request.tokens)).model_dump())

    @router.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        await engine.reset_prefix_cache()
        return Response(status_code=200)

    return router

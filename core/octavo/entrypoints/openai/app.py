"""The FastAPI app: OpenAI's endpoints plus health, version, metrics and tokenizer routes,
and the web playground at ``/`` (``playground``).

``/health``, ``/version`` and ``/metrics`` are open (for probes and scrapers); with an API
key, every other route needs ``Authorization: Bearer KEY``, the API documentation
(``/docs``, ``/redoc``, ``/openapi.json``) included. Every POST needs a JSON Content-Type and
the Host header is checked (``web_safety``); each route documents its answers
(``openapi_doc``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from octavo.engine.async_llm import AsyncLLM
from octavo.engine.core_client import EngineStatus
from octavo.entrypoints.openai.embeddings import embeddings_router, generation_only
from octavo.entrypoints.openai.errors import OpenAIError, install_error_handlers
from octavo.entrypoints.openai.lora_routes import lora_router, runtime_updating_allowed
from octavo.entrypoints.openai.metrics import CacheInfo, PrometheusMetrics
from octavo.entrypoints.openai.openapi_doc import (
    ANY_ROUTE,
    BODY_ROUTE,
    docs_router,
    errors,
    fix_openapi,
    ok_empty,
    ok_events,
    ok_json,
    ok_stream,
    ok_text,
)
from octavo.entrypoints.openai.playground import playground_router
from octavo.entrypoints.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    EngineHealth,
    HealthResponse,
    ModelCard,
    ModelList,
    ResetPrefixCacheRequest,
    TokenizeRequest,
    TokenizeResponse,
    VersionResponse,
)
from octavo.entrypoints.openai.responses_protocol import (
    ResponseEvent,
    ResponseObject,
    ResponsesRequest,
)
from octavo.entrypoints.openai.serving_chat import OpenAIServingChat
from octavo.entrypoints.openai.serving_completion import OpenAIServingCompletion
from octavo.entrypoints.openai.serving_engine import OpenAIServing
from octavo.entrypoints.openai.serving_responses import OpenAIServingResponses
from octavo.entrypoints.openai.settings import ServerSettings
from octavo.entrypoints.openai.stall import stall_reason
from octavo.entrypoints.openai.web_safety import install_web_safety, require_json
from octavo.outputs import SchedulerStats
from octavo.sampling_params import check_text
from octavo.version import __version__

JSON_ONLY = [Depends(require_json)]


def build_app(engine: AsyncLLM, settings: ServerSettings) -> FastAPI:
    """The app serving ``engine``; shutting the app down shuts the engine down."""
    cache = CacheInfo(engine.ready.block_size, engine.ready.num_blocks,
                      engine.ready.enable_prefix_caching)
    lora = engine.config.lora
    metrics = PrometheusMetrics(settings.served_model_name,
                                engine.config.parallel.data_parallel_size,
                                engine.max_model_len, cache,
                                lora.max_loras if lora.enable_lora else 0)
    engine.stat_loggers.append(metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.shutdown()

    # FastAPI's own documentation routes would be open to all: docs_router serves them.
    app = FastAPI(title="Octavo", version=__version__, lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    install_web_safety(app, settings)
    fix_openapi(app)
    key_check = [Depends(_api_key_check(settings.api_key))]
    app.include_router(_open_routes(engine, metrics))
    app.include_router(_protected_routes(engine, settings), dependencies=key_check,
                       responses=errors(401))
    app.include_router(embeddings_router(engine, settings), dependencies=key_check,
                       responses=errors(401))
    if runtime_updating_allowed():
        app.include_router(lora_router(engine, settings, [*JSON_ONLY, *key_check]),
                           responses=errors(401))
    if not settings.disable_docs:
        app.include_router(docs_router(app, key_check))
    if not settings.disable_playground:
        app.include_router(playground_router())
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

    @router.get("/health", response_model=None,
                responses={**ok_json(HealthResponse), **errors(*ANY_ROUTE, 503)})
    async def health() -> dict[str, Any]:
        engine.check_health()  # no engine left (or restarting) -> 503
        reason = stall_reason(engine)
        if reason is not None:
            raise OpenAIError(503, f"the engine is {reason}", code="engine_stalled")
        engines = [_engine_health(status, engine.engine_stats.get(status.index))
                   for status in engine.client.statuses()]
        degraded = not all(entry.alive for entry in engines)
        return HealthResponse(status="degraded" if degraded else "ok",
                              engines=engines).model_dump()

    @router.get("/version", response_model=None,
                responses={**ok_json(VersionResponse), **errors(*ANY_ROUTE)})
    async def version() -> dict[str, Any]:
        running = engine.is_running()  # a dead engine has no pid to show
        return {"version": __version__, "platform": engine.ready.platform,
                "engine_pid": engine.ready.pid if running else None, "engine_running": running}

    @router.get("/metrics", response_class=Response, responses={
        **ok_text("Prometheus metrics (text format)"), **errors(*ANY_ROUTE)})
    async def prometheus_metrics() -> Response:
        metrics.record_stalled(engine.stall_watch.silences(time.monotonic()))
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router


def _engine_health(status: EngineStatus, stats: SchedulerStats | None) -> EngineHealth:
    running = waiting = 0  # a dead engine (or one yet to report) runs and waits on nothing
    if status.alive and stats is not None:
        running, waiting = stats.num_running_reqs, stats.num_waiting_reqs
    return EngineHealth(index=status.index, alive=status.alive, pid=status.pid,
                        num_requests_running=running, num_requests_waiting=waiting)


def _protected_routes(engine: AsyncLLM, settings: ServerSettings) -> APIRouter:
    router = APIRouter()
    completions = OpenAIServingCompletion(engine, settings)
    chat = OpenAIServingChat(engine, settings)
    responses = OpenAIServingResponses(chat)
    common = OpenAIServing(engine, settings)
    generation = [*JSON_ONLY, Depends(generation_only(engine))]

    @router.get("/v1/models", responses={**ok_json(ModelList), **errors(*ANY_ROUTE)})
    async def models() -> JSONResponse:
        card = ModelCard(id=settings.served_model_name, root=engine.ready.model,
                         max_model_len=engine.max_model_len,
                         supported_tasks=engine.supported_tasks)
        adapters = [ModelCard(id=name, root=lora.lora_path, parent=settings.served_model_name,
                              max_model_len=engine.max_model_len,
                              supported_tasks=engine.supported_tasks)
                    for name, lora in engine.served_loras.items()]
        return JSONResponse(ModelList(data=[card, *adapters]).model_dump())

    @router.post("/v1/completions", dependencies=generation, responses={
        **ok_stream(CompletionResponse, CompletionResponse), **errors(*BODY_ROUTE, 404)})
    async def create_completion(request: CompletionRequest, raw: Request) -> Response:
        return await completions.create(request, raw)

    @router.post("/v1/chat/completions", dependencies=generation, responses={
        **ok_stream(ChatCompletionResponse, ChatCompletionChunk),
        **errors(*BODY_ROUTE, 404)})
    async def create_chat_completion(request: ChatCompletionRequest, raw: Request) -> Response:
        return await chat.create(request, raw)

    @router.post("/v1/responses", dependencies=generation, responses={
        **ok_events(ResponseObject, ResponseEvent), **errors(*BODY_ROUTE, 404)})
    async def create_response(request: ResponsesRequest, raw: Request) -> Response:
        return await responses.create(request, raw)

    @router.get("/v1/responses/{response_id}",
                responses={**ok_json(ResponseObject), **errors(*ANY_ROUTE, 404)})
    async def retrieve_response(response_id: str) -> JSONResponse:
        return responses.retrieve(response_id)

    @router.post("/tokenize", dependencies=JSON_ONLY,
                 responses={**ok_json(TokenizeResponse), **errors(*BODY_ROUTE, 404)})
    async def tokenize(request: TokenizeRequest) -> JSONResponse:
        common.check_model(request.model)
        # Time that grows with the prompt (tokenizing, writing out the tokens): off the loop.
        return await engine.run_in_pool(_tokenize, engine, chat, request)

    @router.post("/detokenize", dependencies=JSON_ONLY,
                 responses={**ok_json(DetokenizeResponse), **errors(*BODY_ROUTE, 404)})
    async def detokenize(request: DetokenizeRequest) -> JSONResponse:
        common.check_model(request.model)
        vocab_size = engine.processor.vocab_size
        outside = [t for t in request.tokens if not 0 <= t < vocab_size]
        if outside:
            raise OpenAIError(400, f"tokens: ids outside the vocabulary [0, {vocab_size}): "
                                   f"{outside[:5]}", param="tokens")
        text = await engine.run_in_pool(engine.tokenizer.decode, request.tokens)
        return JSONResponse(DetokenizeResponse(prompt=text).model_dump())

    # The JSON body ({}) is documented as required, so that a schema-valid call sends the
    # JSON Content-Type that every POST needs; the server takes an empty body too.
    @router.post("/reset_prefix_cache", dependencies=JSON_ONLY, response_class=Response,
                 responses={**ok_empty("The prefix cache is emptied"),
                            **errors(*BODY_ROUTE)},
                 openapi_extra={"requestBody": {"required": True}})
    async def reset_prefix_cache(_: ResetPrefixCacheRequest | None = None) -> Response:
        await engine.reset_prefix_cache()
        return Response(status_code=200)

    return router


def _tokenize(engine: AsyncLLM, chat: OpenAIServingChat, request: TokenizeRequest,
              ) -> JSONResponse:
    if request.messages is not None:
        _, tokens = chat.render_prompt(request.messages, request, request.tools,
                                       bool(request.add_special_tokens))
    else:
        try:  # the tokenizer would raise a TypeError (a 500) on a lone surrogate
            check_text("prompt", request.prompt or "")
        except ValueError as exc:
            raise OpenAIError(400, str(exc), param="prompt") from None
        add_special = request.add_special_tokens is not False
        tokens = list(engine.tokenizer.encode(request.prompt, add_special_tokens=add_special))
    body = TokenizeResponse(count=len(tokens), max_model_len=engine.max_model_len,
                            tokens=tokens)
    return JSONResponse(body.model_dump())

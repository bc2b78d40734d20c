"""The OpenAPI document as the server really answers, and the routes that serve it.

FastAPI documents a 422 for every route with a body and an empty schema for routes that
return a ``Response``; this server answers 400 in OpenAI's error shape and returns known
models. So each route states its answers with ``ok_json``/``ok_stream``/``ok_empty``/``ok_text``
and ``errors(...)``, and ``fix_openapi`` removes the 422 FastAPI adds on its own. A fuzzer
(schemathesis, ``tests/e2e/test_openapi_fuzz.py``) holds the server to the document.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, params
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from octavo.entrypoints.openai.protocol import (
    ChatCompletionChunk,
    CompletionResponse,
    ErrorResponse,
)
from octavo.entrypoints.openai.responses_protocol import ResponseEvent

Responses = dict[int | str, dict[str, Any]]
REF_PREFIX = "#/components/schemas/"
# What streams send.
STREAM_MODELS = (CompletionResponse, ChatCompletionChunk, ErrorResponse, ResponseEvent)

# Why each status is sent (every error body is an ErrorResponse).
ERROR_REASONS = {
    400: "Invalid request: a field, the JSON body, the Host header (code invalid_host) or a "
         "CORS preflight",
    401: "Missing or wrong API key (when the server has --api-key)",
    404: "The model is not the one served (code model_not_found), or no stored response "
         "has the id (code response_not_found), or no LoRA adapter has the name",
    409: "The LoRA adapter is in use by requests in flight (unload it once they finish)",
    408: "The request body did not arrive in time",
    413: "The request body is larger than --max-request-body-size",
    415: "Content-Type is not application/json",
    500: "An internal error (its class and a short text; details in the server's log)",
    503: "The engine is not running (code engine_dead), too many requests wait for it, or "
         "the request bodies being processed would pass --max-inflight-body-size (code "
         "overloaded, with Retry-After)",
}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying (overloaded)",
                               "schema": {"type": "integer"}}}
# Every route can meet a refused Host header and an internal error.
ANY_ROUTE = (400, 500)
# plus what a POST body can get wrong, and the bound on bodies in flight (body_budget.py)
BODY_ROUTE = (*ANY_ROUTE, 408, 413, 415, 503)


def errors(*statuses: int) -> Responses:
    """The error answers ``statuses``, each documented with the ErrorResponse schema."""
    responses: Responses = {}
    for status in sorted(set(statuses)):
        response: dict[str, Any] = {"model": ErrorResponse, "description": ERROR_REASONS[status]}
        if status == 503:
            response["headers"] = RETRY_AFTER
        responses[status] = response
    return responses


def ok_json(model: type[BaseModel]) -> Responses:
    return {200: {"model": model, "description": "Success"}}


def ok_stream(model: type[BaseModel], chunk: type[BaseModel]) -> Responses:
    """A JSON ``model``, or with ``"stream": true`` server-sent events: ``chunk``s, an error
    event should the engine fail, then ``data: [DONE]``. ``itemSchema`` describes one event
    (OpenAPI 3.2's keyword, which FastAPI also uses); ``chunk`` joins the components in
    ``fix_openapi``."""
    json_data = {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"anyOf": [_ref(chunk), _ref(ErrorResponse)]}}
    event = {"type": "object", "required": ["data"],
             "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_data]}}}
    return {200: {"model": model, "description": "Success; with stream true, server-sent "
                  f"events of {chunk.__name__}, ending with `data: [DONE]`",
                  "content": {"text/event-stream": {"itemSchema": event}}}}


def ok_events(model: type[BaseModel], event: type[BaseModel]) -> Responses:
    """A JSON ``model``, or with ``"stream": true`` typed server-sent events, as OpenAI's
    Responses API sends them: an ``event:`` line naming the type, a ``data:`` line with the
    ``event``; no ``[DONE]``."""
    json_data = {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": _ref(event)}
    item = {"type": "object", "required": ["event", "data"],
            "properties": {"event": {"type": "string"}, "data": json_data}}
    return {200: {"model": model, "description": "Success; with stream true, server-sent "
                  f"events of {event.__name__}",
                  "content": {"text/event-stream": {"itemSchema": item}}}}


def ok_empty(description: str) -> Responses:
    """200 with an empty body and no Content-Type. With ``response_class=Response`` (no media
    type of its own), as ``ok_text``: FastAPI would give the 200 the route's media type."""
    return {200: {"description": description}}


def ok_text(description: str) -> Responses:
    return {200: {"description": description,
                  "content": {"text/plain": {"schema": {"type": "string"}}}}}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"{REF_PREFIX}{model.__name__}"}


def fix_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` leave out the 422 answers (and their schemas) FastAPI adds to
    every route with parameters, since a request that fails validation gets 400 here, and
    hold the schemas of ``STREAM_MODELS``, which only event streams refer to."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            _, streamed = models_json_schema([(m, "serialization") for m in STREAM_MODELS],
                                             ref_template=REF_PREFIX + "{model}")
            for name, model_schema in streamed.get("$defs", {}).items():
                components.setdefault(name, model_schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def docs_router(app: FastAPI, dependencies: Sequence[params.Depends]) -> APIRouter:
    """FastAPI's ``/openapi.json``, ``/docs``, ``/docs/oauth2-redirect`` and ``/redoc``,
    behind ``dependencies`` (the API key check, when there is a key)."""
    router = APIRouter(dependencies=list(dependencies), include_in_schema=False)
    title = f"{app.title} - API documentation"

    def page(html: Callable[[], HTMLResponse]) -> Callable[[], Any]:
        async def serve() -> HTMLResponse:
            return html()
        return serve

    async def openapi_json() -> JSONResponse:
        return JSONResponse(app.openapi())

    router.add_api_route("/openapi.json", openapi_json, methods=["GET"])
    router.add_api_route("/docs", page(lambda: get_swagger_ui_html(
        openapi_url="/openapi.json", title=title,
        oauth2_redirect_url="/docs/oauth2-redirect")), methods=["GET"])
    router.add_api_route("/docs/oauth2-redirect", page(get_swagger_ui_oauth2_redirect_html),
                         methods=["GET"])
    router.add_api_route("/redoc", page(lambda: get_redoc_html(openapi_url="/openapi.json",
                                                               title=title)), methods=["GET"])
    return router

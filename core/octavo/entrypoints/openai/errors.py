"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can cause or meet is mapped here to a status and that body, so SDKs
raise their usual exceptions (``BadRequestError``, ``NotFoundError``, ...) with a message
that names the field and the problem. Anything else that escapes a route is a 500 in the same
shape, naming the exception's class but never a traceback, an address or a file path; the
traceback goes to the server's log.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from octavo.engine.errors import EngineDeadError, EngineStepError, InvalidRequestError
from octavo.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

# OpenAI's error types by status.
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
               404: "invalid_request_error", 405: "invalid_request_error",
               408: "invalid_request_error", 413: "invalid_request_error",
               415: "invalid_request_error", 431: "invalid_request_error",
               500: "server_error", 503: "server_error"}
# What an internal error's message must not show a client: where things are in memory and on
# disk (``<Foo object at 0x7f...>``, ``/usr/lib/.../x.py``).
_ADDRESS = re.compile(r"\s*at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")
_PATH = re.compile(r"(?<![\w.:/])(?:[A-Za-z]:)?[/\\](?:[\w.-]+[/\\])*[\w.-]+")
MAX_INTERNAL_MESSAGE = 200


class OpenAIError(Exception):
    """A request failed in a way the client should hear about as ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None,
               code: Any = None) -> ErrorResponse:
    return ErrorResponse(error=ErrorInfo(message=message,
                                         type=ERROR_TYPES.get(status, "server_error"),
                                         param=param, code=code))


def error_response(error: OpenAIError) -> JSONResponse:
    body = error_body(error.status, error.message, error.param, error.code)
    return JSONResponse(body.model_dump(), status_code=error.status, headers=error.headers)


def engine_dead_error(exc: EngineDeadError) -> OpenAIError:
    return OpenAIError(503, f"the engine is not running: {exc}", code="engine_dead")


def stream_error(exc: EngineDeadError | EngineStepError) -> OpenAIError:
    """The error event that ends a stream whose request the engine failed: 503 when no
    engine is left, else 500 (a step it was in failed, or its data-parallel engine died)."""
    if isinstance(exc, EngineDeadError):
        return engine_dead_error(exc)
    return internal_error(exc)


def internal_error(exc: BaseException) -> OpenAIError:
    """A 500 naming ``exc``'s class and the first line of its text, less addresses and
    paths, so a bug report can quote it and a client learns nothing about the host."""
    text = str(exc).splitlines()[0] if str(exc).strip() else ""
    text = _PATH.sub("<path>", _ADDRESS.sub("", text)).strip()
    if len(text) > MAX_INTERNAL_MESSAGE:
        text = text[:MAX_INTERNAL_MESSAGE] + "..."
    detail = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return OpenAIError(500, f"internal server error ({detail})", code="internal_error")


def validation_error(exc: RequestValidationError) -> OpenAIError:
    """The first problem pydantic found, with the field's dotted path as ``param``."""
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return OpenAIError(400, f"the request body is not valid JSON: {first.get('msg')}")
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") == "model_attributes_type":
        return OpenAIError(400, "the request body must be a JSON object "
                                "(with Content-Type: application/json)")
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    # Unions report each member's failure under its type name; the field is what matters.
    param = ".".join(p for p in location if not _is_type_name(p)) or None
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "missing":
        message = "this field is required"
    return OpenAIError(400, f"{param}: {message}" if param else message, param=param)


def _is_type_name(part: str) -> bool:
    return part in {"str", "int", "float", "bool"} or "[" in part


def install_error_handlers(app: FastAPI) -> None:
    async def on_openai_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OpenAIError)
        return error_response(exc)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(exc))

    async def on_invalid_request(_: Request, exc: Exception) -> JSONResponse:
        return error_response(OpenAIError(400, str(exc)))

    async def on_engine_dead(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, EngineDeadError)
        return error_response(engine_dead_error(exc))

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers) if exc.headers else None
        return error_response(OpenAIError(exc.status_code, str(exc.detail), headers=headers))

    async def on_too_deep(_: Request, exc: Exception) -> JSONResponse:
        # The server's own data is never deep: a RecursionError comes from what a request
        # holds (a schema or JSON text nested thousands of levels).
        return error_response(OpenAIError(400, "the request is nested too deeply to process"))

    async def on_bad_text(_: Request, exc: Exception) -> JSONResponse:
        # The server's own text is valid: bad text came in with the request (a lone surrogate).
        reason = getattr(exc, "reason", "")
        return error_response(OpenAIError(400, "the request holds text that is not valid "
                                               f"Unicode{': ' + reason if reason else ''}"))

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Starlette's ServerErrorMiddleware, the outermost layer, calls this for whatever
        # every other handler and middleware let through, sends its answer, then re-raises
        # so that uvicorn logs the traceback (and closes that connection).
        return error_response(internal_error(exc))

    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(InvalidRequestError, on_invalid_request)
    app.add_exception_handler(EngineDeadError, on_engine_dead)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RecursionError, on_too_deep)
    app.add_exception_handler(UnicodeError, on_bad_text)
    app.add_exception_handler(Exception, on_unexpected)

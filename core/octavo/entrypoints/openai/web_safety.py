"""What keeps a web page in a browser from using the server behind its user's back.

A page on another site can send "simple" cross-site requests (no preflight) to a server on
the user's machine: a POST with ``text/plain`` or no Content-Type at all. It can also make
its own host name resolve to 127.0.0.1 (DNS rebinding) and then read the answers, since the
browser takes the server for the page's own origin. Hence, without an API key to stop them:

- every POST needs ``Content-Type: application/json`` (415 otherwise), which a simple request
  cannot send, so a cross-site POST is always preflighted, and refused without CORS;
- the ``Host`` header must name this server (400 otherwise): a rebound name does not;
- CORS is off unless ``--allowed-origins`` names the origins to let in.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from fastapi import FastAPI, Request
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from octavo.entrypoints.openai.errors import OpenAIError, error_response
from octavo.entrypoints.openai.settings import ServerSettings

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
JSON_MEDIA_TYPE = "application/json"


async def require_json(request: Request) -> None:
    """A POST's Content-Type must be JSON, body or not (a route dependency)."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        raise OpenAIError(415, f"Content-Type must be {JSON_MEDIA_TYPE}, got "
                               f"{media_type or 'none'}", code="unsupported_media_type")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bind_host: str) -> tuple[str, ...] | None:
    """The Host names a server bound to ``bind_host`` answers when ``--allowed-hosts`` is not
    given: on a loopback address, its own names (so a rebound name is refused); elsewhere any
    (None), since the names that reach it are the deployment's to know."""
    if not is_loopback(bind_host):
        return None
    return tuple(sorted({*LOOPBACK_NAMES, bind_host.strip("[]").lower()}))


def host_name(header: str) -> str:
    """The name in a Host header, without its port: ``[::1]:8000`` -> ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class HostCheck:
    """Answers 400 ``invalid_host`` to a request whose Host header names none of ``allowed``
    (any port). It wraps CORS and the routes, so a refused request reaches neither."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = frozenset(host_name(name) for name in allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("host", "")
        if host_name(header) in self.allowed:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # refuses the handshake (403)
            await send({"type": "websocket.close", "code": 1008})
            return
        response = error_response(OpenAIError(
            400, f"invalid host {header[:100]!r}: this server answers only for "
                 f"{', '.join(sorted(self.allowed))} (see --allowed-hosts)", code="invalid_host"))
        await response(scope, receive, send)


class OpenAICORSMiddleware(CORSMiddleware):
    """Starlette's CORS, with a refused preflight answered in OpenAI's error shape."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        headers = {k: v for k, v in response.headers.items()
                   if k.lower().startswith("access-control-") or k.lower() == "vary"}
        return error_response(OpenAIError(400, bytes(response.body).decode(),
                                          code="cors_refused", headers=headers))


def install_web_safety(app: FastAPI, settings: ServerSettings) -> None:
    """CORS when origins are given, and the Host check around everything."""
    if settings.allowed_origins:
        app.add_middleware(OpenAICORSMiddleware, allow_origins=settings.allowed_origins,
                           allow_methods=settings.allowed_methods,
                           allow_headers=settings.allowed_headers,
                           allow_credentials=settings.allow_credentials)
    allowed = settings.allowed_hosts
    if allowed is None:
        allowed = default_allowed_hosts(settings.host)
    if allowed is not None and "*" not in allowed:
        app.add_middleware(HostCheck, allowed=allowed)

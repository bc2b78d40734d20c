"""The web playground: one page (chat, raw completions with logprobs, a live dashboard)
served at ``/`` and ``/playground`` from the files in ``playground/``, which the core
package ships as they are (no build step).

The page is static and holds no secret, so it is served without the API key; what it shows
comes from this server's own OpenAI endpoints and ``/metrics``, which the page calls with
the key its user types (kept in the tab's memory, sent as a Bearer header). Its
Content-Security-Policy lets it run only its own script and style and talk only to this
origin, so it needs no CORS opening; model output goes into the page as text
(``textContent``), never as HTML. ``--disable-playground`` turns it off.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

PAGE_DIR = Path(__file__).with_name("playground")
MEDIA_TYPES = {"index.html": "text/html; charset=utf-8",
               "app.js": "text/javascript; charset=utf-8",
               "style.css": "text/css; charset=utf-8"}
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                           "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY,
           "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}
ROUTES = {"/": "index.html", "/playground": "index.html", "/playground/app.js": "app.js",
          "/playground/style.css": "style.css"}


def playground_router() -> APIRouter:
    """The page's routes; the files are read once, here."""
    contents = {name: (PAGE_DIR / name).read_bytes() for name in MEDIA_TYPES}
    router = APIRouter()
    for path, name in ROUTES.items():
        router.add_api_route(path, _file(contents[name], MEDIA_TYPES[name]), methods=["GET"],
                             include_in_schema=False)
    return router


def _file(content: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def endpoint() -> Response:
        return Response(content, media_type=media_type, headers=HEADERS)

    return endpoint

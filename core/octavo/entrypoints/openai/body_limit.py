"""``BodyLimit``: an ASGI middleware that reads each request body, bounded in size and time,
before the app sees it.

Why: without a bound, a 50 MB prompt grew the API process to 6 GB and stalled every client
while it was parsed and tokenized, and a client that sends its body slowly held its
connection forever (tests/e2e/test_serve_limits.py:
``test_a_50mb_body_gets_413_at_once_and_health_stays_fast``,
``test_a_body_that_never_arrives_gets_408``). A declared ``Content-Length`` over the limit
is answered 413 before a byte of the body is read; a chunked body is cut off at the limit; a
body that does not arrive within ``timeout_s`` is answered 408. A body that would take the
bytes of all bodies in flight past the ``BodyBudget`` is answered 503 with Retry-After
(``body_budget.py``); its bytes count until the app's answer is complete. The app then gets
the body in one message, and later messages (the client's disconnect) as they come.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from octavo.entrypoints.openai.body_budget import BodyBudget, Reservation
from octavo.entrypoints.openai.errors import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


class BodyOverBudget(Exception):
    pass


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float, budget: BodyBudget,
                 retry_after_s: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.budget = budget  # the bytes of all bodies in flight
        self.retry_after = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send, 413, self._too_large(declared))
            return
        reservation = Reservation(self.budget)
        try:
            await self._serve(scope, receive, send, declared, reservation)
        finally:
            await reservation.end()

    async def _serve(self, scope: Scope, receive: Receive, send: Send, declared: int | None,
                     reservation: Reservation) -> None:
        """Read the body within the budget and the limits, then let the app answer."""
        if declared is not None and not reservation.take(declared):
            await self._refuse(send, 503, self.budget.refusal(declared), self.retry_after)
            return
        try:
            body = await asyncio.wait_for(
                self._read(receive, None if declared is not None else reservation),
                self.timeout_s)
        except BodyTooLarge:
            await self._refuse(send, 413, self._too_large(None))
            return
        except BodyOverBudget:
            await self._refuse(send, 503, self.budget.refusal(None), self.retry_after)
            return
        except asyncio.TimeoutError:
            await self._refuse(send, 408, f"the request body did not arrive within "
                                          f"{self.timeout_s:g} s")
            return
        if body is None:  # the client left before sending it all: nobody to answer
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive, reservation: Reservation | None) -> bytes | None:
        """The whole body; a chunked one's chunks are taken from the budget (``reservation``)
        as they arrive."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise BodyTooLarge
            if reservation is not None and not reservation.take(len(chunk)):
                raise BodyOverBudget
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self, declared: int | None) -> str:
        size = f" ({declared} bytes)" if declared is not None else ""
        return (f"the request body{size} exceeds the limit of {self.max_bytes} bytes "
                "(--max-request-body-size)")

    @staticmethod
    async def _refuse(send: Send, status: int, message: str, retry_after_s: int | None = None,
                      ) -> None:
        code = "overloaded" if status == 503 else None
        body = error_body(status, message, code=code).model_dump_json().encode()
        # Connection: close - the unread rest of the body must not be parsed as a request.
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        if retry_after_s is not None:
            headers.append((b"retry-after", str(retry_after_s).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # h11 has refused such a request already
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for the app: the whole body first, then the client's later messages."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed

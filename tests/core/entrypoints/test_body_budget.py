"""``BodyLimit`` with a ``BodyBudget``: the bytes of bodies in flight are bounded, a request
past the budget gets 503 with Retry-After (a declared body before it is read, a chunked one
once its chunks pass it), and every byte is given back when its request ends. The end to
end test, memory included, is tests/e2e/test_serve_memory.py."""

from __future__ import annotations

import asyncio
from typing import Any

from octavo.entrypoints.openai.body_budget import LARGE_BODY_BYTES, BodyBudget
from octavo.entrypoints.openai.body_limit import BodyLimit

Message = dict[str, Any]


class HoldingApp:
    """An ASGI app that takes the body, then answers 200 once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.bodies.append((await receive())["body"])
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(limit: BodyLimit, chunks: list[bytes], declared: bool) -> list[Message]:
    """What ``limit`` sends for a POST whose body comes in ``chunks``."""
    headers = [(b"content-length", str(sum(map(len, chunks))).encode())] if declared else []
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    queue = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
             for i, chunk in enumerate(chunks or [b""])]
    sent: list[Message] = []

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)  # the client stays connected
        raise AssertionError

    async def send(message: Message) -> None:
        sent.append(message)

    await limit(scope, receive, send)
    return sent


def status_and_headers(sent: list[Message]) -> tuple[int, dict[bytes, bytes]]:
    return sent[0]["status"], dict(sent[0]["headers"])


def test_bodies_past_the_budget_get_503_and_every_byte_comes_back() -> None:
    async def scenario() -> None:
        app = HoldingApp()
        budget = BodyBudget(max_bytes=3 * LARGE_BODY_BYTES)
        limit = BodyLimit(app, 4 * LARGE_BODY_BYTES, 5.0, budget, retry_after_s=7)
        large = b"x" * (2 * LARGE_BODY_BYTES)
        held = asyncio.ensure_future(call(limit, [large], declared=True))
        while budget.in_flight == 0:
            await asyncio.sleep(0)
        assert budget.in_flight == len(large) and budget.large_in_flight == 1

        for declared in (True, False):  # a declared body, then a chunked one
            sent = await asyncio.wait_for(
                call(limit, [large[:LARGE_BODY_BYTES]] * 2, declared), 5)  # not held
            status, headers = status_and_headers(sent)
            assert status == 503 and headers[b"retry-after"] == b"7", sent
            assert b"--max-inflight-body-size" in sent[1]["body"]
            assert budget.in_flight == len(large)  # the refused one's bytes are back
        no_body = asyncio.ensure_future(call(limit, [], declared=True))  # always fits
        small = asyncio.ensure_future(call(limit, [b"{}"], declared=False))
        while len(app.bodies) < 3:
            await asyncio.sleep(0)
        app.release.set()
        for request in (held, no_body, small):
            assert status_and_headers(await request)[0] == 200
        assert app.bodies == [large, b"", b"{}"]
        assert budget.in_flight == 0 and budget.large_in_flight == 0

    asyncio.run(scenario())

"""The proxy's FastAPI app: each completion goes to a prefill instance with ``max_tokens=1``
(which computes the prompt and saves its KV through the connector), then to a decode
instance with the original request, whose answer - streamed or not - is passed through.

No request is lost to a dead instance: a prefill failure moves on to another prefill
instance, or to none (the decode instance then computes the prompt itself); a decode
failure before any byte of the answer retries on another decode instance. Failures take the
instance out of rotation (see ``pool``) and are counted on ``/status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from octavo.entrypoints.proxy.pool import Instance, InstancePool

logger = logging.getLogger(__name__)

FORWARDED_HEADERS = ("authorization", "content-type")


@dataclass
class ProxyStats:
    requests: int = 0
    prefill_failures: int = 0  # prefill attempts that hit a dead or failing instance
    decoded_without_prefill: int = 0  # no prefill instance answered: decode recomputed
    decode_retries: int = 0  # decode attempts that failed and were retried elsewhere
    failed_requests: int = 0  # no decode instance could answer


class UpstreamError(Exception):
    """An instance failed in a way that takes it out of rotation (connection, 5xx)."""


class Proxy:
    def __init__(self, prefill: InstancePool, decode: InstancePool,
                 probe_interval: float = 1.0) -> None:
        self.prefill = prefill
        self.decode = decode
        self.probe_interval = probe_interval
        self.stats = ProxyStats()
        self.session: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        self.session = aiohttp.ClientSession(timeout=timeout)
        probe = asyncio.create_task(self._probe_loop())
        try:
            yield
        finally:
            probe.cancel()
            await self.session.close()

    # -- one request ----------------------------------------------------------------------
    async def handle(self, path: str, request: Request) -> Response:
        body = await request.json()
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        self.stats.requests += 1
        rejected = await self._prefill(path, body, headers)
        if rejected is not None:
            return rejected
        return await self._decode(path, body, headers)

    async def _prefill(self, path: str, body: dict[str, Any],
                       headers: dict[str, str]) -> Response | None:
        """Run the prompt on a prefill instance; a client error (4xx) is the answer."""
        prefill_body = {**body, "max_tokens": 1, "stream": False}
        prefill_body.pop("stream_options", None)
        if "max_completion_tokens" in body:
            prefill_body["max_completion_tokens"] = 1
        tried: set[str] = set()
        while (instance := self.prefill.pick(tried)) is not None:
            tried.add(instance.url)
            try:
                async with self._post(instance, path, prefill_body, headers) as response:
                    payload = await response.read()
                    if 400 <= response.status < 500:
                        return Response(payload, status_code=response.status,
                                        media_type=response.content_type)
                    return None
            except UpstreamError as exc:
                self.stats.prefill_failures += 1
                self.prefill.mark_down(instance, str(exc))
        self.stats.decoded_without_prefill += 1
        logger.warning("no prefill instance answered; the decode instance computes the prompt")
        return None

    async def _decode(self, path: str, body: dict[str, Any],
                      headers: dict[str, str]) -> Response:
        tried: set[str] = set()
        while (instance := self.decode.pick(tried)) is not None:
            tried.add(instance.url)
            context = self._post(instance, path, body, headers)
            try:
                response = await context.__aenter__()
            except UpstreamError as exc:
                self.stats.decode_retries += 1
                self.decode.mark_down(instance, str(exc))
                continue
            if not body.get("stream"):
                try:
                    payload = await response.read()
                finally:
                    await context.__aexit__(None, None, None)
                return Response(payload, status_code=response.status,
                                media_type=response.content_type)
            return StreamingResponse(_passthrough(response, context),
                                     status_code=response.status,
                                     media_type=response.content_type)
        self.stats.failed_requests += 1
        return JSONResponse({"error": {"message": "no decode instance is available",
                                       "type": "ServiceUnavailable", "code": 503}},
                            status_code=503)

    @contextlib.asynccontextmanager
    async def _post(self, instance: Instance, path: str, body: dict[str, Any],
                    headers: dict[str, str]) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST to ``instance``; connection errors and 5xx answers raise ``UpstreamError``
        (the response is open for the caller otherwise)."""
        assert self.session is not None
        instance.in_flight += 1
        instance.requests += 1
        try:
            try:
                response = await self.session.post(instance.url + path, json=body,
                                                   headers=headers)
            except (aiohttp.ClientError, OSError) as exc:
                raise UpstreamError(f"{type(exc).__name__}: {exc}") from None
            try:
                if response.status >= 500:
                    text = (await response.text())[:200]
                    raise UpstreamError(f"HTTP {response.status}: {text}")
                yield response
            finally:
                response.release()
        finally:
            instance.in_flight -= 1

    # -- health ---------------------------------------------------------------------------
    async def _probe_loop(self) -> None:
        """Bring instances that left the rotation back once their /health answers 200."""
        while True:
            await asyncio.sleep(self.probe_interval)
            for pool in (self.prefill, self.decode):
                for instance in pool.instances:
                    if not instance.healthy and await self._healthy(instance):
                        pool.mark_up(instance)

    async def _healthy(self, instance: Instance) -> bool:
        assert self.session is not None
        try:
            async with self.session.get(instance.url + "/health",
                                        timeout=aiohttp.ClientTimeout(total=2)) as response:
                return response.status == 200
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return False

    def status(self) -> dict[str, Any]:
        return {"stats": asdict(self.stats), "prefill": self.prefill.status(),
                "decode": self.decode.status()}


async def _passthrough(response: aiohttp.ClientResponse,
                       context: contextlib.AbstractAsyncContextManager[Any],
                       ) -> AsyncIterator[bytes]:
    """The decode instance's server-sent events, chunk by chunk as they arrive."""
    try:
        async for chunk in response.content.iter_any():
            yield chunk
    finally:
        await context.__aexit__(None, None, None)


def build_app(proxy: Proxy) -> FastAPI:
    app = FastAPI(title="Octavo proxy", lifespan=proxy.lifespan)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy.handle("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy.handle("/v1/chat/completions", request)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        assert proxy.session is not None
        instance = proxy.decode.pick()
        if instance is None:
            return JSONResponse({"error": {"message": "no decode instance is available"}},
                                status_code=503)
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        async with proxy.session.get(instance.url + "/v1/models", headers=headers) as response:
            return Response(await response.read(), status_code=response.status,
                            media_type=response.content_type)

    @app.get("/health")
    async def health() -> Response:
        up = proxy.decode.pick() is not None
        return Response(status_code=200 if up else 503)

    @app.get("/status")
    async def status() -> JSONResponse:
        return JSONResponse(proxy.status())

    return app

"""Fair admission: what one request may ask of the engine, and how much of it runs at once.

A request is counted in *sequences*, the engine requests it creates: prompts x ``n``
(``best_of`` may only equal ``n``), one per input for embeddings. Three limits follow:

- ``--max-sequences-per-request``: a request creating more is a 400 naming the limit
  (as vLLM bounds ``n``); it bounds what one HTTP body can make the server hold.
- ``--max-waiting-requests``: a request is admitted only while the sequences waiting for
  their first token, its own included, stay within the cap (503 with Retry-After beyond);
  one that alone exceeds the cap could never be admitted, so it is a 400.
- ``--request-sequence-window``: the prompts of one request are validated and tokenized one
  after another, each sent to the engine at once while the window has room and held back
  otherwise - at most the window's worth of sequences of one request are in the engine at
  once, the next prompt sent as one finishes. A bad prompt fails the whole request (400)
  and aborts those already sent. The engine schedules first come, first served, so
  a request arriving behind a giant one waits behind at most a window of its sequences,
  not behind thousands. Sequences held back in the window wait in the front end and count
  against no cap. Outputs do not change: each prompt is the same engine request (same id,
  params and seed) whenever it is sent, and responses are assembled by prompt index.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from octavo.engine.async_llm import AsyncLLM, PreparedRequest
from octavo.entrypoints.openai.errors import OpenAIError
from octavo.entrypoints.openai.settings import ServerSettings


def check_admission(settings: ServerSettings, num_sequences: int, waiting: int) -> None:
    """Refuse a request of ``num_sequences`` while ``waiting`` sequences wait: 400 for one
    too big ever to run, 503 with Retry-After for one that must wait for room."""
    limit = settings.max_sequences_per_request
    if num_sequences > limit:
        raise OpenAIError(400, f"this request creates {num_sequences} sequences (prompts x "
                               f"n); the limit is {limit} (--max-sequences-per-request)",
                          param="n")
    cap = settings.max_waiting_requests
    if cap is None:
        return
    if num_sequences > cap:
        raise OpenAIError(400, f"this request creates {num_sequences} sequences (prompts x "
                               f"n), more than may ever wait for the engine "
                               f"(--max-waiting-requests {cap})", param="n")
    if waiting + num_sequences > cap:
        raise OpenAIError(503, f"the server is overloaded: {waiting} sequences are waiting "
                               f"for the engine and this request adds {num_sequences} "
                               f"(--max-waiting-requests {cap}); retry later",
                          code="overloaded",
                          headers={"Retry-After": str(settings.retry_after_s)})


class SequenceWindow:
    """Sends the prepared prompts of one request to the engine at most ``size`` sequences
    at a time (at least one prompt, whatever its ``n``)."""

    def __init__(self, engine: AsyncLLM, size: int, sequences_per_prompt: int) -> None:
        self.engine = engine
        self._slots = asyncio.Semaphore(max(1, size // sequences_per_prompt))

    async def streams(self, prepared: AsyncIterator[PreparedRequest],
                      ) -> list[AsyncGenerator[Any, None]]:
        """One output stream per prompt, in order. A prompt is sent as soon as it is
        prepared while the window has room, so an error in sending it (the id in use, say)
        is raised here, before a response begins; each of the rest is sent when a slot
        frees. A failure (a bad prompt, a cancelled call) aborts those already sent."""
        streams: list[AsyncGenerator[Any, None]] = []
        request_ids: list[str] = []
        try:
            async for request in prepared:
                request_ids.append(request.request_id)
                sent = None
                if not self._slots.locked():
                    await self._slots.acquire()
                    sent = self.engine.submit(request)
                streams.append(WindowStream(self, request, sent))
        except BaseException:
            for request_id in request_ids:
                self.engine.abort(request_id)  # a no-op for one not sent
            raise
        return streams

    async def outputs(self, request: PreparedRequest, sent: AsyncGenerator[Any, None] | None,
                      ) -> AsyncGenerator[Any, None]:
        """The prompt's outputs; one not ``sent`` yet is sent once a slot frees."""
        if sent is None:
            await self._slots.acquire()
        try:
            sent = sent or self.engine.submit(request)
            async for output in sent:
                yield output
        finally:
            if sent is not None:
                await sent.aclose()  # aborts the request unless it finished
            self._slots.release()

    def withdraw(self, request_id: str) -> None:
        """Abort a sent prompt whose outputs were never read, and free its slot."""
        self.engine.abort(request_id)
        self._slots.release()


class WindowStream(AsyncGenerator[Any, None]):
    """One prompt's outputs. Why not the bare generator: closing a generator that was never
    iterated runs none of its code, so a prompt the window had already sent would run to
    its end with nobody reading it and hold its slot (a response abandoned before its first
    read: a client gone, an error building it). Closing this one aborts that prompt."""

    def __init__(self, window: SequenceWindow, request: PreparedRequest,
                 sent: AsyncGenerator[Any, None] | None) -> None:
        self._window = window
        self._request_id = request.request_id
        self._sent = sent
        self._outputs = window.outputs(request, sent)
        self._started = False

    async def asend(self, value: None) -> Any:
        self._started = True
        return await self._outputs.asend(value)

    async def athrow(self, *args: Any) -> Any:
        return await self._outputs.athrow(*args)

    async def aclose(self) -> None:
        if self._started:
            await self._outputs.aclose()
        elif self._sent is not None:
            self._sent = None
            self._window.withdraw(self._request_id)

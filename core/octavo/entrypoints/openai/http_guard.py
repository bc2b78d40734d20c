"""The HTTP connection layer's limits: open connections, time to send a request's head,
and its size (431), enforced in uvicorn's h11 protocol before any request reaches the app.

Why here and not in the app: a client that never finishes its headers never becomes a
request, so no middleware sees it. Without these limits a few thousand half-sent requests
held every file descriptor and a 1 MiB header got the connection reset instead of an answer
(tests/e2e/test_serve_limits.py:
``test_slow_clients_are_dropped_and_health_answers_meanwhile``,
``test_connections_past_the_cap_are_closed``, ``test_a_huge_header_gets_431``,
``test_a_body_over_the_limit_sent_at_once_gets_413_not_a_reset``).

It subclasses uvicorn's private ``H11Protocol``: core/pyproject.toml pins uvicorn and h11 to
the releases tests/core/entrypoints/test_http_guard_upstream.py checked.

- Past ``max_connections`` open connections a new one is closed at once (logged, rate
  limited), so the descriptors left serve the clients already connected, health probes too.
- A connection must deliver a complete request head within ``header_timeout_s`` of opening
  (or of its previous response, for keep-alive), else it is answered 408 and closed.
- A head over ``MAX_HEAD_BYTES`` is answered 431, other malformed requests 400, in OpenAI's
  error shape. h11 checks its buffer only while a head is incomplete, so a head that arrives
  in one read (100 KiB) is measured here first.
- A connection closed while the client may still be sending (an error answered before the
  whole body or head was read: 413, 431) closes lingering, as nginx does: the write side is
  shut and what still arrives is read and dropped for up to ``LINGER_S``. Closed at once, the
  unread bytes make the kernel send a reset, which can destroy the answer before the client
  reads it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import resource
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from octavo.entrypoints.openai.errors import error_body
from octavo.logger import RateLimitFilter

logger = logging.getLogger(__name__)
logger.addFilter(RateLimitFilter())
# uvicorn's "Invalid HTTP request received" and asyncio's accept() errors (EMFILE) repeat
# once per bad connection: the first of each kind is logged, then a count every 10 s.
for _name in ("uvicorn.error", "asyncio"):
    logging.getLogger(_name).addFilter(RateLimitFilter())

MAX_HEAD_BYTES = 64 * 1024  # request line plus headers; h11's default is 16 KiB
HEAD_TOO_LARGE = f"the request's headers exceed {MAX_HEAD_BYTES} bytes"
_HEAD_END = re.compile(rb"\n\r?\n")  # the blank line that ends a head, as h11 finds it
LINGER_S = 2.0  # how long a refused client may go on sending before the connection is cut
FD_RESERVE = 64  # descriptors kept free for the engine's sockets, logs and model files


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit; returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def default_max_connections() -> int:
    """What the descriptor limit allows, less a reserve for everything else."""
    return max(raise_fd_limit() - FD_RESERVE, 1)


class _LingeringTransport:
    """The transport as uvicorn's request cycle sees it: ``close`` goes through the
    protocol, which lingers when the client may still be sending; the rest is the real
    transport's."""

    def __init__(self, protocol: GuardedH11Protocol, transport: asyncio.Transport) -> None:
        self._protocol = protocol
        self._transport = transport

    def close(self) -> None:
        self._protocol.close_connection()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the connection limits above (``limits`` is set on the
    class by ``protocol_class``)."""

    limits: ConnectionLimits

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._protocol_error: h11.RemoteProtocolError | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._raw_transport: asyncio.Transport | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self.lingering = False
        next_event = self.conn.next_event

        def remembering_next_event() -> Any:  # what went wrong decides 400 or 431
            try:
                return next_event()
            except h11.RemoteProtocolError as exc:
                self._protocol_error = exc
                raise

        self.conn.next_event = remembering_next_event  # type: ignore[method-assign]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            logger.warning("refused a connection: %d are open (--max-connections)",
                           len(self.connections))
            transport.abort()
            return
        super().connection_made(transport)
        self._raw_transport = transport
        self.transport = _LingeringTransport(self, transport)  # type: ignore[assignment]
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:  # refused in connection_made
            return
        self._cancel_head_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def eof_received(self) -> None:
        if self.lingering:  # the client is done sending: nothing left to wait for
            self._close_now()
            return
        super().eof_received()

    def data_received(self, data: bytes) -> None:
        if self.lingering:  # the rest of a refused request: read and dropped
            return
        if self.conn.their_state is h11.IDLE and self._head_too_large(data):
            self._send_error(431, HEAD_TOO_LARGE)
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head is complete (or failed)
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._await_head()  # the next request on this keep-alive connection

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 could not parse, with h11's status (431 for a
        head over the limit) and an OpenAI-shaped body."""
        error = self._protocol_error
        status = error.error_status_hint if error is not None else 400
        reason = str(error) if error is not None and str(error) else msg
        if status == 431:
            reason = HEAD_TOO_LARGE
        self._send_error(status, reason)

    def close_connection(self) -> None:
        """Close, lingering if the client may still be sending (its body was not read, or
        its head was refused): see the module's docstring."""
        if self.lingering:
            return
        if self.conn.their_state in (h11.SEND_BODY, h11.ERROR):
            self._linger()
        else:
            self._close_now()

    def _linger(self) -> None:
        transport = self._real_transport()
        if transport.is_closing():
            return
        self.lingering = True
        self._cancel_head_timer()
        if transport.can_write_eof():
            transport.write_eof()  # after the answer already written: the client reads it
        transport.resume_reading()  # uvicorn pauses reading while a body waits for the app
        self._linger_timer = self.loop.call_later(LINGER_S, self._close_now)

    def _close_now(self) -> None:
        self._real_transport().close()

    def _real_transport(self) -> asyncio.Transport:
        assert self._raw_transport is not None  # set in connection_made
        return self._raw_transport

    def _head_too_large(self, data: bytes) -> bool:
        """Whether the head being received, with ``data``, is over ``MAX_HEAD_BYTES``. What
        h11 buffers is under the limit (it refuses more), so at most ~2 x 64 KiB is looked at."""
        window = (self.conn.trailing_data[0] + data[:MAX_HEAD_BYTES + 1])[:MAX_HEAD_BYTES + 1]
        return len(window) > MAX_HEAD_BYTES and not _HEAD_END.search(window, 0, MAX_HEAD_BYTES)

    def _await_head(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s,
                                                self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        logger.warning("closed a connection that sent no complete request head in %g s "
                       "(--header-timeout)", self.limits.header_timeout_s)
        if self.conn.trailing_data[0]:  # a head was begun: say why it is cut
            self._send_error(408, f"the request head did not arrive within "
                                  f"{self.limits.header_timeout_s:g} s")
        else:
            self.transport.close()  # an idle connection: nothing to answer

    def _send_error(self, status: int, message: str) -> None:
        """Answer ``status`` and close, written raw: h11 refuses to send a response to a
        request it never parsed."""
        body = error_body(status, message).model_dump_json().encode()
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                "content-type: application/json\r\nconnection: close\r\n"
                f"content-length: {len(body)}\r\n\r\n")
        self.transport.write(head.encode() + body)
        if status == 408:  # a slow client: it is not sending, so no reason to wait for it
            self._close_now()
        else:
            self._linger()

def protocol_class(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, bound to ``limits``."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})

"""What ``octavo.entrypoints.openai.http_guard`` relies on in uvicorn's private h11 protocol
and in h11, checked against the installed releases: core/pyproject.toml pins both to the
releases this passed with, and a new release is let in only once it passes here."""

from __future__ import annotations

import asyncio
import inspect

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle
from uvicorn.server import ServerState

from octavo.entrypoints.openai.http_guard import ConnectionLimits, protocol_class


def parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_the_h11_protocol_methods_the_guard_overrides_keep_their_signatures() -> None:
    assert parameters(H11Protocol.__init__) == ["self", "config", "server_state",
                                                "app_state", "_loop"]
    expected = {"connection_made": ["self", "transport"],
                "connection_lost": ["self", "exc"],
                "data_received": ["self", "data"],
                "eof_received": ["self"],
                "on_response_complete": ["self"],
                "send_400_response": ["self", "msg"]}
    for name, params in expected.items():
        assert parameters(getattr(H11Protocol, name)) == params, name


async def built_protocol() -> H11Protocol:
    async def app(scope: dict, receive: object, send: object) -> None:
        del scope, receive, send

    config = Config(app=app)
    config.load()
    guarded = protocol_class(ConnectionLimits(max_connections=4, header_timeout_s=1.0))
    return guarded(config, ServerState(), {}, asyncio.get_running_loop())


def test_the_protocol_state_the_guard_reads_is_there() -> None:
    protocol = asyncio.run(built_protocol())
    # Set by H11Protocol.__init__: the connection set shared by the server, h11's parser,
    # the loop; transport comes with connection_made.
    assert isinstance(protocol.connections, set)
    assert isinstance(protocol.conn, h11.Connection)
    assert isinstance(protocol.loop, asyncio.AbstractEventLoop)
    assert callable(protocol.conn.next_event)
    assert protocol.conn.their_state is h11.IDLE
    data, closed = protocol.conn.trailing_data
    assert data == b"" and closed is False


def test_the_request_cycle_closes_through_the_protocols_transport() -> None:
    """The lingering close wraps ``protocol.transport``: the request cycle must take that
    one (not the one ``connection_made`` got) and close the connection through it."""
    handle_events = inspect.getsource(H11Protocol.handle_events)
    assert "transport=self.transport" in handle_events
    assert "self.transport.close()" in inspect.getsource(RequestResponseCycle.send)


def test_h11s_error_carries_the_status_the_guard_answers() -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16)
    conn.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 64)
    try:
        conn.next_event()
    except h11.RemoteProtocolError as exc:
        assert exc.error_status_hint == 431
    else:
        raise AssertionError("h11 accepted a head over its limit")

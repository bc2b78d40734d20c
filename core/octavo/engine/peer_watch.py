"""Whose TCP connection of a bound ZMQ socket ended, from the socket's monitor.

A bound socket's monitor reports every peer's connection - authenticated or not, a port
scanner's included - with the connection's file descriptor: ``EVENT_ACCEPTED`` when it
opens, ``EVENT_DISCONNECTED`` when it ends. So that only a known peer's disconnect counts,
the caller ``claim``s the connection a message of that peer came on (the message's
``SRCFD``: only a peer that passed the socket's authentication can deliver one), and
``ended`` reports the ends of claimed connections only.

Events are applied in the order the socket's I/O thread emitted them, and a connection's
``EVENT_ACCEPTED`` is emitted before any of its messages can be received: so after ``ended``
has read every queued event, a descriptor number in ``_closed`` belongs to a connection that
ended, never to a later one that reused the number.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

Owner = TypeVar("Owner")


class ConnectionWatch(Generic[Owner]):
    """The connections of ``socket`` (bound, TCP) and which of them are whose."""

    def __init__(self, socket: zmq.asyncio.Socket) -> None:
        self.monitor = socket.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._events: zmq.Socket[bytes] = zmq.Socket.shadow(self.monitor.underlying)
        self._closed: set[int] = set()  # descriptors whose connection ended (none reopened)
        self._owners: dict[int, Owner] = {}

    def claim(self, frame: zmq.Frame, owner: Owner) -> bool:
        """The connection ``frame`` (received with ``copy=False``) came on is ``owner``'s;
        False when it has ended already. Call ``ended`` between receiving the frame and
        this: it reads the events queued by then, the connection's ``EVENT_ACCEPTED`` and
        any earlier end of a connection with the same descriptor number among them."""
        fd = frame.get(zmq.SRCFD)
        if fd in self._closed:
            return False
        self._owners[fd] = owner
        return True

    def release(self, owner: Owner) -> None:
        """``owner``'s connection no longer matters (it left the handshake, say)."""
        for fd in [fd for fd, who in self._owners.items() if who == owner]:
            del self._owners[fd]

    def ended(self) -> list[Owner]:
        """The owners whose connection ended, among the events queued now (no waiting)."""
        gone: list[Owner] = []
        while True:
            try:
                frames = self._events.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return gone
            event = parse_monitor_message(frames)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._closed.discard(fd)
                continue
            self._closed.add(fd)
            if (owner := self._owners.pop(fd, None)) is not None:
                gone.append(owner)

    def close(self) -> None:
        self.monitor.close(linger=0)

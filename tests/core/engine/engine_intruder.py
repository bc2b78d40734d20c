"""A local process trying the engine's sockets (run by ``test_engine_sockets``; it stands
for ``shared/probe/zmq_probe.py`` against the ipc sockets).

    engine_intruder.py eavesdrop ADDRESS SECONDS CREDENTIALS   # a PULL: count what arrives
    engine_intruder.py inject ADDRESS SECONDS CREDENTIALS      # a PUSH: send garbage

CREDENTIALS: ``none`` (no security mechanism), ``stranger`` (CURVE with the real server key,
read as JSON from stdin, and a keypair of its own) or ``core`` (the core's own keypair, from
stdin too: a peer that is let in). Prints ``ready`` once connected, then one JSON line: the
messages received or sent and the handshake events its socket monitor saw.
"""

from __future__ import annotations

import json
import sys
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

GARBAGE = [
    [b"\x09", b"junk"],  # an unknown kind
    [b"\x00", b"\xff\xfe"],  # not msgpack
    [b"\x00", b"\x93\x01\x02\x03"],  # msgpack of the wrong shape
    [b"\x01"],  # one frame
    [b"\x00", b"", b"extra"],  # three frames
]


def secure(socket: zmq.Socket, credentials: str) -> None:
    if credentials == "none":
        return
    keys = json.loads(sys.stdin.readline())
    socket.curve_serverkey = keys["server_public_key"].encode()
    if credentials == "core":
        public, secret = keys["public_key"].encode(), keys["secret_key"].encode()
    else:
        public, secret = zmq.curve_keypair()
    socket.curve_publickey, socket.curve_secretkey = public, secret


def handshake_events(monitor: zmq.Socket) -> list[str]:
    events = []
    while monitor.poll(0):
        event = recv_monitor_message(monitor)["event"]
        if "HANDSHAKE" in event.name:
            events.append(event.name)
    return events


def main() -> None:
    mode, address, seconds, credentials = sys.argv[1:]
    context = zmq.Context()
    socket = context.socket(zmq.PULL if mode == "eavesdrop" else zmq.PUSH)
    socket.setsockopt(zmq.LINGER, 0)
    secure(socket, credentials)
    monitor = socket.get_monitor_socket()
    socket.connect(address)
    time.sleep(0.5)  # the handshake
    print("ready", flush=True)
    received = sent = 0
    deadline = time.monotonic() + float(seconds)
    if mode == "inject":
        for message in GARBAGE * 20:
            try:
                socket.send_multipart(message, zmq.NOBLOCK)
                sent += 1
            except zmq.Again:  # no peer let it in
                pass
    while (left := deadline - time.monotonic()) > 0:
        if mode == "eavesdrop" and socket.poll(int(left * 1000) + 1):
            socket.recv_multipart()
            received += 1
        else:
            time.sleep(left)
    print(json.dumps({"received": received, "sent": sent, "events": handshake_events(monitor)}),
          flush=True)
    socket.disable_monitor()
    context.destroy(linger=0)


if __name__ == "__main__":
    main()

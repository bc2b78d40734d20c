"""The handshake of a headless node's engines with the front end, and what it checks.

A headless node (``octavo serve --headless``) runs data-parallel engines for a front end on
another node. Each engine joins over one ZMQ DEALER -> ROUTER connection to the front
end's ``--data-parallel-address:--data-parallel-rpc-port``:

1. ``Knock``; the front end answers ``Challenge``: a fresh nonce bound to this connection
   (``ChallengeIssuer``), so a ``Hello`` captured on one connection is worth nothing on
   another, nor against a later front end;
2. ``Hello`` (the engine's rank, its ``identity``: the model's fingerprint and every setting
   that must match, the challenge, a fresh nonce), sealed with an HMAC of the shared secret
   (``--data-parallel-secret``) over the challenge;
3. the front end checks the challenge and the seal (a wrong secret is refused, saying so),
   the protocol, the rank (one of the remote ranks, not taken) and the identity key by key
   (a refusal names what differs); then answers ``Welcome`` (its nonce and the TCP
   addresses of the two sockets it bound for this engine), sealed over the engine's
   nonce - or ``Refused``;
4. both ends derive the CURVE keys of those sockets from the secret and the two nonces
   (``CurveKeys.derive``); no key travels. The node starts the engine core, which connects;
5. once it has loaded the model: ``Ready`` (or ``Failed`` with the load error), sealed over
   both nonces, and the front end serves it.

Nothing in a message is unpickled: they are msgspec JSON of the plain dataclasses below,
and no frame on the join port may exceed ``MAX_FRAME_BYTES`` (the socket drops a peer that
sends a longer one before buffering it).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from octavo.config import EngineConfig
from octavo.engine.errors import HandshakeError
from octavo.version import __version__

PROTOCOL = 2
SECRET_ENV = "OCTAVO_DATA_PARALLEL_SECRET"
_SAMPLE_BYTES = 1 << 20  # of each end of a weights file, for its fingerprint
MAX_FRAME_BYTES = 16 << 10  # of any message on the join port (a Hello is about 1 KB)
MAX_REASON_CHARS = 4000  # of the reason in a Failed, to stay within MAX_FRAME_BYTES


@dataclass
class Knock:
    """The engine asks for a challenge (unsealed: it proves nothing)."""


@dataclass
class Challenge:
    nonce: str  # hex, bound to the connection it was sent on


@dataclass
class Hello:
    rank: int
    identity: dict[str, str]
    challenge: str  # the front end's, as received; the seal is over it
    nonce: str  # hex
    node: str  # the node's host name, for the front end's messages
    protocol: int = PROTOCOL


@dataclass
class Welcome:
    nonce: str
    input_address: str
    output_address: str


@dataclass
class Refused:
    reason: str


@dataclass
class Ready:
    """The engine loaded its model (what the front end shows of it)."""

    rank: int
    pid: int  # on its own node
    platform: str
    num_blocks: int
    max_model_len: int


@dataclass
class Failed:
    reason: str


Message = Knock | Challenge | Hello | Welcome | Refused | Ready | Failed
_KINDS: dict[str, type[Any]] = {cls.__name__: cls for cls in (Knock, Challenge, Hello, Welcome,
                                                             Refused, Ready, Failed)}
_UNSEALED = (Knock, Challenge, Refused)  # sent before (or instead of) proving the secret


@dataclass
class Envelope:
    kind: str
    body: dict[str, Any]
    seal: str = ""  # HMAC-SHA256 of kind, body and the salt, hex


def new_nonce() -> str:
    return secrets.token_hex(16)


def seal(message: Message, secret: bytes, salt: str = "") -> bytes:
    """``message`` encoded and sealed with the secret (over ``salt``: the nonces so far)."""
    kind, body = type(message).__name__, asdict(message)
    return msgspec.json.encode(Envelope(kind, body, _mac(secret, kind, body, salt)))


def unseal(data: bytes, secret: bytes, salt: str = "") -> Message:
    """The message; ``HandshakeError`` when it does not decode or its seal is wrong (a
    ``Hello``'s seal is over its own ``challenge``, whatever ``salt`` says)."""
    try:
        envelope = msgspec.json.decode(data, type=Envelope)
        cls = _KINDS[envelope.kind]
        message = msgspec.convert(envelope.body, type=cls)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as exc:
        raise HandshakeError(f"an unreadable handshake message ({exc})") from None
    if isinstance(message, Hello):
        salt = message.challenge  # which the front end checks is one it issued
    if not isinstance(message, _UNSEALED) and not hmac.compare_digest(
            envelope.seal, _mac(secret, envelope.kind, envelope.body, salt)):
        raise HandshakeError("the handshake's seal does not match: the two nodes were given "
                             "different --data-parallel-secret values")
    return message  # type: ignore[no-any-return]


class ChallengeIssuer:
    """The front end's challenges, with no state per peer: a nonce and its MAC (under a key
    made for this front end) over the ZMQ routing id of the connection it was issued on. A
    challenge is good only on that connection of this front end, so a replayed Hello - on
    another connection, or to a later front end - fails, and a flood of ``Knock`` costs no
    memory."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def issue(self, peer: bytes) -> Challenge:
        token = new_nonce()
        return Challenge(token + self._tag(peer, token))

    def verify(self, peer: bytes, challenge: str) -> bool:
        token, tag = challenge[:32], challenge[32:]
        return hmac.compare_digest(tag, self._tag(peer, token))

    def _tag(self, peer: bytes, token: str) -> str:
        return hmac.new(self._key, peer + token.encode(), hashlib.sha256).hexdigest()


def _mac(secret: bytes, kind: str, body: dict[str, Any], salt: str) -> str:
    payload = msgspec.json.encode([kind, body, salt])
    return hmac.new(secret, payload, hashlib.sha256).hexdigest()


def model_fingerprint(path: Path) -> str:
    """The model's name and a digest of its files (sizes, config, both ends of each weights
    file): the same model at different paths on two nodes matches, another does not."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.relative_to(path) if file != path else file.name}:{size}"
                      .encode())
        with file.open("rb") as handle:
            if file.suffix == ".json" or size <= 2 * _SAMPLE_BYTES:
                digest.update(handle.read())
            else:
                digest.update(handle.read(_SAMPLE_BYTES))
                handle.seek(size - _SAMPLE_BYTES)
                digest.update(handle.read())
    return f"{path.name} (sha256 {digest.hexdigest()[:16]})"


def engine_identity(config: EngineConfig, model_path: Path) -> dict[str, str]:
    """What must be the same on the front end and every engine: the model, the Octavo
    version, and the settings that shape what an engine computes or accepts."""
    parallel = config.parallel
    return {
        "octavo version": __version__,
        "model": model_fingerprint(model_path),
        "dtype": config.model.dtype,
        "max_model_len": str(config.model.max_model_len),
        "block_size": str(config.cache.block_size),
        "tensor_parallel_size": str(parallel.tensor_parallel_size),
        "pipeline_parallel_size": str(parallel.pipeline_parallel_size),
        "sequence_parallel_size": str(parallel.sequence_parallel_size),
        "data_parallel_size": str(parallel.data_parallel_size),
        "speculative_config": repr(config.speculative),
        "max_num_seqs": str(config.scheduler.max_num_seqs),
    }


def identity_mismatch(ours: dict[str, str], theirs: dict[str, str]) -> str | None:
    """What differs, in words, or None."""
    differing = [f"{key}: front end {ours.get(key)!r}, this engine {theirs.get(key)!r}"
                 for key in sorted(set(ours) | set(theirs)) if ours.get(key) != theirs.get(key)]
    return "; ".join(differing) or None

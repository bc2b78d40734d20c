"""The handshake of a headless node's engines with the front end, and what it checks.

A headless node (``octavo serve --headless``) runs data-parallel engines for a front end on
another node. Each engine joins over one ZMQ DEALER -> ROUTER connection to the front
end's ``--data-parallel-address:--data-parallel-rpc-port``:

1. ``Hello`` (the engine's rank, its ``identity``: the model's fingerprint and every setting
   that must match, a fresh nonce), sealed with an HMAC of the shared secret
   (``--data-parallel-secret``);
2. the front end checks the seal (a wrong secret is refused, saying so), the protocol, the
   rank (one of the remote ranks, not taken) and the identity key by key (a refusal names
   what differs); then answers ``Welcome`` (its nonce and the TCP addresses of the two
   sockets it bound for this engine), sealed over the engine's nonce - or ``Refused``;
3. both ends derive the CURVE keys of those sockets from the secret and the two nonces
   (``CurveKeys.derive``); no key travels. The node starts the engine core, which connects;
4. once it has loaded the model: ``Ready`` (or ``Failed`` with the load error), sealed over
   both nonces, and the front end serves it.

Nothing in a message is unpickled: they are msgspec JSON of the plain dataclasses below.
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

PROTOCOL = 1
SECRET_ENV = "OCTAVO_DATA_PARALLEL_SECRET"
_SAMPLE_BYTES = 1 << 20  # of each end of a weights file, for its fingerprint


@dataclass
class Hello:
    rank: int
    identity: dict[str, str]
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


Message = Hello | Welcome | Refused | Ready | Failed
_KINDS: dict[str, type[Any]] = {cls.__name__: cls for cls in (Hello, Welcome, Refused,
                                                             Ready, Failed)}


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
    """The message; ``HandshakeError`` when it does not decode or its seal is wrong."""
    try:
        envelope = msgspec.json.decode(data, type=Envelope)
        cls = _KINDS[envelope.kind]
        message = msgspec.convert(envelope.body, type=cls)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as exc:
        raise HandshakeError(f"an unreadable handshake message ({exc})") from None
    if not isinstance(message, Refused) and not hmac.compare_digest(
            envelope.seal, _mac(secret, envelope.kind, envelope.body, salt)):
        raise HandshakeError("the handshake's seal does not match: the two nodes were given "
                             "different --data-parallel-secret values")
    return message  # type: ignore[no-any-return]


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
        "data_parallel_size": str(parallel.data_parallel_size),
        "speculative_config": repr(config.speculative),
        "max_num_seqs": str(config.scheduler.max_num_seqs),
    }


def identity_mismatch(ours: dict[str, str], theirs: dict[str, str]) -> str | None:
    """What differs, in words, or None."""
    differing = [f"{key}: front end {ours.get(key)!r}, this engine {theirs.get(key)!r}"
                 for key in sorted(set(ours) | set(theirs)) if ours.get(key) != theirs.get(key)]
    return "; ".join(differing) or None

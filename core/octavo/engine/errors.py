"""Every error the engine raises to its callers, in one place.

Who raises what, and whose fault it is:

- ``InvalidRequestError`` (a ``ValueError``): the request cannot be served as asked - a field,
  a limit, something its platform refuses. Raised in the front end before the request is
  sent, or sent back by the core for a request it refused on arrival. The client's fault: a
  400.
- ``StepError``: raised by ``EngineCore.step()`` in the process that runs the step; the
  step's requests were aborted and the engine goes on with the others.
- ``EngineStepError``: what one of those requests fails with at its client (``AsyncLLM``,
  ``LLM``): the engine's fault, not the client's - a 500.
- ``EngineDeadError``: the engine core process is gone; no request can be served any more.
- ``EngineStartError``: the core process could not start (a load error, a handshake that
  never came); its message is the reason.
- ``HandshakeError``: a data-parallel handshake message that cannot be read or whose seal
  does not match (``octavo.engine.dp_handshake``).
"""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """The request cannot be served as asked; the message says which field and why."""


class StepError(RuntimeError):
    """A step failed; its requests (``request_ids``) were aborted, and the engine can serve
    the others."""

    def __init__(self, request_ids: list[str], cause: Exception) -> None:
        super().__init__(f"a step of {len(request_ids)} request(s) failed: "
                         f"{type(cause).__name__}: {cause}")
        self.request_ids = request_ids
        self.cause = cause


class EngineStepError(RuntimeError):
    """A step of the request failed inside the engine core: the engine's fault, not the
    client's (a 500, where a refused request is a 400). The core aborted the request and
    serves the others."""


class EngineDeadError(RuntimeError):
    """The engine core process is gone; no request can be served any more."""


class EngineStalledError(EngineDeadError):
    """The request's engine has had work and not finished a step for longer than
    ``--engine-stall-timeout``, and ``--engine-stall-action fail`` ended its requests."""


class EngineStartError(RuntimeError):
    """The core process could not start; the message is the reason (e.g. a load error)."""


class HandshakeError(RuntimeError):
    """A handshake message that cannot be read or whose seal does not match."""

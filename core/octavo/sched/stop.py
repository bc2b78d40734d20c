"""When a request stops generating, judged from its newest output token.

Token-level stops only; stop *strings* need detokenized text and are the front-end
``OutputProcessor``'s job.
"""

from __future__ import annotations

from octavo.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> tuple[RequestStatus, int | None] | None:
    """The finished status and stop reason (the stop token id, if a ``stop_token_ids``
    entry ended it), or ``None`` to keep generating.

    Length first, as vLLM: a request out of room finishes with "length" even if its last
    token was EOS. EOS and stop tokens count only from ``min_tokens`` outputs on (the
    sampler also masks them before that; this is the scheduler's own guard).
    """
    params = request.sampling_params
    at_max_tokens = params.max_tokens is not None and request.num_output_tokens >= params.max_tokens
    if at_max_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH, None
    if request.num_output_tokens < params.min_tokens:
        return None
    last_token = request.output_token_ids[-1]
    if not params.ignore_eos and last_token == request.eos_token_id:
        return RequestStatus.FINISHED_STOPPED, None
    if last_token in params.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED, last_token
    return None

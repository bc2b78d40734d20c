"""Stop conditions, through the scheduler with a runner that samples scripted tokens."""

from __future__ import annotations

import numpy as np
import pytest

from octavo.outputs import LogprobsLists
from tests.core.scheduler_fakes import FakeRunner, make_request, make_scheduler, run_to_completion

BS = 4
EOS = 2
SCRIPT = [7, EOS, 9, 11, EOS, 13, 15, 17, 19, 21]


def _generate(max_model_len: int = 64, prompt_len: int = 5, **params):
    """The tokens and final output of one request whose runner samples ``SCRIPT``."""
    scheduler = make_scheduler(num_blocks=32, max_model_len=max_model_len, block_size=BS)
    params.setdefault("max_tokens", len(SCRIPT))
    scheduler.add_request(make_request("r", list(range(100, 100 + prompt_len)),
                                       eos_token_id=EOS, **params))
    runner = FakeRunner(BS, next_token=lambda request_id, n, fingerprint: SCRIPT[n])
    result = run_to_completion(scheduler, runner)
    assert scheduler.kv_manager.num_free_blocks == 32  # finished requests free their blocks
    return result.tokens["r"], result.outputs["r"][-1]


@pytest.mark.parametrize("params, tokens, finish_reason, stop_reason", [
    ({"ignore_eos": False}, SCRIPT[:2], "stop", None),
    ({"ignore_eos": True}, SCRIPT, "length", None),
    ({"ignore_eos": False, "min_tokens": 3}, SCRIPT[:5], "stop", None),
    ({"ignore_eos": True, "stop_token_ids": [11, 13]}, SCRIPT[:4], "stop", 11),
    ({"ignore_eos": True, "stop_token_ids": [7], "min_tokens": 1}, SCRIPT[:1], "stop", 7),
    ({"ignore_eos": True, "stop_token_ids": [9], "min_tokens": 4}, SCRIPT, "length", None),
    ({"ignore_eos": True, "max_tokens": 3}, SCRIPT[:3], "length", None),
    ({"ignore_eos": False, "max_tokens": 2}, SCRIPT[:2], "length", None),  # length first
])
def test_stop_conditions(params, tokens, finish_reason, stop_reason) -> None:
    out_tokens, last = _generate(**params)
    assert out_tokens == tokens
    assert (last.finish_reason, last.stop_reason) == (finish_reason, stop_reason)


def test_max_model_len_ends_generation() -> None:
    out_tokens, last = _generate(max_model_len=8, prompt_len=5, ignore_eos=True)
    assert out_tokens == SCRIPT[:3] and last.finish_reason == "length"


def test_no_max_tokens_runs_to_max_model_len() -> None:
    out_tokens, last = _generate(max_model_len=12, prompt_len=5, ignore_eos=True,
                                 max_tokens=None)
    assert out_tokens == SCRIPT[:7] and last.finish_reason == "length"


def test_logprobs_follow_the_tokens_kept() -> None:
    """A step may return several tokens (speculative decoding); a stop inside them drops the
    rest, and their logprob rows with them."""

    class TwoTokensWithLogprobs(FakeRunner):
        def execute(self, so):
            output = super().execute(so)
            for request_id, tokens in zip(output.req_ids, output.sampled_token_ids):
                if tokens:
                    tokens[:] = [11, 12]
                    rows = np.array([[11, 1], [12, 1]])
                    output.logprobs[request_id] = LogprobsLists(
                        rows, np.array([[-0.5, -0.1], [-0.7, -0.2]], dtype=np.float32),
                        np.array([2, 2]))
                else:
                    output.prompt_logprobs[request_id] = LogprobsLists(
                        np.zeros((4, 2), dtype=np.int64), np.zeros((4, 2), np.float32),
                        np.ones(4, dtype=np.int64))
            return output

    scheduler = make_scheduler(num_blocks=32, max_model_len=64, block_size=BS,
                               max_num_batched_tokens=4)
    scheduler.add_request(make_request("r", list(range(100, 106)), max_tokens=10,
                                       stop_token_ids=[11]))
    result = run_to_completion(scheduler, TwoTokensWithLogprobs(BS))
    prompt_step, last = result.outputs["r"]
    assert prompt_step.new_token_ids == [] and prompt_step.new_prompt_logprobs is not None
    assert last.new_token_ids == [11] and (last.finish_reason, last.stop_reason) == ("stop", 11)
    assert last.new_logprobs.token_ids.tolist() == [[11, 1]]
    assert last.new_logprobs.ranks.tolist() == [2]

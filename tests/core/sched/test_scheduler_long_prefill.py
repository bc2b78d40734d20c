"""``long_prefill_token_threshold``: one request's prefill chunk takes at most that many
tokens a step, so a long prompt leaves budget to the others (vLLM's SchedulerConfig
field). Driven by the fake runner that checks every K/V it reads."""

from __future__ import annotations

import random

import click
import pytest
from click.testing import CliRunner

from octavo.config import ConfigError, EngineConfig
from octavo.entrypoints.engine_args import build_config, engine_options
from octavo.outputs import SchedulerOutput
from octavo.testing.seeds import draw_seed
from tests.core.scheduler_fakes import FakeRunner, make_request, make_scheduler, run_to_completion

BS = 4


def _run(threshold: int, requests, check=None):
    scheduler = make_scheduler(num_blocks=512, max_model_len=512, block_size=BS,
                               max_num_seqs=8, max_num_batched_tokens=64,
                               long_prefill_token_threshold=threshold)
    for request in requests:
        scheduler.add_request(request)
    return run_to_completion(scheduler, FakeRunner(BS), check=check)


def _requests(seed: int):
    rng = random.Random(seed)
    shared = [rng.randrange(1000) for _ in range(40)]  # prefix hits start some mid-prompt
    return [make_request(f"r{i}", shared[:rng.randrange(41)]
                         + [rng.randrange(1000) for _ in range(rng.randrange(1, 200))],
                         max_tokens=rng.randrange(1, 12)) for i in range(12)]


def test_no_request_takes_more_than_the_threshold_in_a_step() -> None:
    seed = draw_seed()
    threshold = random.Random(seed).randrange(1, 40)
    print(f"seed={seed} threshold={threshold}")
    biggest: list[int] = []

    def check(so: SchedulerOutput) -> None:
        assert max(so.num_scheduled_tokens.values(), default=0) <= threshold, f"seed={seed}"
        biggest.append(max(so.num_scheduled_tokens.values(), default=0))

    capped = _run(threshold, _requests(seed), check)
    assert max(biggest) == threshold, f"seed={seed}: the threshold never bound"
    # Chunking differently changes no token (the fake runner checked every K/V read).
    assert capped.tokens == _run(0, _requests(seed)).tokens, f"seed={seed}"


def test_a_long_prompt_leaves_the_budget_to_a_new_one() -> None:
    """Off, the 300-token prompt takes the whole budget of 64 for five steps; with a
    threshold of 16 the short prompt behind it is admitted in the first step."""
    rng = random.Random(draw_seed())
    long_prompt = [rng.randrange(1000) for _ in range(300)]
    short_prompt = [rng.randrange(1000) for _ in range(10)]
    for threshold, first_step in ((0, {"long": 64}), (16, {"long": 16, "short": 10})):
        result = _run(threshold, [make_request("long", long_prompt, max_tokens=3),
                                  make_request("short", short_prompt, max_tokens=3)])
        assert result.schedules[0].num_scheduled_tokens == first_step, threshold
        if threshold:
            chunks = [so.num_scheduled_tokens["long"] for so in result.schedules
                      if "long" in so.num_scheduled_tokens]
            assert chunks[:18] == [16] * 18 and chunks[18:20] == [300 - 18 * 16, 1]


@pytest.mark.parametrize("bad", [-1, True, 2.5, "8"])
def test_a_bad_threshold_is_refused_naming_it(bad) -> None:
    with pytest.raises(ConfigError, match="long_prefill_token_threshold"):
        EngineConfig.from_kwargs(long_prefill_token_threshold=bad)


def test_the_flag_is_vllms() -> None:
    @click.command()
    @engine_options
    def command(**kwargs: object) -> None:
        click.echo(build_config(dict(kwargs)).scheduler.long_prefill_token_threshold)

    runner = CliRunner()
    assert runner.invoke(command, []).output.strip() == "0"
    result = runner.invoke(command, ["--long-prefill-token-threshold", "32"])
    assert result.output.strip() == "32", result.output

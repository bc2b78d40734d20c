"""What every contract class shares: a seed per test, and failure messages that name the
contract that broke.

Each test draws its inputs from a seed of its own (``octavo.testing.seeds``: fixed per test
by default, fresh with ``OCTAVO_TEST_SEEDS=fresh``) unless ``--octavo-seed N`` (the kit's
pytest plugin) replays one; every failure message prints the seed and that option, so a
failure seen once can be rerun as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar, NoReturn

import pytest
import torch

from octavo.testing.seeds import draw_seed

SEED_OPTION = "--octavo-seed"


def seed_of_test(config: pytest.Config) -> int:
    """The seed of one test: the replayed one, else the test's own (``seeds.draw_seed``)."""
    replayed = config.getoption("octavo_seed", default=None)
    return int(replayed) if replayed is not None else draw_seed()


@dataclass(frozen=True)
class Verdict:
    """Says which contract of which kind broke, with the seed that shows it."""

    kind: str  # "attention", "platform", "KV connector", "proposer"
    seed: int

    def broken(self, contract: str, detail: str, traceback: bool = False) -> NoReturn:
        """Fail the test: ``<kind> contract '<contract>' broken (seed ...): <detail>``.
        ``traceback``: called while handling what the code under test raised, whose
        traceback the report then shows."""
        pytest.fail(f"{self.kind} contract {contract!r} broken (seed {self.seed}; rerun with "
                    f"{SEED_OPTION}={self.seed}): {detail}", pytrace=traceback)

    def check(self, holds: bool, contract: str, detail: str) -> None:
        if not holds:
            self.broken(contract, detail)


class SeededContract:
    """Base of the contract classes: the ``octavo_seed`` fixture, the ``verdict`` of the
    running test, and one torch thread while it runs."""

    contract_kind: ClassVar[str]

    @pytest.fixture(autouse=True)
    def _one_torch_thread(self) -> Iterator[None]:
        """The contracts' tensors are small: one thread is fastest, and threads contending
        for a busy machine (a CI runner, parallel test processes) are many times slower."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)

    @pytest.fixture
    def octavo_seed(self, request: pytest.FixtureRequest) -> int:
        return seed_of_test(request.config)

    @pytest.fixture
    def verdict(self, octavo_seed: int) -> Verdict:
        return Verdict(self.contract_kind, octavo_seed)

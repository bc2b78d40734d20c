"""The conformance kit's pytest plugin (entry point ``octavo = "octavo.testing.plugin"`` in
the ``pytest11`` group): ``--octavo-seed N`` replays the seed a contract failure printed, and
the report header names the plugin API the contracts check.

pytest loads it in every run where Octavo is installed, so it imports nothing heavy; the
contract classes (``octavo.testing``) work without it too (seeds: ``octavo.testing.seeds``).
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("octavo", "Octavo conformance kit (octavo.testing)")
    group.addoption("--octavo-seed", type=int, default=None, metavar="N",
                    help="draw every contract test's inputs from seed N, the seed a failure "
                         "message printed (default: a fixed seed per test; fresh ones with "
                         "OCTAVO_TEST_SEEDS=fresh)")


def pytest_report_header(config: pytest.Config) -> str:
    from octavo.plugin_api import PLUGIN_API_VERSION
    from octavo.testing.seeds import fresh_seeds

    seed = config.getoption("octavo_seed")
    return (f"octavo conformance kit: plugin API {PLUGIN_API_VERSION}, "
            + (f"replaying seed {seed}" if seed is not None
               else "fresh seeds" if fresh_seeds() else "fixed seeds"))

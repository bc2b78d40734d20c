"""``KVConnectorContract``: a KV connector's save/load round trip between two engines, and its
fallback when the store fails (``octavo.plugin_api.KVConnector``), at the level of the
connector API with real KV-cache tensors and no model (``octavo.testing.kv_harness``).

A plugin runs it by subclassing it in its own tests and saying how a producer and a
consumer engine reach one store::

    class TestMyConnector(KVConnectorContract):
        connector = MyConnector

        def make_config(self, role, store):
            return KVTransferConfig("my_connector", role, {"path": str(store)})

The store's failures are made by :meth:`KVConnectorContract.damage_store`, which by default
works on the files under ``store``; a connector whose store lives elsewhere overrides it, or
skips the damages it cannot make.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

from octavo.plugin_api import KVConnector, KVTransferConfig, get_registries
from octavo.testing.contract import SeededContract, Verdict
from octavo.testing.kv_harness import (
    CacheLayout,
    ConnectorRaised,
    Engine,
    Loaded,
    load_prompt,
    save_prompt,
)

DAMAGES = ("missing", "corrupt", "unreachable")
NEVER_RAISES = "never raises into the engine"
REPORTS_LOAD = "get_finished reports every load it started, failed ones too"
FINDS = "a consumer finds what a producer saved"
# (full blocks, more tokens) of the prompt, and blocks of it in the consumer's own cache.
ROUND_TRIPS = {"block-aligned prompt": (4, 0, 0), "ragged prompt": (3, 5, 0),
               "local prefix hit": (3, 5, 1)}


class KVConnectorContract(SeededContract):
    """Subclass it, set ``connector`` and implement :meth:`make_config`."""

    contract_kind = "KV connector"
    connector: ClassVar[type[KVConnector]]
    block_size: ClassVar[int] = 16
    num_layers: ClassVar[int] = 2
    num_kv_heads: ClassVar[int] = 2
    head_dim: ClassVar[int] = 8
    num_blocks: ClassVar[int] = 48
    dtype: ClassVar[torch.dtype] = torch.float32
    device: ClassVar[str] = "cpu"
    transfer_timeout_s: ClassVar[float] = 5.0  # for a save or load to be reported

    def make_config(self, role: str, store: Path) -> KVTransferConfig:
        """The config of a ``role`` ("producer" or "consumer") engine; ``store`` is an empty
        directory the two share."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_config")

    def damage_store(self, store: Path, damage: str) -> None:
        """Make the store fail, as ``damage`` says: "missing" (the saved entries are gone),
        "corrupt" (each stored file cut to half its length, a torn write) or "unreachable"
        (the store cannot be reached at all). The default damages the files under
        ``store``, or skips where the connector keeps none there."""
        files = [path for path in store.rglob("*") if path.is_file()]
        if not files:
            pytest.skip(f"{self.connector.__name__} keeps nothing under the store directory; "
                        "override damage_store to damage its store")
        if damage == "unreachable":
            shutil.rmtree(store)
            store.write_bytes(b"")  # a file where the directory was
            return
        for path in files:
            if damage == "missing":
                path.unlink()
            else:
                path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])

    @pytest.fixture
    def store(self, tmp_path: Path) -> Path:
        path = tmp_path / "kv-store"
        path.mkdir()
        return path

    # -- the contract --------------------------------------------------------------------
    def test_registered_under_its_config_name(self, store: Path, verdict: Verdict) -> None:
        name = self.make_config("consumer", store).connector
        registry = get_registries().kv_connectors
        found = registry.get(name) if name in registry else None
        verdict.check(found is self.connector, "registered under the name its config gives",
                      f"the KV-connector registry holds {found!r} under {name!r} "
                      f"(registered: {registry.names()}); register it in "
                      "octavo_register_kv_connectors")

    def test_empty_store_matches_nothing(self, store: Path, verdict: Verdict) -> None:
        with self._engine_calls(verdict):
            consumer = self._engine("consumer", store, verdict)
            loaded = self._load(consumer, self._prompt(verdict, 4), [])
        verdict.check(loaded.matched == 0, "an empty store matches nothing",
                      f"get_num_new_matched_tokens found {loaded.matched} tokens")

    @pytest.mark.parametrize("case", list(ROUND_TRIPS))
    def test_round_trip(self, case: str, store: Path, verdict: Verdict) -> None:
        blocks, extra, local_blocks = ROUND_TRIPS[case]
        prompt = self._prompt(verdict, blocks, extra)
        with self._engine_calls(verdict):
            producer = self._engine("producer", store, verdict)
            saved = save_prompt(producer, "producer-req", prompt, self._gen(verdict),
                                self.transfer_timeout_s)
            verdict.check(saved.reported, "get_finished reports the save",
                          f"the save of a {len(prompt)}-token prompt was not reported in "
                          f"finished_sending within {self.transfer_timeout_s} s")
            consumer = self._engine("consumer", store, verdict)
            num_local = local_blocks * self.block_size
            local_kv = [kv[:, :num_local] for kv in saved.kv] if num_local else []
            loaded = self._load(consumer, prompt, local_kv)
        total = num_local + loaded.matched
        verdict.check(loaded.matched > 0, FINDS,
                      f"the consumer's lookup of the saved {len(prompt)}-token prompt "
                      f"({num_local} tokens cached locally) matched nothing")
        verdict.check(total <= len(prompt) - 1, "leaves at least the last prompt token to "
                      "compute", f"{loaded.matched} tokens matched after {num_local} local "
                      f"ones, of a {len(prompt)}-token prompt: its logits are sampled")
        verdict.check(loaded.finished and not loaded.failed, "loads what was saved",
                      f"the load was {self._outcome(loaded)}")
        self._check_loaded(consumer, loaded, saved.kv, verdict, "loads bit-exact K/V into the "
                           "request's blocks")

    def test_matches_only_saved_tokens(self, store: Path, verdict: Verdict) -> None:
        """A prompt that leaves the saved one at token ``block_size + 3`` may match at most
        the first block."""
        prompt = self._prompt(verdict, 4)
        other = list(prompt)
        diverges = self.block_size + 3
        other[diverges] = (other[diverges] + 1) % 1000
        with self._engine_calls(verdict):
            producer = self._engine("producer", store, verdict)
            save_prompt(producer, "producer-req", prompt, self._gen(verdict),
                        self.transfer_timeout_s)
            loaded = self._load(self._engine("consumer", store, verdict), other, [])
        verdict.check(loaded.matched <= diverges, "matches only tokens whose KV was saved",
                      f"a prompt that differs from the saved one at token {diverges} matched "
                      f"{loaded.matched} tokens")

    @pytest.mark.parametrize("when", ["before lookup", "after lookup"])
    @pytest.mark.parametrize("damage", DAMAGES)
    def test_damaged_store_falls_back(self, damage: str, when: str, store: Path,
                                      verdict: Verdict) -> None:
        """The store fails while the consumer runs: before it looks the prompt up, or after
        its scheduler side planned the load. The request must compute its prompt itself -
        matched nothing, or a load reported failed - never wait forever or get bad K/V."""
        prompt = self._prompt(verdict, 3, 5)
        with self._engine_calls(verdict, f"with the store {damage} {when}"):
            producer = self._engine("producer", store, verdict)
            saved = save_prompt(producer, "producer-req", prompt, self._gen(verdict),
                                self.transfer_timeout_s)
            consumer = self._engine("consumer", store, verdict)
            if when == "before lookup":
                self.damage_store(store, damage)
                loaded = self._load(consumer, prompt, [])
            else:
                loaded = self._load(consumer, prompt, [],
                                    damage=lambda: self.damage_store(store, damage))
                verdict.check(loaded.matched > 0, FINDS, "the consumer's lookup, made while "
                              "the store was intact, matched nothing")
        if not loaded.matched:
            return
        verdict.check(loaded.finished, REPORTS_LOAD,
                      f"with the store {damage} {when}, the load was {self._outcome(loaded)}: "
                      "the request would wait forever")
        if not loaded.failed:
            self._check_loaded(consumer, loaded, saved.kv, verdict,
                               "never reports a load of damaged KV as a success")

    # -- helpers -----------------------------------------------------------------------
    def _layout(self) -> CacheLayout:
        return CacheLayout(self.num_layers, self.num_blocks, self.block_size,
                           self.num_kv_heads, self.head_dim, self.dtype, self.device)

    def _engine(self, role: str, store: Path, verdict: Verdict) -> Engine:
        seed = verdict.seed + (role == "consumer")
        return Engine.start(self.connector, self.make_config(role, store), self._layout(),
                            seed)

    def _gen(self, verdict: Verdict) -> torch.Generator:
        return torch.Generator().manual_seed(verdict.seed)

    def _prompt(self, verdict: Verdict, blocks: int, extra: int = 0) -> list[int]:
        rng = np.random.default_rng(verdict.seed)
        return rng.integers(0, 1000, blocks * self.block_size + extra).tolist()

    def _load(self, consumer: Engine, prompt: list[int], local_kv: list[torch.Tensor],
              damage: Callable[[], None] | None = None) -> Loaded:
        return load_prompt(consumer, "consumer-req", prompt, local_kv, self.transfer_timeout_s,
                           damage)

    @contextmanager
    def _engine_calls(self, verdict: Verdict, situation: str = "") -> Iterator[None]:
        """Turns a connector call that raised into the contract it broke."""
        try:
            yield
        except ConnectorRaised as raised:
            cause = raised.__cause__
            verdict.broken(NEVER_RAISES, f"{raised.call} raised {cause!r}"
                           + (f" {situation}" if situation else "")
                           + "; an exception there stops the engine", traceback=True)

    @staticmethod
    def _outcome(loaded: Loaded) -> str:
        if loaded.finished:
            return "reported failed" if loaded.failed else "reported finished"
        return ("reported failed but never finished" if loaded.failed
                else "never reported finished")

    def _check_loaded(self, consumer: Engine, loaded: Loaded, saved: list[torch.Tensor],
                      verdict: Verdict, contract: str) -> None:
        """The loaded tokens hold the saved K/V exactly; no block outside the request's
        changed."""
        layout, total = consumer.layout, loaded.num_local + loaded.matched
        others = sorted(set(range(layout.num_blocks)) - set(loaded.block_ids))
        for layer, (cache, before) in enumerate(zip(consumer.caches, loaded.before)):
            got = layout.read(cache, loaded.block_ids, total)
            wrong = (got != saved[layer][:, :total]).flatten(2).any(-1).any(0)
            bad = wrong.nonzero().flatten().tolist()
            verdict.check(not bad, contract,
                          f"layer {layer}: tokens {bad[:8]} of the {total} loaded "
                          f"({loaded.num_local} local + {loaded.matched} matched) do not hold "
                          "the saved K/V")
            touched = [b for b in others if not torch.equal(cache[:, b], before[:, b])]
            verdict.check(not touched, "loads only into the request's blocks",
                          f"layer {layer}: blocks {touched[:8]} changed; the request's blocks "
                          f"are {loaded.block_ids}")

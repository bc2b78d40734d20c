"""``ProposerContract``: a speculative-decoding proposer keeps greedy outputs token-identical
to decoding without it, and proposes well-formed drafts (``octavo.plugin_api.Proposer``).

A plugin runs it by subclassing it in its own tests::

    class TestMyProposer(ProposerContract):
        speculative_config = {"method": "my_method", "num_speculative_tokens": 3}

The engines run in this process on ``model`` - by default a tiny random Llama that the kit
writes (:func:`~octavo.testing.tiny_llama.write_tiny_llama`) - over prompts that repeat part
of themselves, so that copying proposers find something to propose. A proposer that needs a
model of its own (a draft model, heads) overrides :meth:`make_speculative_config`, which gets
the target's folder and a fresh directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from octavo.plugin_api import LLM, ProposeInputs, Proposer, SamplingParams, get_registries
from octavo.testing.contract import SeededContract, Verdict
from octavo.testing.tiny_llama import write_tiny_llama

IDENTITY = "greedy outputs are token-identical with speculation on"
DRAFTS = "propose returns, per request, a list of at most num_speculative_tokens token ids"


@dataclass
class ProposeCall:
    """One ``propose`` call the engine made, as the proposer answered it."""

    req_ids: list[str]
    wants_drafts: list[bool]
    drafts: Any  # what propose returned, unchecked
    max_drafts: int
    vocab_size: int


class ProposerContract(SeededContract):
    """Subclass it and set ``speculative_config`` (or override make_speculative_config)."""

    contract_kind = "proposer"
    speculative_config: ClassVar[dict[str, Any]]
    model: ClassVar[str | None] = None  # the target model; None: the kit's tiny random Llama
    engine_kwargs: ClassVar[dict[str, Any]] = {
        "dtype": "float32", "max_num_batched_tokens": 64, "kv_cache_memory": 8 * 2**20}
    num_prompts: ClassVar[int] = 4
    max_tokens: ClassVar[int] = 24

    def make_speculative_config(self, target_model: Path, tmp_path: Path) -> dict[str, Any]:
        """The ``speculative_config`` for the target model at ``target_model``; ``tmp_path``
        is an empty directory for files it needs (say, a draft model)."""
        del target_model, tmp_path
        return dict(self.speculative_config)

    @pytest.fixture
    def target_model(self, tmp_path: Path, octavo_seed: int) -> Path:
        if self.model is not None:
            return Path(self.model)
        return write_tiny_llama(tmp_path / "target", seed=octavo_seed)

    @pytest.fixture
    def spec_config(self, target_model: Path, tmp_path: Path) -> dict[str, Any]:
        draft_dir = tmp_path / "speculative"
        draft_dir.mkdir()
        return self.make_speculative_config(target_model, draft_dir)

    def test_registered_under_its_method(self, spec_config: dict[str, Any],
                                         verdict: Verdict) -> None:
        method = str(spec_config.get("method"))
        registry = get_registries().proposers
        contract = "registered under the name that speculative_config's method gives"
        verdict.check(method in registry, contract,
                      f"no proposer {method!r} registered (registered: {registry.names()}); "
                      "register it in octavo_register_proposers")
        proposer = registry.get(method)
        verdict.check(isinstance(proposer, type) and issubclass(proposer, Proposer)
                      and proposer.name == method, contract,
                      f"{method!r} is {proposer!r}: a Proposer subclass whose name is {method!r}")
        verdict.check(not proposer.requires_model or bool(spec_config.get("model")), contract,
                      f"{proposer.__name__}.requires_model is set: speculative_config needs "
                      "its 'model'")

    def test_greedy_outputs_are_identical(self, target_model: Path,
                                          spec_config: dict[str, Any], verdict: Verdict,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
        prompts, params = self._requests(verdict.seed)
        plain = self._generate(target_model, None, prompts, params)
        calls = self._spy(spec_config, monkeypatch)
        speculative = self._generate(target_model, spec_config, prompts, params)
        for i, (want, got) in enumerate(zip(plain, speculative)):
            first = next((j for j, (a, b) in enumerate(zip(want, got)) if a != b),
                         min(len(want), len(got)))
            verdict.check(want == got, IDENTITY,
                          f"request {i} differs from token {first} on: {got[first:first + 8]} "
                          f"with {spec_config}, {want[first:first + 8]} without")
        self._check_proposed_something(calls, spec_config, verdict)

    def test_drafts_are_well_formed(self, target_model: Path, spec_config: dict[str, Any],
                                    verdict: Verdict,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
        prompts, params = self._requests(verdict.seed)
        calls = self._spy(spec_config, monkeypatch)
        self._generate(target_model, spec_config, prompts, params)
        self._check_proposed_something(calls, spec_config, verdict)
        for call in calls:
            drafts = call.drafts
            verdict.check(isinstance(drafts, list) and len(drafts) == len(call.req_ids), DRAFTS,
                          f"for requests {call.req_ids} it returned {drafts!r}")
            for req_id, wants, draft in zip(call.req_ids, call.wants_drafts, drafts):
                verdict.check(isinstance(draft, list) and len(draft) <= call.max_drafts
                              and all(type(t) is int and 0 <= t < call.vocab_size
                                      for t in draft), DRAFTS,
                              f"request {req_id}: {draft!r} (at most {call.max_drafts} python "
                              f"ints below the vocabulary size {call.vocab_size})")
                verdict.check(wants or not draft,
                              "proposes nothing for requests that want no drafts",
                              f"request {req_id} (wants_drafts False) got {draft}")

    # -- helpers -----------------------------------------------------------------------
    def _requests(self, seed: int) -> tuple[list[dict[str, Any]], list[SamplingParams]]:
        """Prompts that repeat part of themselves, greedy; every third request asks for
        logprobs, which keeps it from speculating (a mixed batch)."""
        rng = np.random.default_rng(seed)
        prompts = []
        for length in rng.integers(20, 70, self.num_prompts):
            passage = rng.integers(0, 256, int(length)).tolist()
            prompts.append({"prompt_token_ids": passage + passage[:int(length) // 2]})
        params = [SamplingParams(temperature=0.0, max_tokens=self.max_tokens, ignore_eos=True,
                                 logprobs=1 if i % 3 == 2 else None)
                  for i in range(self.num_prompts)]
        return prompts, params

    def _generate(self, target_model: Path, spec_config: dict[str, Any] | None,
                  prompts: list[dict[str, Any]], params: list[SamplingParams],
                  ) -> list[list[int]]:
        llm = LLM(model=str(target_model), speculative_config=spec_config, **self.engine_kwargs)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]

    @staticmethod
    def _spy(spec_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> list[ProposeCall]:
        """Record every ``propose`` call of the registered proposer class."""
        proposer = get_registries().proposers.get(spec_config["method"])
        original = proposer.propose
        calls: list[ProposeCall] = []

        def propose(self: Proposer, inputs: ProposeInputs) -> list[list[int]]:
            drafts = original(self, inputs)
            copied = ([list(d) if isinstance(d, list) else d for d in drafts]
                      if isinstance(drafts, list) else drafts)  # as returned, before any use
            calls.append(ProposeCall(list(inputs.req_ids), inputs.wants_drafts.tolist(),
                                     copied, self.config.max_drafts, self.context.vocab_size))
            return drafts

        monkeypatch.setattr(proposer, "propose", propose)
        return calls

    @staticmethod
    def _check_proposed_something(calls: list[ProposeCall], spec_config: dict[str, Any],
                                  verdict: Verdict) -> None:
        proposed = any(isinstance(call.drafts, list)
                       and any(isinstance(draft, list) and draft for draft in call.drafts)
                       for call in calls)
        verdict.check(proposed, "proposes drafts when the prompt invites them",
                      f"{len(calls)} propose calls with {spec_config} proposed no token: "
                      "the other checks would prove nothing")

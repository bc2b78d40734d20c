"""Verifying draft trees through the whole engine: greedy outputs stay token-identical, the
accepted nodes' KV lands where later steps read it, and the proposer is told the right
last accepted position - checked with an oracle that hides the true continuation at random
nodes of the tree (so accepted paths leave the tree's first branch), in batches with
requests that do not speculate, sampled requests, chunked prefill and preemption."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.attention.base import AttentionBackend
from octavo.config import ConfigError
from octavo.config.speculative import SpeculativeConfig
from octavo.spec_decode.tree import DraftTree
from octavo.worker.spec_decode.proposer import ProposeInputs, Proposer
from octavo.worker.spec_decode.verifier import SpecVerifier
from octavo_spec_decode.medusa import save_medusa
from octavo_spec_decode.train.data import load_target
from tests.core.tiny_models import VOCAB_SIZE
from tests.spec_decode.test_greedy_identity import ENGINE, SMALL_KV, copy_prompts
from tests.spec_decode.test_heads import draft_vocabulary, random_medusa

TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [2, 0], [0, 0, 0], [1, 0, 0], [0, 1, 0]]
MAX_TOKENS = 24


class OracleTreeProposer(Proposer):
    """Random node tokens, with the target's true greedy continuation (known from a plain
    run) written along a random path of the tree, cut at a random depth."""

    name = "test_oracle_tree"
    needs_hidden_states: ClassVar[bool] = True
    supports_token_tree: ClassVar[bool] = True
    references: ClassVar[dict[tuple[int, ...], list[int]]] = {}  # prompt -> greedy output
    rng: ClassVar[random.Random] = random.Random(0)
    accepted_off_first_branch: ClassVar[int] = 0

    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        tree = DraftTree.of(self.config)
        assert tree is not None and inputs.hidden_states is not None
        last = inputs.hidden_states[inputs.last_token_indices]
        predicted = self.context.target.compute_logits(last).argmax(-1).tolist()
        drafts: list[list[int]] = []
        for i, row in enumerate(inputs.rows.tolist()):
            tokens = inputs.token_ids[row, : int(inputs.num_tokens[i])].tolist()
            reference = self._reference(tokens)
            sampled = inputs.sampled_token_ids[i]
            if reference is not None and sampled:
                # The hidden state at the last accepted token predicts the newest one.
                assert predicted[i] == sampled[-1], (i, predicted[i], sampled)
                if len(sampled) > 1 and inputs.num_draft_tokens[i]:
                    self._count_branch(inputs, i, sampled)
            if not inputs.wants_drafts[i]:
                drafts.append([])
                continue
            drafts.append(self._tree_tokens(tree, reference, tokens))
        return drafts

    def _reference(self, tokens: list[int]) -> list[int] | None:
        """The greedy continuation after ``tokens``; None for a sampled request."""
        for prompt, output in self.references.items():
            done = len(tokens) - len(prompt)
            if tokens[:len(prompt)] == list(prompt) and output[:done] == tokens[len(prompt):]:
                return output[done:]
        return None

    def _tree_tokens(self, tree, future: list[int] | None,  # type: ignore[no-untyped-def]
                     tokens: list[int]) -> list[int]:
        nodes = [self.rng.randrange(VOCAB_SIZE) for _ in range(len(tree))]
        if future is None:
            return nodes
        children = tree.children(len(tree))
        current, depth = -1, 0
        stop = self.rng.randrange(1, 5)
        while children[current + 1] and depth < min(stop, len(future)):
            current = self.rng.choice(children[current + 1])
            nodes[current] = future[depth]
            depth += 1
        return nodes

    def _count_branch(self, inputs: ProposeInputs, i: int, sampled: list[int]) -> None:
        """Count steps whose accepted drafts were not the tree's first nodes."""
        start = int(inputs.step.metadata.query_start_loc_cpu[i])  # type: ignore[index]
        if int(inputs.last_token_indices[i]) != start + len(sampled) - 1:
            type(self).accepted_off_first_branch += 1


@pytest.fixture(scope="module")
def medusa_folder(tmp_path_factory: pytest.TempPathFactory, seed: int) -> Path:
    folder = tmp_path_factory.mktemp("medusa_tree")
    save_medusa(random_medusa(seed), folder)
    return folder


def greedy_params() -> list[SamplingParams]:
    """Greedy requests; the third asks for logprobs (no drafts); the last one samples."""
    return [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                           logprobs=1 if i == 2 else None) for i in range(4)] + \
        [SamplingParams(temperature=0.8, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True)]


@pytest.mark.parametrize("engine", [ENGINE, {**ENGINE, **SMALL_KV}], ids=["chunked", "preempted"])
def test_tree_verification_is_greedy_identical(target: Path, medusa_folder: Path, seed: int,
                                               engine: dict) -> None:
    # In the small pool, prompts of 90+ tokens: the first two cannot both finish in its 12
    # blocks (short ones sometimes did, one after the other, and nothing was preempted).
    prompts = copy_prompts(seed, 5, shortest=20 if engine is ENGINE else 60)
    params = greedy_params()
    plain = LLM(model=str(target), **engine).generate(prompts, params, use_tqdm=False)
    spec = {"method": "medusa", "model": str(medusa_folder), "num_speculative_tokens": 3,
            "speculative_token_tree": TREE}
    llm = LLM(model=str(target), speculative_config=json.dumps(spec), **engine)
    runner = llm.llm_engine.core.executor.worker.runner
    assert runner.spec is not None and runner.spec.tree is not None
    runner.spec.proposer = OracleTreeProposer(runner.spec.proposer.context)
    OracleTreeProposer.references = {tuple(p["prompt_token_ids"]): list(o.outputs[0].token_ids)
                                     for p, o in zip(prompts[:4], plain[:4])}
    OracleTreeProposer.rng = random.Random(seed)
    OracleTreeProposer.accepted_off_first_branch = 0
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs[:4]] == \
        [o.outputs[0].token_ids for o in plain[:4]], f"seed={seed}"
    assert len(outputs[4].outputs[0].token_ids) == MAX_TOKENS
    stats = llm.llm_engine.core.scheduler.spec.snapshot()
    assert stats.mean_acceptance_length > 1.5, f"seed={seed}: {stats}"
    assert len(stats.accepted_per_position) == 3  # depths, not nodes
    assert OracleTreeProposer.accepted_off_first_branch > 0, f"seed={seed}"
    if engine is not ENGINE:
        assert sum(o.metrics.num_preemptions for o in outputs) > 0


@pytest.fixture(scope="module")
def shared_head_folder(tmp_path_factory: pytest.TempPathFactory, target: Path,
                       seed: int) -> Path:
    """Heads as `octavo spec train` writes them: projections equal to the target's LM
    head, and a draft vocabulary."""
    folder = tmp_path_factory.mktemp("medusa_shared")
    heads = random_medusa(seed)
    lm_head = load_target(str(target))[0].lm_head.weight
    for head in heads:
        head[-1].weight.data.copy_(lm_head)
    heads.draft_token_ids = draft_vocabulary(seed)
    save_medusa(heads, folder)
    return folder


@pytest.mark.parametrize("heads", ["own projections", "shared LM head, draft vocabulary"])
def test_medusa_tree_drafts_each_nodes_ranked_candidate(target: Path, medusa_folder: Path,
                                                        shared_head_folder: Path, seed: int,
                                                        heads: str) -> None:
    """Real Medusa heads in a tree: the node tokens are the heads' ranked candidates (among
    the draft vocabulary, when there is one), and greedy outputs match plain decoding."""
    folder = medusa_folder if heads == "own projections" else shared_head_folder
    prompts = copy_prompts(seed, 3)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    plain = LLM(model=str(target), **ENGINE).generate(prompts, params, use_tqdm=False)
    spec = {"method": "medusa", "model": str(folder), "num_speculative_tokens": 3,
            "speculative_token_tree": TREE}
    llm = LLM(model=str(target), speculative_config=spec, **ENGINE)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == \
        [o.outputs[0].token_ids for o in plain], f"seed={seed}"
    proposer = llm.llm_engine.core.executor.worker.runner.spec.proposer
    hidden = torch.from_numpy(
        np.random.default_rng(seed).standard_normal((4, 64)).astype(np.float32))
    nodes = proposer.draft_tree(hidden)
    logits = proposer.head_logits(hidden, 3)
    for j, path in enumerate(proposer.tree.paths):
        ranked = logits[len(path) - 1].topk(path[-1] + 1, dim=-1).indices[:, -1]
        assert torch.equal(nodes[:, j], proposer.column_tokens(ranked)), (j, path)
    if folder == shared_head_folder:
        assert proposer.projection is not None and proposer.projection.token_ids is not None
        allowed = set(draft_vocabulary(seed).tolist())
        assert set(nodes.flatten().tolist()) <= allowed
        full = proposer.context.target.compute_logits(
            proposer.heads.features(hidden)[0])  # the first head over the whole vocabulary
        full[:, [t for t in range(VOCAB_SIZE) if t not in allowed]] = float("-inf")
        assert torch.equal(nodes[:, 0], full.argmax(-1)), f"seed={seed}"


def test_trees_need_a_proposer_and_backend_that_draw_them(target: Path) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 3, "speculative_token_tree": TREE}
    with pytest.raises(ConfigError, match="does not draft token trees"):
        LLM(model=str(target), speculative_config=spec, **ENGINE)
    bad = {"method": "ngram", "num_speculative_tokens": 2, "speculative_token_tree": TREE}
    with pytest.raises(ConfigError, match=r"speculative_token_tree: node \[0, 0, 0\] is deeper"):
        LLM(model=str(target), speculative_config=bad, **ENGINE)
    config = SpeculativeConfig.parse({"method": "medusa", "model": "heads",
                                      "num_speculative_tokens": 3,
                                      "speculative_token_tree": TREE})
    with pytest.raises(ConfigError, match="'chainonly' attention backend cannot verify"):
        SpecVerifier._checked_tree(config, OracleTreeProposer, ChainOnlyBackend)


class ChainOnlyBackend(AttentionBackend):
    name = "chainonly"

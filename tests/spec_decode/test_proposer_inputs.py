"""What a proposer receives (the contract EAGLE and Medusa heads build on): the hidden
states of the step, the index of each request's last accepted token, pre-norm features,
token rows and counts - checked from inside a proposer while the engine runs."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from octavo import LLM, SamplingParams
from octavo.testing.seeds import draw_seed
from octavo.worker.spec_decode.proposer import ProposeInputs, Proposer
from octavo_spec_decode.ngram import find_ngram_drafts
from tests.core.tiny_models import save_tiny_model


class CheckingProposer(Proposer):
    """n-gram drafts, after checking the inputs against the target model."""

    name = "test_checking"
    needs_hidden_states: ClassVar[bool] = True
    needs_prenorm_hidden_states: ClassVar[bool] = True
    calls: ClassVar[list[int]] = []

    def propose(self, inputs: ProposeInputs) -> list[list[int]]:
        target = self.context.target
        assert inputs.hidden_states is not None and inputs.prenorm_hidden_states is not None
        assert inputs.hidden_states.shape[0] == inputs.step.input_ids.shape[0]
        torch.testing.assert_close(target.model.norm(inputs.prenorm_hidden_states),
                                   inputs.hidden_states)
        last = inputs.hidden_states[inputs.last_token_indices]
        predicted = target.compute_logits(last).argmax(-1).tolist()
        drafts = []
        for i, row in enumerate(inputs.rows.tolist()):
            tokens = inputs.token_ids[row, : int(inputs.num_tokens[i])]
            if inputs.sampled_token_ids[i]:
                # Greedy: the newest token is the argmax at the last accepted position.
                assert predicted[i] == inputs.sampled_token_ids[i][-1]
                assert tokens[-len(inputs.sampled_token_ids[i]):].tolist() == \
                    inputs.sampled_token_ids[i]
            drafts.append(find_ngram_drafts(tokens, 2, 4, 3).tolist()
                          if inputs.wants_drafts[i] else [])
        self.calls.append(int(inputs.num_draft_tokens.sum()))
        return drafts


def test_proposer_inputs_are_consistent(tmp_path: Path) -> None:
    seed = draw_seed()
    save_tiny_model("qwen3", tmp_path, seed=seed)
    rng = np.random.default_rng(seed)
    prompts = []
    for n in (30, 50, 70):
        passage = rng.integers(0, 256, n).tolist()
        prompts.append({"prompt_token_ids": passage + passage[: n // 2]})
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain = LLM(model=str(tmp_path), dtype="float32", max_num_batched_tokens=48,
                kv_cache_memory=8 * 2**20).generate(prompts, params, use_tqdm=False)
    llm = LLM(model=str(tmp_path), dtype="float32", max_num_batched_tokens=48,
              kv_cache_memory=8 * 2**20,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    # Swap the built n-gram proposer for the checking one (speculative_config accepts only
    # the documented methods), with the same context.
    runner = llm.llm_engine.core.executor.worker.runner
    assert runner.spec is not None
    runner.spec.proposer = CheckingProposer(runner.spec.proposer.context)
    runner.model.model.keep_prenorm_hidden = True
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == \
        [o.outputs[0].token_ids for o in plain], f"seed={seed}"
    assert CheckingProposer.calls and sum(CheckingProposer.calls) > 0, f"seed={seed}"

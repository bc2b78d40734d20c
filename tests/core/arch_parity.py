"""The checks each architecture of issue 49 passes against HF transformers, fp32, on a tiny
random model built from HF's own config class.

- ``check_every_position``: the prompts flattened together in chunks (chunked prefill: each
  step advances every prompt by a chunk, over a paged cache with randomly placed blocks):
  the logits of every prompt position within ``ATOL`` of HF's one forward pass;
- ``check_engine``: the whole engine (``LLM``), greedy, prompts prefilled in chunks of a
  small token budget while others decode, a KV budget too small for all of them so requests
  are preempted and recomputed: tokens identical to HF's greedy run (a divergence only at
  a numerical tie), every step's logits within ``ATOL``;
- ``check_tensor_parallel``: the same at ``tensor_parallel_size=2`` (two worker processes),
  prompt logprobs against HF's.

HF's reference (``hf_reference``: the prompt's logits and the greedy continuation with its
KV cache) is computed once per model, by the test module's fixture, and shared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from octavo import LLM
from octavo.attention.torch_backend import TorchAttentionBackend
from octavo.models.base import CausalLM
from octavo.models.build import build_model
from octavo.models.loader import ModelLoadError, load_model_files
from octavo.request import Request
from octavo.testing.seeds import draw_seed
from octavo.worker.model_runner import ModelRunner

from ..parallel.engines import generate
from .models.test_models_parity import PagedDriver
from .parity import TIE_GAP, compare, engine_greedy
from .tiny_models import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    VOCAB_SIZE,
    randomize_norms_and_biases,
    tiny_tokenizer,
)

ATOL = 1e-4
BLOCK_SIZE = 16
MAX_TOKENS = 32
# The tiny models' shared sizes (each test module adds its architecture's own fields).
COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
              initializer_range=0.1, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
              pad_token_id=PAD_ID, tie_word_embeddings=False)
KV_BYTES_TP = 1 << 25  # per rank


def save_hf_model(config: PretrainedConfig, folder: Path, seed: int) -> PreTrainedModel:
    """The HF model of ``config`` with random weights drawn from ``seed`` - norms and biases
    too (HF's ones and zeros would hide one loaded into the wrong place) - saved to
    ``folder`` with the tiny byte tokenizer; eval mode, eager attention."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    randomize_norms_and_biases(model)
    model.eval().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return model


def random_prompts(vocab_size: int, lengths: list[int], seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=n).tolist() for n in lengths]


@dataclass
class Reference:
    """HF's run of one prompt: every prompt position's logits, then its greedy tokens and
    each step's logits (fp32)."""

    prompt_logits: torch.Tensor  # [P, vocab]
    tokens: list[int]
    step_logits: list[torch.Tensor]


@torch.inference_mode()
def hf_reference(model: PreTrainedModel, prompt: list[int], max_tokens: int,
                 before: Callable[[PreTrainedModel], None] | None = None) -> Reference:
    """One prompt through HF: a forward pass over it, then greedy steps on its KV cache.
    ``before``: called with the model first (to reset its per-generation state)."""
    if before is not None:
        before(model)
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    prompt_logits = out.logits[0].float()
    tokens, logits = [], []
    for _ in range(max_tokens):
        step = out.logits[0, -1].float()
        tokens.append(int(step.argmax()))
        logits.append(step)
        out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=out.past_key_values,
                    use_cache=True)
    return Reference(prompt_logits, tokens, logits)


def check_every_position(ours: CausalLM, prompts: list[list[int]],
                         references: list[Reference], chunk: int, seed: int,
                         label: str, num_blocks: int = 128) -> float:
    """Prompts advanced ``chunk`` tokens a step, flattened together; returns the largest
    logit difference from HF over every position."""
    driver = PagedDriver(ours, seed, BLOCK_SIZE, num_blocks)
    prompt_lens = {i: len(p) for i, p in enumerate(prompts)}
    logits: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(prompts))}
    for start in range(0, max(prompt_lens.values()), chunk):
        chunks = {i: p[start:start + chunk] for i, p in enumerate(prompts) if start < len(p)}
        for i, out in driver.step(chunks, prompt_lens).items():
            logits[i].append(out)
    worst = 0.0
    for i, reference in enumerate(references):
        diff = (torch.cat(logits[i]) - reference.prompt_logits).abs().max().item()
        worst = max(worst, diff)
        assert diff < ATOL, f"{label}: prompt {i} (len {len(prompts[i])}): {diff:.2e}"
    return worst


def kv_budget(ours: CausalLM, max_model_len: int, num_blocks: int, max_num_seqs: int) -> int:
    """The ``kv_cache_memory`` (fp32) that holds ``num_blocks`` KV blocks of this model
    once the SSM layers' states of ``max_num_seqs`` requests are paid for."""
    runner = ModelRunner(ours, TorchAttentionBackend, block_size=BLOCK_SIZE,
                         max_num_reqs=max_num_seqs, max_model_len=max_model_len, vocab_size=1,
                         eos_token_ids=frozenset(), device=torch.device("cpu"))
    return num_blocks * runner.kv_cache_bytes_per_block() + runner.ssm_state_bytes()


def check_engine(tiny: Tiny, *, kv_blocks: int, max_model_len: int,
                 prompts: list[list[int]] | None = None,
                 references: list[Reference] | None = None,
                 max_num_batched_tokens: int = 64, **engine: object) -> LLM:
    """The engine's greedy run against HF's (of ``tiny``'s prompts, or those given with
    their references), with a KV cache of ``kv_blocks`` blocks (after any SSM states);
    returns the engine (for more checks; its ``preempted`` lists each preemption as the
    request and how many output tokens it had)."""
    prompts = tiny.prompts if prompts is None else prompts
    references = tiny.references if references is None else references
    max_num_seqs = int(engine.pop("max_num_seqs", len(prompts)))  # type: ignore[call-overload]
    llm = LLM(model=str(tiny.folder), dtype="float32", max_model_len=max_model_len,
              max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
              kv_cache_memory=kv_budget(tiny.ours, max_model_len, kv_blocks, max_num_seqs),
              **engine)
    scheduler = llm.llm_engine.core.scheduler
    preempted: list[tuple[str, int]] = []  # (request, its output tokens when preempted)
    llm.preempted = preempted  # type: ignore[attr-defined]
    original = scheduler._preempt

    def counting(request: Request) -> None:
        preempted.append((request.request_id, len(request.output_token_ids)))
        original(request)

    scheduler._preempt = counting  # type: ignore[method-assign]
    ours = engine_greedy(llm, prompts, len(references[0].tokens))
    report = compare(prompts, ours, [(r.tokens, r.step_logits) for r in references])
    print(f"\n{tiny.label}: engine max logit diff {report.max_logit_diff:.2e}, "
          f"{len(preempted)} preemptions, ties: {report.divergences or 'none'}")
    assert not report.failures, f"{tiny.label}: divergences beyond a tie: {report.failures}"
    assert report.max_logit_diff < ATOL, f"{tiny.label}: logit diff {report.max_logit_diff:.2e}"
    assert preempted, f"{tiny.label}: the KV budget was meant to force preemption"
    return llm


def check_tensor_parallel(tiny: Tiny, max_model_len: int, num_prompts: int = 2,
                          **engine: object) -> None:
    """Two tensor-parallel ranks on ``tiny``'s first ``num_prompts`` prompts (the short
    ones: the split does not depend on the length): greedy tokens as HF's (a divergence
    only at a tie), the prompt logprobs of HF's top tokens within ``ATOL``."""
    prompts, references = tiny.prompts[:num_prompts], tiny.references[:num_prompts]
    label, max_tokens = tiny.label, len(references[0].tokens)
    llm = LLM(str(tiny.folder), dtype="float32", kv_cache_memory=KV_BYTES_TP, seed=0,
              max_model_len=max_model_len, tensor_parallel_size=2, **engine)
    try:
        result = generate(llm, prompts, max_tokens)
    finally:
        llm.shutdown()
    gap = 0.0
    for i, reference in enumerate(references):
        tokens = result.tokens[i]
        if tokens != reference.tokens:
            step = next(s for s, (a, b) in enumerate(zip(tokens, reference.tokens)) if a != b)
            top2 = reference.step_logits[step].topk(2).values
            assert (top2[0] - top2[1]).item() < TIE_GAP, (
                f"{label} TP=2: prompt {i} diverges at step {step} beyond a tie")
        logprobs = torch.log_softmax(reference.prompt_logits, dim=-1)
        for position, top in enumerate(result.prompt_logprobs[i]):
            gap = max(gap, max(abs(value - logprobs[position, token].item())
                               for token, value in top.items()))
    print(f"\n{label} TP=2 {engine or ''}: prompt logprob gap {gap:.2e}")
    assert gap < ATOL, f"{label} TP=2 {engine or ''}: prompt logprobs {gap:.2e} from HF's"


class Tiny:
    """A tiny model's folder, HF model, our fp32 model, prompts and HF's reference runs,
    built once per test module (its fixture)."""

    def __init__(self, name: str, config: PretrainedConfig, folder: Path, lengths: list[int],
                 before: Callable[[PreTrainedModel], None] | None = None) -> None:
        """``lengths``: of the prompts; ``before``: ``hf_reference``'s."""
        self.name = name
        self.seed = draw_seed()
        self.folder = folder
        self.hf = save_hf_model(config, folder, self.seed)
        self.ours = build_model(load_model_files(folder), torch.float32, TorchAttentionBackend)
        self.prompts = random_prompts(VOCAB_SIZE, lengths, self.seed)
        self.references = [hf_reference(self.hf, p, MAX_TOKENS, before) for p in self.prompts]
        self.label = f"tiny {name} (seed {self.seed})"


def check_backend_refuses(folder: Path, lacking: dict[str, object], message: str) -> None:
    """Building the model on the torch backend without a capability (``lacking``: the
    class attributes that say so) fails with ``message``, naming the backend."""
    backend = type("LackingBackend", (TorchAttentionBackend,), {"name": "lacking", **lacking})
    with pytest.raises(ModelLoadError, match=f"the lacking attention backend {message}"):
        build_model(load_model_files(folder), torch.float32, backend)


"""How often the fp8 KV cache's greedy pick equals the bf16 cache's (issue 52), and why not.

Both engines (SmolLM2, bf16) follow one text - the bf16 engine's own greedy continuation of
W1's first prompts, or HF bf16's (``--reference hf``) - and at each step the fp8 cache's pick
is compared with the bf16 cache's (teacher forcing). For each disagreement it prints the bf16
run's top-1/top-2 logit gap there: a near-tie flipped by rounding, or a large gap (a bug),
and the mean KL divergence of the fp8 run's next-token distributions from the bf16 run's -
continuous, where the agreement counts flips only (which makes it noisy: on W1[:6], ~1% from
one equally good configuration to another).

    .venv/bin/python benchmarks/fp8_kv_agreement.py [--requests 6] [--tokens 64]
        [--kv-cache-dtype fp8] [--calculate-kv-scales] [--extra bf16-torch]

``--extra bf16-torch`` adds the bf16 cache through the portable attention path, judged the
same way: how much the two bf16 paths alone disagree, for scale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octavo import LLM  # noqa: E402
from octavo.bench.workloads import build_workload  # noqa: E402
from tests.core.parity import (  # noqa: E402
    ForcedRun,
    engine_forced_logprobs,
    engine_greedy,
    mean_kl,
)

# W1's prompts are random token ids: the first steps of a continuation are the least certain
# (near-ties), and most disagreements fall there.
EARLY_STEPS = 8
ENGINE = dict(dtype="bfloat16", quantization="none", max_model_len=512,
              kv_cache_memory=256 * 2**20)


def gaps(run: ForcedRun) -> list[list[float]]:
    """Each step's top-1 minus top-2 logit (the same gap in log-probabilities)."""
    tops = [logprobs.topk(2, dim=-1).values for logprobs in run.logprobs]
    return [(top[:, 0] - top[:, 1]).tolist() for top in tops]


def divergence(run: ForcedRun, base: ForcedRun) -> str:
    """How far ``run``'s next-token distributions are from ``base``'s: the mean KL(base ||
    run) per step and the RMS difference of the base's top token's log-probability."""
    top = [r.gather(-1, b.argmax(-1, keepdim=True)) - b.max(-1, keepdim=True).values
           for r, b in zip(run.logprobs, base.logprobs)]
    return (f"mean KL {mean_kl(run, base):.2e}, RMS top-token logprob difference "
            f"{torch.cat(top).pow(2).mean().sqrt():.2e}")


def report(title: str, name: str, run: ForcedRun, base: ForcedRun,
           reference: list[list[int]] | None = None) -> float:
    """Print per prompt agreement of ``run``'s picks with ``base``'s (or ``reference``), each
    disagreement's gaps, and how far the distributions are; the share agreeing."""
    agreed = total = early = 0
    base_gaps, run_gaps = gaps(base), gaps(run)
    print(f"\n{title}:")
    for i, (mine, theirs) in enumerate(zip(run.picks, reference or base.picks, strict=True)):
        same = sum(a == b for a, b in zip(mine, theirs))
        agreed, total = agreed + same, total + len(theirs)
        steps = [s for s, (a, b) in enumerate(zip(mine, theirs)) if a != b]
        early += sum(s < EARLY_STEPS for s in steps)
        where = [f"step {s}: bf16 gap {base_gaps[i][s]:.3f}, {name} gap {run_gaps[i][s]:.3f}"
                 for s in steps]
        print(f"  prompt {i}: {same}/{len(theirs)}" + "".join(f"\n    {w}" for w in where))
    print(f"  total {agreed}/{total} = {agreed / total:.2%} ({total - agreed - early} of the "
          f"disagreements after step {EARLY_STEPS - 1}); {divergence(run, base)}")
    return agreed / total


def reference_text(source: str, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """The text every engine follows: the bf16 engine's greedy continuation (on an engine of
    its own: a second run on one engine would hit its prefix cache), or HF bf16's."""
    if source == "engine":
        writer = LLM(**ENGINE)
        text = engine_greedy(writer, prompts, tokens)[0]
        writer.shutdown()
        return text
    from transformers import AutoModelForCausalLM

    from octavo.models.loader import default_model_path
    from tests.core.parity import hf_greedy

    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.bfloat16).eval()
    return [hf_greedy(hf, p, tokens)[0] for p in prompts]


def run_engine(prompts: list[list[int]], text: list[list[int]], **kwargs: object,
               ) -> ForcedRun:
    llm = LLM(**{**ENGINE, **kwargs})
    forced = engine_forced_logprobs(llm, prompts, text)
    llm.shutdown()
    return forced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--kv-cache-dtype", default="fp8")
    parser.add_argument("--calculate-kv-scales", action="store_true")
    parser.add_argument("--reference", choices=("engine", "hf"), default="engine")
    parser.add_argument("--extra", choices=("bf16-torch",), action="append", default=[])
    args = parser.parse_args()
    prompts = build_workload("W1_throughput").prompts[:args.requests]
    text = reference_text(args.reference, prompts, args.tokens)
    base = run_engine(prompts, text)
    report("the bf16 cache's picks vs the text", "bf16", base, base, text)
    name = args.kv_cache_dtype
    fp8 = run_engine(prompts, text, kv_cache_dtype=name,
                     calculate_kv_scales=args.calculate_kv_scales)
    share = report(f"the {name} cache's picks vs the bf16 cache's (the acceptance)", name,
                   fp8, base)
    report(f"the {name} cache's picks vs the text", name, fp8, base, text)
    if "bf16-torch" in args.extra:
        portable = run_engine(prompts, text, attention_backend="torch")
        report("the bf16 cache on the portable attention path vs the fused kernels' picks",
               "portable", portable, base)
    print(f"\nW1[:{args.requests}] x {args.tokens}, along {args.reference}'s text: {name} "
          f"agrees with the bf16 cache on {share:.2%}")


if __name__ == "__main__":
    main()

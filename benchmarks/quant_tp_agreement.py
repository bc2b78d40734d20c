"""Why TP=2 on the quantized CPU kernels does not give one rank's greedy tokens (issue 52).

Runs one quantized checkpoint (default: llm-compressor's W4A16 of the tests' tiny Llama,
``tests/core/models/tool_checkpoints.py``) greedily on 4 random prompts x 8 tokens with the
top-20 log-probabilities of every decode step, and compares, up to each prompt's first
differing token: TP=2 with one rank, and one rank's Q8-activation decode kernel
(``quant_gemm.Q8_ACTIVATIONS``) with its fp32 one. Each line gives the largest difference
of a log-probability both runs report and, where a token differs, the first run's top-1
minus top-2 there. With ``OCTAVO_CPU_KERNELS=0`` (the portable path, which the workers
inherit) the TP=2 line is the fp32 rounding of the ranks' split sums alone.

    .venv/bin/python benchmarks/quant_tp_agreement.py [--seed 1] [--folder DIR]
    OCTAVO_CPU_KERNELS=0 .venv/bin/python benchmarks/quant_tp_agreement.py [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from octavo import SamplingParams  # noqa: E402
from octavo.cpu import kernels, quant_gemm  # noqa: E402
from tests.parallel.engines import make_llm, one_thread  # noqa: E402
from tests.parallel.test_tensor_parallel import random_prompts  # noqa: E402

# Per prompt: the greedy tokens and each decode step's {token: logprob} of the top 20.
Run = list[tuple[list[int], list[dict[int, float]]]]


def generate(folder: str, prompts: list[list[int]], **engine: Any) -> Run:
    """Greedy decoding of 8 tokens per prompt with each step's top-20 log-probabilities."""
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=20)
    llm = make_llm(folder, max_model_len=128, **engine)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                               use_tqdm=False)
    finally:
        llm.shutdown()
    return [(list(o.outputs[0].token_ids),
             [{t: lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs or []])
            for o in outputs]


def compare(title: str, base: Run, other: Run) -> None:
    """Print the largest log-probability difference up to each prompt's first differing
    token, and base's top-2 gap at each such token."""
    worst, flips = 0.0, []
    for i, ((tokens, steps), (tokens2, steps2)) in enumerate(zip(base, other, strict=True)):
        for s, (a, b, lp, lp2) in enumerate(zip(tokens, tokens2, steps, steps2, strict=True)):
            worst = max(worst, max(abs(lp[t] - lp2[t]) for t in lp.keys() & lp2.keys()))
            if a != b:
                top = sorted(lp.values(), reverse=True)
                flips.append(f"prompt {i} step {s} (top-2 gap {top[0] - top[1]:.1e})")
                break
    print(f"{title}: largest logprob difference {worst:.1e}; tokens differ at "
          f"{', '.join(flips) or 'none'}")


def default_folder() -> str:
    from tests.core.models.tool_checkpoints import tool_checkpoints

    return str(tool_checkpoints("llmcompressor")["w4a16"].folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--folder", help="a quantized checkpoint (default: llm-compressor's "
                        "W4A16 of the tests' tiny Llama)")
    args = parser.parse_args()
    folder = args.folder or default_folder()
    prompts = random_prompts(np.random.default_rng(args.seed), 4)
    print(f"seed {args.seed}, {folder}, CPU kernels "
          f"{'on' if kernels.library() is not None else 'off'}")
    with one_thread():
        one = generate(folder, prompts)
    compare("TP=2 vs one rank", one, generate(folder, prompts, tensor_parallel_size=2))
    if kernels.library() is not None:
        quant_gemm.Q8_ACTIVATIONS = False
        with one_thread():
            fp32 = generate(folder, prompts)
        compare("one rank, Q8 activations vs fp32 decode kernel", one, fp32)


if __name__ == "__main__":
    main()

"""llama.cpp's greedy continuation of given prompts, with its logits' top two at each step:
the reference for Octavo's quantized kernels on a GGUF file (llama.cpp wrote the file; its
math is the reference). Run with the Python of the environment llama-cpp-python is
installed in (benchmarks/README.md); ``benchmarks/llamacpp_reference.py`` calls it.

    python llamacpp_logits.py MODEL.gguf PROMPTS.json OUTPUT_LEN OUT.json [THREADS]

PROMPTS.json is a list of token-id lists; OUT.json receives, per prompt, the generated ids
and at each generated position the best and second-best logits (their gap shows how close
llama.cpp's own choice was)."""

from __future__ import annotations

import json
import sys

import llama_cpp
import numpy as np


def continuation(llm: llama_cpp.Llama, prompt: list[int], output_len: int) -> dict:
    """Greedy ``output_len`` ids after ``prompt`` (EOS not special), with top-2 logits."""
    llm.reset()
    llm.eval(prompt)
    tokens: list[int] = []
    top2: list[list[float]] = []
    for _ in range(output_len):
        logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        best, second = np.argsort(logits)[::-1][:2]
        tokens.append(int(best))
        top2.append([float(logits[best]), float(logits[second])])
        llm.eval([int(best)])
    return {"prompt": prompt, "tokens": tokens, "top2_logits": top2}


def main() -> None:
    model, prompts_path, output_len, out_path = sys.argv[1:5]
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    prompts = json.loads(open(prompts_path).read())
    context = max(len(p) for p in prompts) + int(output_len)
    # logits_all: without it, llama-cpp-python 0.3.36 left ``scores`` all zeros on files its
    # own quantizer rewrote (Q4_K_M, f16 from the default Q4_1 file), so every "greedy" pick
    # was the last id; the default Q4_1 file read the same either way.
    llm = llama_cpp.Llama(model_path=model, n_ctx=context, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, verbose=False, logits_all=True)
    results = [continuation(llm, prompt, int(output_len)) for prompt in prompts]
    with open(out_path, "w") as f:
        json.dump({"llama_cpp_python": llama_cpp.__version__, "sequences": results}, f)


if __name__ == "__main__":
    main()

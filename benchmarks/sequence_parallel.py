"""Ulysses sequence parallelism: one long prompt's prefill at SP=1 against SP=N (default 2),
each on the ``mp`` executor (a worker process per rank, so SP=1 is measured the same way).
The default model is a random Llama of SmolLM2-135M's shapes but 8 query / 4 KV heads
(SmolLM2's 9 and 3 do not split by 2), written to a temporary folder with SmolLM2's
tokenizer; ``--model`` takes another (``default``: SmolLM2 itself; the heads must divide by
every size).

Per size it reports the prefill time (the median of ``--repeats`` requests of
``max_tokens=1``, the whole prompt in one step, prefix caching off) and the peak activation
memory of each rank: the worker's resident-set high-water mark (``VmHWM``) during the
prefill above its resident size just before it, read from ``/proc`` (the peak is reset
through ``/proc/<pid>/clear_refs`` before each request). On the CPU that is what the
step's activations, the attention's temporaries and the logits add to a rank; on a GPU
the figure to read would be ``torch.cuda.max_memory_allocated`` per rank, which this script
does not collect.

    .venv/bin/python benchmarks/sequence_parallel.py              # random Llama, 8,000 tokens
    .venv/bin/python benchmarks/sequence_parallel.py --prompt-len 1000 --repeats 1 \
        --model default --sizes 1,3                                # SmolLM2 itself at SP=3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass

import psutil

from octavo import LLM, SamplingParams
from octavo.bench.workloads import build_workload
from octavo.models.loader import default_model_path, load_model_files

WORKER_MODULE = "octavo.executor.worker_proc"


@dataclass
class Result:
    sp: int
    prefill_s: float
    peak_activation_mib: list[float]  # per rank, in rank order (their pids' order)


def save_random_llama(folder: str) -> None:
    """SmolLM2-135M's shapes with 8 query / 4 KV heads, random fp32 weights (seed 0), and
    SmolLM2's tokenizer, as an HF folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    smollm2 = load_model_files(None)
    hf = smollm2.hf_config
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
                         intermediate_size=hf["intermediate_size"],
                         num_hidden_layers=hf["num_hidden_layers"], num_attention_heads=8,
                         num_key_value_heads=4, max_position_embeddings=16384,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    smollm2.tokenizer.save_pretrained(folder)


def long_prompt(length: int) -> list[int]:
    """W1 prompts back to back (real text), repeated as needed, cut at ``length``."""
    tokens = [t for prompt in build_workload("W1_throughput").prompts for t in prompt]
    return (tokens * (length // len(tokens) + 1))[:length]


def workers() -> list[psutil.Process]:
    """This process's engine worker processes, by pid (the order the executor started
    them in, rank order)."""
    found = [p for p in psutil.Process().children(recursive=True)
             if WORKER_MODULE in " ".join(p.cmdline())]
    return sorted(found, key=lambda p: p.pid)


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def measure(model: str, sp: int, prompt: list[int], repeats: int, dtype: str) -> Result:
    llm = LLM(model, dtype=dtype, sequence_parallel_size=sp, distributed_executor_backend="mp",
              max_model_len=len(prompt) + 8, max_num_batched_tokens=len(prompt) + 8,
              enable_prefix_caching=False, seed=0)
    try:
        params = SamplingParams(max_tokens=1, temperature=0)
        llm.generate([{"prompt_token_ids": prompt[:64]}], params, use_tqdm=False)  # warm up
        ranks = workers()
        times, peaks = [], [0.0] * len(ranks)
        for _ in range(repeats):
            before = []
            for rank in ranks:
                with open(f"/proc/{rank.pid}/clear_refs", "w") as clear:
                    clear.write("5")  # reset the high-water mark to the current RSS
                before.append(_status_kib(rank.pid, "VmRSS"))
            start = time.perf_counter()
            llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
            times.append(time.perf_counter() - start)
            for i, rank in enumerate(ranks):
                grown = (_status_kib(rank.pid, "VmHWM") - before[i]) / 1024
                peaks[i] = max(peaks[i], grown)
        return Result(sp, statistics.median(times), peaks)
    finally:
        llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None,
                        help="an HF folder or GGUF file, or 'default' (SmolLM2); default: a "
                             "random Llama of SmolLM2's shapes with 8 query / 4 KV heads")
    parser.add_argument("--prompt-len", type=int, default=8000)
    parser.add_argument("--sizes", default="1,2", help="sequence-parallel sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.model is None:
            save_random_llama(folder)
        model = {None: folder, "default": str(default_model_path())}.get(args.model,
                                                                          args.model)
        report(model, args)


def report(model: str, args: argparse.Namespace) -> None:
    """Measure every size and print the table's rows as they come."""
    prompt = long_prompt(args.prompt_len)
    print(f"| model | prompt tokens | SP | prefill (s, median of {args.repeats}) | "
          "peak activation memory per rank (MiB) |")
    print("| --- | --- | --- | --- | --- |")
    for sp in map(int, args.sizes.split(",")):
        result = measure(model, sp, prompt, args.repeats, args.dtype)
        per_rank = ", ".join(f"{mib:.0f}" for mib in result.peak_activation_mib)
        name = "random Llama (8q/4kv)" if args.model is None else model.rsplit("/", 1)[-1]
        print(f"| {name} | {len(prompt)} | {sp} | "
              f"{result.prefill_s:.2f} | {per_rank} |", flush=True)


if __name__ == "__main__":
    main()

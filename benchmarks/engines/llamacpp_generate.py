"""Runs a compare.py job on llama.cpp (through llama-cpp-python) from a bf16 GGUF: each
prompt on its own, greedy, exactly ``output_len`` tokens (``generate`` does not stop at
EOS). The bf16 GGUF is made once, next to the job file, by llama.cpp's own quantizer from
the job's GGUF (dequantized to bf16: the weights Octavo runs in bf16). Run it with the Python
of the environment llama-cpp-python is installed in (see benchmarks/README.md)."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
from job import load_job, measure, parse_args
from llamacpp_quantize import quantize


def bf16_gguf(source: Path, folder: Path) -> Path:
    return quantize(source, folder / f"{source.stem}.bf16.gguf", "BF16")


def main() -> None:
    args = parse_args(__doc__)
    job = load_job(args.job)
    if not job["gguf"]:
        raise SystemExit("llama.cpp needs a GGUF model; the job names none")
    model = bf16_gguf(Path(job["gguf"]), args.job.parent)
    context = max(len(p) for p in job["prompts"]) + job["output_len"]
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=context, n_batch=512,
                          n_threads=job["threads"], n_threads_batch=job["threads"],
                          seed=0, verbose=False)

    def generate(prompts: list[list[int]], output_len: int) -> list[int]:
        lengths = []
        for prompt in prompts:
            count = 0
            for _ in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
                count += 1
                if count == output_len:
                    break
            lengths.append(count)
        return lengths

    measure("llamacpp", job, args.output_json, generate)


if __name__ == "__main__":
    main()

"""SmolLM2-135M as AWQ, GPTQ, W8A8 int8 and fp8 checkpoints (issue 52): write them, check
their accuracy against the same model dequantized to fp32, and time W1 / W2 with peak RSS.

The dense weights are the default GGUF's, as HF transformers loads it (what the HF-parity
tests use); each format is written from its spec by ``octavo.testing.quant_checkpoints``
(round-to-nearest per group: the file layout of the real tools, not their calibration), or
with ``--tool`` by the real tool (llm-compressor, GPTQModel, AutoAWQ) in its own environment
(``quant_tools.py``), calibrated on fixed random tokens, with the tool's own dequantized model
as "<name>-exact".

    # 1. the folders (about a minute): dense bf16 and each format, plus "<name>-exact"
    .venv/bin/python benchmarks/quant_formats.py write --out /tmp/qfmt
    # 1b. or a real tool's checkpoints (scripts/install_quant_tools.sh TOOL first), each
    #     named TOOL/SCHEME, e.g. --formats llmcompressor/w4a16 for accuracy
    .venv/bin/python benchmarks/quant_formats.py write --out /tmp/qfmt --tool llmcompressor
    # 2. accuracy: greedy tokens teacher-forced on W1[:6] x 64 against "<name>-exact"
    .venv/bin/python benchmarks/quant_formats.py accuracy --out /tmp/qfmt
    # 3. speed and peak RSS (idle machine): W1 and W2 per format, bf16, two threads
    .venv/bin/python benchmarks/quant_formats.py bench --out /tmp/qfmt

``bench`` runs, per folder, ``octavo bench throughput --workload W1_throughput`` and
``octavo bench latency --workload W2_latency`` with ``--dtype bfloat16``, each watched by
``peak_rss.PeakRss``, and prints one table row per format.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from octavo.testing import quant_checkpoints as qc

sys.path.insert(0, str(Path(__file__).parent))
from peak_rss import PeakRss  # noqa: E402

GROUP = 64  # SmolLM2's 576 hidden features are not whole groups of 128
FORMATS: dict[str, tuple[qc.Quantizer, dict]] = {
    "awq": (qc.awq(GROUP), {"quant_method": "awq", "bits": 4, "group_size": GROUP,
                          "zero_point": True, "version": "gemm"}),
    "gptq": (qc.gptq(4, GROUP, sym=True, act_order=False, seed=0),
             {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
              "sym": True, "checkpoint_format": "gptq"}),
    "w8a8": (qc.ct_int8, {
        "quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"type": "int", "num_bits": 8, "strategy": "channel",
                        "symmetric": True},
            "input_activations": {"type": "int", "num_bits": 8, "strategy": "token",
                                  "dynamic": True, "symmetric": True}}}}),
    "fp8": (qc.fp8(per_channel=False, static=False),
            {"quant_method": "fp8", "activation_scheme": "dynamic"}),
}
TOKENS = 64
PROMPTS = 6


def write(out: Path, tool: str | None) -> None:
    """The dense folder (from the default GGUF), then every format's three folders, or
    with ``tool`` that tool's checkpoints."""
    out = out.resolve()
    dense = out / "dense"
    if not (dense / "model.safetensors").exists():
        write_dense(dense)
    if tool is not None:
        here = Path(__file__).resolve().parent
        python = here.parent / ".venv-quant" / tool / "bin" / "python"
        if not python.exists():
            raise SystemExit(f"{python} is missing: scripts/install_quant_tools.sh {tool}")
        subprocess.run([str(python), str(here / "quant_tools.py"), tool,
                        "--dense", str(dense), "--out", str(out / tool)], check=True,
                       cwd=out)  # GPTQModel writes logs/ where it runs
        return
    for name, (quantizer, config) in FORMATS.items():
        qc.quantize_folder(dense, out / name, out / f"{name}-exact", out / f"{name}-blocks",
                           quantizer, config)
        print(f"wrote {out / name}")


def write_dense(dense: Path) -> None:
    """SmolLM2-135M's dense fp32 HF folder, from the default GGUF as transformers loads it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from octavo.models.loader import default_model_path

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    dense.mkdir(parents=True, exist_ok=True)
    weights = {name: tensor.contiguous() for name, tensor in model.state_dict().items()
               if not (name == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_file(weights, dense / "model.safetensors")  # save_pretrained refuses a GGUF load
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = config.get("architectures") or ["LlamaForCausalLM"]
    (dense / "config.json").write_text(json.dumps(config, indent=1))
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(dense)


def accuracy(out: Path, dtype: str, names: list[str]) -> None:
    """Teacher-forced greedy agreement of each format with its exact dequantized model."""
    from octavo import LLM, SamplingParams
    from octavo.bench.workloads import build_workload

    prompts = build_workload("W1_throughput").prompts[:PROMPTS]
    greedy = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    forced = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    for name in names:
        exact = LLM(str(out / f"{name}-exact"), dtype=dtype)
        references = [o.outputs[0].token_ids for o in exact.generate(
            [{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)]
        exact.shutdown()
        llm = LLM(str(out / name), dtype=dtype)
        agree = total = 0
        for prompt, reference in zip(prompts, references, strict=True):
            output = llm.generate([{"prompt_token_ids": prompt + reference[:-1]}], forced,
                                  use_tqdm=False)[0]
            # position k's entry: the distribution of token k given those before it
            picks = [max(position, key=lambda t: position[t].logprob)
                     for position in output.prompt_logprobs[len(prompt):]]
            picks.append(output.outputs[0].token_ids[0])
            agree += sum(a == b for a, b in zip(picks, reference, strict=True))
            total += len(reference)
        llm.shutdown()
        print(json.dumps({"format": name, "dtype": dtype, "agree": agree, "of": total,
                          "rate": round(agree / total, 4)}))


def bench(out: Path) -> None:
    """W1 and W2 per folder with the process tree's peak RSS."""
    print("| format | W1 output tok/s | W1 peak RSS MB | W2 decode tok/s | W2 peak RSS MB |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in ("dense", *FORMATS):
        row = [name]
        for kind, workload in (("throughput", "W1_throughput"), ("latency", "W2_latency")):
            result = out / f"{name}-{workload}.json"
            command = ["octavo", "bench", kind, "--model", str(out / name), "--workload",
                       workload, "--dtype", "bfloat16", "--output-json", str(result)]
            process = subprocess.Popen(command)
            watcher = PeakRss(process.pid)
            if process.wait() != 0:
                raise SystemExit(f"{' '.join(command)} failed")
            peak = sum(p.peak_bytes for p in watcher.stop()) / 2**20
            row += [_rate(json.loads(result.read_text())), f"{peak:.0f}"]
        print("| " + " | ".join(row) + " |")


def _rate(result: dict) -> str:
    """The tokens per second a bench result reports (output tok/s or decode tok/s)."""
    for key in ("output_tokens_per_second", "avg_decode_tok_per_s"):
        if key in result:
            return f"{result[key]:.1f}"
    return json.dumps(result)[:60]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("write", "accuracy", "bench"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", default="float32", help="accuracy's dtype")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help="accuracy's formats (a tool's: TOOL/SCHEME)")
    parser.add_argument("--tool", choices=("llmcompressor", "gptqmodel", "autoawq"),
                        help="write: that tool's checkpoints instead of the spec writer's")
    args = parser.parse_args()
    if args.step == "write":
        write(args.out, args.tool)
    elif args.step == "accuracy":
        accuracy(args.out, args.dtype, args.formats.split(","))
    else:
        bench(args.out)


if __name__ == "__main__":
    main()

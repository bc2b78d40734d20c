"""Runs a compare.py job on HF transformers ``generate`` with SDPA attention: one static
batch, left-padded, greedy, exactly ``output_len`` new tokens per prompt (``min_new_tokens``
stops EOS from ending one early). Run it with the Python of an environment that has torch
and transformers."""

from __future__ import annotations

import torch
from job import load_job, measure, parse_args
from transformers import AutoModelForCausalLM


def static_batch(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad to the longest prompt, so every row's next token comes at the same position."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def main() -> None:
    args = parse_args(__doc__)
    job = load_job(args.job)
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=getattr(torch, job["dtype"]),
                                                 attn_implementation="sdpa")
    model.eval()
    pad_id = model.generation_config.pad_token_id or model.generation_config.eos_token_id or 0
    if isinstance(pad_id, list):
        pad_id = pad_id[0]

    def generate(prompts: list[list[int]], output_len: int) -> list[int]:
        ids, mask = static_batch(prompts, pad_id)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=output_len,
                                 min_new_tokens=output_len, do_sample=False,
                                 pad_token_id=pad_id)
        return [out.shape[1] - ids.shape[1]] * len(prompts)

    measure("hf", job, args.output_json, generate)


if __name__ == "__main__":
    main()

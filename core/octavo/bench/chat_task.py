"""The ``chat`` dataset: everyday instructions rendered with the model's chat template, the
workload where trained speculative heads (Medusa, EAGLE) are meant to help. Random token ids
are useless there - a head guesses what the model says next in real text - and the copy
workload favours n-gram lookup. ``octavo spec train`` holds these instructions out of its
training text and measures acceptance on them, so a benchmark on them times heads on text
they never saw."""

from __future__ import annotations

from typing import Any

import numpy as np

INSTRUCTIONS = (
    "Describe how a bicycle works.",
    "What should I pack for a week-long camping trip?",
    "Explain the difference between weather and climate.",
    "Write a short poem about autumn leaves.",
    "How do airplanes stay in the air?",
    "Give me some tips for writing a good resume.",
    "Write a Python function that computes the Fibonacci numbers up to n.",
    "Why is the sky blue?",
    "Tell me about the life cycle of a butterfly.",
    "How can I improve my memory?",
    "Explain what a database index is.",
    "Write a friendly email inviting a colleague to lunch.",
)


def chat_prompt_ids(tokenizer: Any, content: str) -> list[int]:
    """One user turn, rendered with the chat template, ready for the assistant's reply."""
    messages = [{"role": "user", "content": content}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return list(ids)


def chat_prompts(num: int, tokenizer: Any, seed: int = 0) -> list[list[int]]:
    """``num`` prompts' token ids, instructions in a seeded random order (cycling)."""
    order = np.random.default_rng(seed).permutation(len(INSTRUCTIONS))
    return [chat_prompt_ids(tokenizer, INSTRUCTIONS[int(order[i % len(INSTRUCTIONS)])])
            for i in range(num)]

"""The ``copy`` dataset: chat prompts whose answer repeats a passage of the prompt
("Repeat the following text exactly: ..."), the workload where n-gram speculative decoding
shines (quoting, editing and extraction behave alike). Prompts are rendered with the
model's chat template; each asks for as many tokens as its passage has, so the timed
output is the copy itself."""

from __future__ import annotations

from typing import Any

import numpy as np

from octavo.bench.chat_task import chat_prompt_ids

PASSAGES = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the "
    "wick, polished the great lens until it gleamed, and wrote the weather in a leather "
    "logbook: wind from the north-west, a heavy swell, two fishing boats returning late. "
    "In forty years he had missed only one night, during the storm of the long winter, "
    "when the door froze shut and he lit the lamp from the outside gallery instead.",
    "To bake the bread, mix five hundred grams of flour with ten grams of salt and seven "
    "grams of dried yeast. Add three hundred and fifty millilitres of warm water and knead "
    "for ten minutes until the dough is smooth and elastic. Leave it covered in a warm "
    "place for an hour, shape it into a loaf, let it rise again for thirty minutes, and "
    "bake at two hundred and twenty degrees for thirty-five minutes.",
    "The committee met on Tuesday to review the budget for the coming year. The treasurer "
    "reported that membership fees had risen by eight percent, while the cost of renting "
    "the hall had doubled. After a long discussion the members agreed to raise the annual "
    "fee modestly, to look for a cheaper venue, and to hold the spring fair in the park "
    "if the weather allows.",
    "Rivers carve their valleys slowly. Each spring the melting snow carries sand and "
    "pebbles downstream, grinding the rock of the riverbed a little deeper. Over thousands "
    "of years a small stream can cut a gorge hundreds of metres deep, and the layers of "
    "stone exposed in its walls record the history of the land like the pages of a book.",
    "Please remember to water the tomatoes every morning, but only at the roots, never on "
    "the leaves. The basil on the windowsill needs water every second day. The cat is fed "
    "twice a day, one scoop in the morning and one in the evening, and she will pretend "
    "that nobody has fed her. The spare key is under the blue flower pot by the back door.",
)
INSTRUCTION = "Repeat the following text exactly, without any comment:\n\n"


def copy_prompt_ids(tokenizer: Any, passage: str) -> list[int]:
    return chat_prompt_ids(tokenizer, INSTRUCTION + passage)


def copy_prompts(num: int, tokenizer: Any, seed: int = 0) -> list[tuple[list[int], int]]:
    """``num`` (prompt token ids, passage length in tokens) pairs, passages in a seeded
    random order (cycling through them)."""
    order = np.random.default_rng(seed).permutation(len(PASSAGES))
    pairs = []
    for i in range(num):
        passage = PASSAGES[int(order[i % len(PASSAGES)])]
        pairs.append((copy_prompt_ids(tokenizer, passage),
                      len(tokenizer.encode(passage, add_special_tokens=False))))
    return pairs

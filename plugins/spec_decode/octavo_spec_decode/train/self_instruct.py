"""Requests the target writes itself, as training prompts (Magpie: Xu et al., 2024).

Given only its chat template up to the start of a user turn, an instruction-tuned model
continues with a user request of the kind it was tuned on: questions, tasks, code, letters,
advice, in every topic its tuning data had. Sampling many such turns gives the heads far
more kinds of text than any fixed list of prompts, and it is still the target's own text.
This matters because the heads overfit a narrow text: trained on the built-in topics alone,
EAGLE's first draft was right 46% of the time on replies to held-back built-in prompts but
only 28% on the (unrelated) held-out benchmark instructions.
"""

from __future__ import annotations

import re
from typing import Any

from octavo.plugin_api import LLM, SamplingParams
from octavo_spec_decode.train.errors import TrainingInputError

# Magpie samples the user turn at temperature 1 with no truncation: lower makes the
# requests repeat.
REQUEST_TEMPERATURE = 1.0
MAX_REQUEST_TOKENS = 96
# A placeholder message; the prompt is the rendered template cut just before it.
_MARK = "\x00octavo-request\x00"
# Words too common to say what a request is about.
_COMMON_WORDS = frozenset(
    "the and for with how what why who which that this can you your are was were does "
    "about some give tell write explain describe should".split())


def user_turn_prefix(tokenizer: Any) -> list[int]:
    """Token ids of the chat template up to where a user's message would start (with the
    template's default system turn, if it has one)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    if _MARK not in text:
        raise TrainingInputError("the model's chat template does not render the user's message "
                         "verbatim; it cannot write its own training requests")
    return list(tokenizer(text[:text.index(_MARK)], add_special_tokens=False)["input_ids"])


def topic_words(text: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"[a-z]+", text.lower())
                     if len(w) >= 3 and w not in _COMMON_WORDS)


def resembles(request: str, prompt_words: frozenset[str]) -> bool:
    """Whether ``request`` has most (60%) of a prompt's topic words: "How do I improve my
    memory?" resembles "How can I improve my memory?", "a memory leak" does not."""
    return len(topic_words(request) & prompt_words) >= 0.6 * len(prompt_words)


def self_written_requests(llm: LLM, num: int, seed: int, exclude: tuple[str, ...] = (),
                          ) -> list[str]:
    """``num`` distinct requests the target wrote, each a user turn it ended itself (cut-off
    ones are dropped). None resembles a prompt of ``exclude``: the held-out prompts must
    stay unseen, not reworded, and a near-repeat of a built-in prompt adds nothing new."""
    excluded = [words for words in map(topic_words, exclude) if words]
    prefix = {"prompt_token_ids": user_turn_prefix(llm.get_tokenizer())}
    requests: dict[str, None] = {}  # insertion-ordered set: the same seed, the same list
    drawn = 0
    for _ in range(4):
        wanted = num - len(requests)
        if wanted <= 0:
            break
        # One request per sample (a progress bar counts them), sample i seeded seed + i:
        # each round goes on from the last one's seeds.
        params = [SamplingParams(temperature=REQUEST_TEMPERATURE,
                                 max_tokens=MAX_REQUEST_TOKENS, seed=seed + drawn + i)
                  for i in range(wanted + wanted // 2 + 8)]
        drawn += len(params)
        for output in llm.generate([prefix] * len(params), params):
            completion = output.outputs[0]
            text = completion.text.strip()
            if completion.finish_reason == "stop" and text and text not in exclude and \
                    not any(resembles(text, words) for words in excluded):
                requests.setdefault(text, None)
    return list(requests)[:num]

"""Benchmark requests: synthetic (random, prefix-repetition), ShareGPT conversations from a
local JSON file, and the reference workloads. Names and semantics follow vLLM's benchmark
datasets so a vLLM user's flags mean the same thing here.

Synthetic prompts are token ids, not text: decoding random ids to text and re-encoding it
changes the length, and a benchmark must send exactly the lengths it reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from octavo.bench.chat_task import chat_prompts
from octavo.bench.copy_task import copy_prompts
from octavo.bench.workloads import TOKEN_HIGH, TOKEN_LOW, build_workload

DATASET_NAMES = ("random", "sharegpt", "prefix-repetition", "copy")

# ShareGPT filters, as vLLM's: drop conversations too short to time or too long to fit.
SHAREGPT_MIN_LEN = 4
SHAREGPT_MAX_PROMPT_LEN = 1024
SHAREGPT_MAX_TOTAL_LEN = 2048


class DatasetError(ValueError):
    """A dataset cannot be built as asked; the message names the flag or file."""


@dataclass
class BenchRequest:
    """One request to send: the prompt (token ids, or text for ShareGPT), its length in
    tokens, and how many tokens to generate."""

    prompt: str | list[int]
    prompt_len: int
    output_len: int


def token_range(vocab_size: int | None) -> tuple[int, int]:
    """Where random token ids come from: the workloads' [100, 49000), cut to the tokenizer's
    vocabulary so a small model's tokenizer can still decode every id."""
    high = TOKEN_HIGH if vocab_size is None else min(TOKEN_HIGH, vocab_size)
    if high <= TOKEN_LOW:
        raise DatasetError(f"the vocabulary ({vocab_size} tokens) is too small for random "
                           f"prompts, which draw ids from [{TOKEN_LOW}, {TOKEN_HIGH})")
    return TOKEN_LOW, high


def random_requests(num: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                    prefix_len: int = 0, seed: int = 0,
                    vocab_size: int | None = None) -> list[BenchRequest]:
    """vLLM's ``random`` dataset: input and output lengths uniform in
    ``[len * (1 - range_ratio), len * (1 + range_ratio)]``, each prompt after one shared
    random prefix of ``prefix_len`` tokens."""
    _check_positive(num_prompts=num, random_input_len=input_len, random_output_len=output_len)
    if not 0.0 <= range_ratio < 1.0:
        raise DatasetError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    if prefix_len < 0:
        raise DatasetError(f"--random-prefix-len must be non-negative, got {prefix_len}")
    low, high = token_range(vocab_size)
    rng = np.random.default_rng(seed)
    input_lens = _lengths(rng, num, input_len, range_ratio)
    output_lens = _lengths(rng, num, output_len, range_ratio)
    prefix = rng.integers(low, high, size=prefix_len).tolist()
    requests = []
    for n_in, n_out in zip(input_lens, output_lens):
        ids = prefix + rng.integers(low, high, size=n_in).tolist()
        requests.append(BenchRequest(ids, len(ids), n_out))
    return requests


def prefix_repetition_requests(num: int, prefix_len: int, suffix_len: int, num_prefixes: int,
                               output_len: int, seed: int = 0,
                               vocab_size: int | None = None) -> list[BenchRequest]:
    """vLLM's ``prefix_repetition`` dataset: ``num_prefixes`` random prefixes, each shared by
    ``num / num_prefixes`` prompts with their own random suffixes, in shuffled order - the
    workload that prefix caching is for."""
    _check_positive(num_prompts=num, prefix_repetition_prefix_len=prefix_len,
                    prefix_repetition_suffix_len=suffix_len,
                    prefix_repetition_num_prefixes=num_prefixes,
                    prefix_repetition_output_len=output_len)
    if num % num_prefixes:
        raise DatasetError(f"--num-prompts ({num}) must be a multiple of "
                           f"--prefix-repetition-num-prefixes ({num_prefixes})")
    low, high = token_range(vocab_size)
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(num_prefixes):
        prefix = rng.integers(low, high, size=prefix_len).tolist()
        for _ in range(num // num_prefixes):
            ids = prefix + rng.integers(low, high, size=suffix_len).tolist()
            requests.append(BenchRequest(ids, len(ids), output_len))
    order = rng.permutation(len(requests))
    return [requests[i] for i in order]


def sharegpt_requests(path: str | Path, num: int, tokenizer: Any, seed: int = 0,
                      output_len: int | None = None) -> list[BenchRequest]:
    """The first human turn of each conversation as the prompt; the length of the reply that
    followed it (or ``output_len``) as the number of tokens to generate. Conversations are
    shuffled with ``seed``; those vLLM would drop as too short or too long are skipped."""
    _check_positive(num_prompts=num)
    conversations = _load_sharegpt(Path(path))
    rng = np.random.default_rng(seed)
    requests: list[BenchRequest] = []
    for index in rng.permutation(len(conversations)):
        prompt, reply = conversations[index]
        prompt_len = len(tokenizer.encode(prompt))
        n_out = output_len if output_len is not None else len(tokenizer.encode(reply))
        if output_len is None and (prompt_len < SHAREGPT_MIN_LEN or n_out < SHAREGPT_MIN_LEN):
            continue
        if prompt_len > SHAREGPT_MAX_PROMPT_LEN or prompt_len + n_out > SHAREGPT_MAX_TOTAL_LEN:
            continue
        requests.append(BenchRequest(prompt, prompt_len, n_out))
        if len(requests) == num:
            break
    if not requests:
        raise DatasetError(f"{path}: no conversation fits the ShareGPT length filters "
                           f"(prompt and reply of at least {SHAREGPT_MIN_LEN} tokens, prompt "
                           f"at most {SHAREGPT_MAX_PROMPT_LEN}, both at most "
                           f"{SHAREGPT_MAX_TOTAL_LEN})")
    return requests


def copy_requests(num: int, tokenizer: Any, seed: int = 0) -> list[BenchRequest]:
    """The ``copy`` dataset (``octavo.bench.copy_task``): each request generates as many
    tokens as the passage it is asked to repeat."""
    _check_positive(num_prompts=num)
    return [BenchRequest(ids, len(ids), passage_len)
            for ids, passage_len in copy_prompts(num, tokenizer, seed)]


def chat_requests(num: int, output_len: int, tokenizer: Any, seed: int = 0,
                  ) -> list[BenchRequest]:
    """The ``chat`` dataset (``octavo.bench.chat_task``): everyday instructions, each
    generating ``output_len`` tokens."""
    _check_positive(num_prompts=num, output_len=output_len)
    return [BenchRequest(ids, len(ids), output_len)
            for ids in chat_prompts(num, tokenizer, seed)]


def workload_requests(name: str) -> list[BenchRequest]:
    """A reference workload's requests, exactly as ``workloads.json`` specifies them."""
    try:
        workload = build_workload(name)
    except KeyError as exc:
        raise DatasetError(str(exc.args[0])) from None
    return [BenchRequest(ids, len(ids), workload.output_len) for ids in workload.prompts]


@dataclass
class DatasetOptions:
    """What the ``--dataset-*`` / ``--random-*`` / ``--prefix-repetition-*`` flags ask for;
    ``workload`` overrides them all."""

    dataset_name: str = "random"
    dataset_path: str | None = None
    num_prompts: int = 100
    random_input_len: int = 256
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    sharegpt_output_len: int | None = None
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    workload: str | None = None
    seed: int = 0

    def check(self) -> None:
        """The mistakes visible without a tokenizer, caught before a model is loaded."""
        if self.workload is not None:
            return
        if self.dataset_name not in DATASET_NAMES:
            raise DatasetError(f"--dataset-name must be one of {', '.join(DATASET_NAMES)}, "
                               f"got {self.dataset_name!r}")
        if self.dataset_name == "sharegpt" and self.dataset_path is None:
            raise DatasetError("--dataset-name sharegpt needs --dataset-path FILE.json")


def build_requests(options: DatasetOptions, tokenizer: Any) -> list[BenchRequest]:
    """The requests ``options`` describe, for a model with ``tokenizer``."""
    options.check()
    if options.workload is not None:
        return workload_requests(options.workload)
    vocab = len(tokenizer)
    if options.dataset_name == "random":
        return random_requests(options.num_prompts, options.random_input_len,
                               options.random_output_len, options.random_range_ratio,
                               options.random_prefix_len, options.seed, vocab)
    if options.dataset_name == "prefix-repetition":
        return prefix_repetition_requests(
            options.num_prompts, options.prefix_repetition_prefix_len,
            options.prefix_repetition_suffix_len, options.prefix_repetition_num_prefixes,
            options.prefix_repetition_output_len, options.seed, vocab)
    if options.dataset_name == "copy":
        return copy_requests(options.num_prompts, tokenizer, options.seed)
    assert options.dataset_path is not None  # check() made sure
    return sharegpt_requests(options.dataset_path, options.num_prompts, tokenizer,
                             options.seed, options.sharegpt_output_len)


def _load_sharegpt(path: Path) -> list[tuple[str, str]]:
    """(first human turn, the reply to it) of every conversation with at least two turns."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such ShareGPT file (--dataset-path)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not a readable JSON file: {exc}") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: a ShareGPT file holds a JSON list of conversations, "
                           f"not a {type(data).__name__}")
    pairs = []
    for i, entry in enumerate(data):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            raise DatasetError(f"{path}: entry {i} has no 'conversations' list")
        if len(turns) < 2:
            continue
        try:
            pairs.append((str(turns[0]["value"]), str(turns[1]["value"])))
        except (KeyError, TypeError):
            raise DatasetError(f"{path}: entry {i}: each turn needs a 'value'") from None
    if not pairs:
        raise DatasetError(f"{path}: no conversation with two turns or more")
    return pairs


def _lengths(rng: np.random.Generator, num: int, length: int, ratio: float) -> list[int]:
    low = max(1, int(length * (1 - ratio)))
    high = int(length * (1 + ratio))
    return rng.integers(low, high + 1, size=num).tolist()


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            flag = "--" + name.replace("_", "-")
            raise DatasetError(f"{flag} must be at least 1, got {value}")

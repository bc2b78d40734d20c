"""Chained block hashes: prefix identity, extra keys, incremental updates, determinism."""

from __future__ import annotations

import random
import subprocess
import sys

from octavo.block_hash import hash_block_tokens, update_block_hashes
from octavo.lora_request import LoRAAdapterRef
from tests.core.scheduler_fakes import make_request

BS = 4


def _fresh_tokens(n: int) -> list[int]:
    return [random.randrange(100, 50_000) for _ in range(n)]


def test_equal_prefixes_share_hashes_and_a_difference_propagates() -> None:
    tokens = _fresh_tokens(4 * BS + 2)
    changed = list(tokens)
    changed[BS + 1] += 1  # inside block 1
    a = update_block_hashes(make_request("a", tokens), BS)
    b = update_block_hashes(make_request("b", changed), BS)
    assert len(a) == len(b) == 4  # full blocks only
    assert a[0] == b[0], tokens
    assert all(x != y for x, y in zip(a[1:], b[1:])), tokens  # the chain carries the change


def test_extra_keys_separate_every_block() -> None:
    """Cache salt and LoRA adapter enter only the first block, but the chain carries them."""
    tokens = _fresh_tokens(3 * BS)
    plain = update_block_hashes(make_request("a", tokens), BS)
    salted = update_block_hashes(make_request("b", tokens, cache_salt="tenant-1"), BS)
    lora = make_request("c", tokens)
    lora.lora = LoRAAdapterRef("adapter", "/adapters/a", digest="0" * 64)
    for other in (salted, update_block_hashes(lora, BS)):
        assert len(other) == 3 and all(x != y for x, y in zip(plain, other)), tokens


def test_incremental_update_equals_hashing_from_scratch() -> None:
    tokens = _fresh_tokens(5 * BS + 3)
    request = make_request("a", tokens[:BS + 1])
    update_block_hashes(request, BS)
    for token_id in tokens[BS + 1:]:
        request.output_token_ids.append(token_id)
        update_block_hashes(request, BS)
    assert request.block_hashes == update_block_hashes(make_request("b", tokens), BS), tokens
    expected_first = hash_block_tokens(None, tokens[:BS])
    assert request.block_hashes[0] == expected_first
    assert request.block_hashes[1] == hash_block_tokens(expected_first, tokens[BS:2 * BS])


def test_hashes_are_identical_across_processes() -> None:
    """Not Python's salted hash(): another process (other PYTHONHASHSEED) agrees."""
    tokens = _fresh_tokens(BS)
    code = ("from octavo.block_hash import hash_block_tokens; "
            f"print(hash_block_tokens(None, {tokens}, ('salt',)).hex())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={"PYTHONHASHSEED": "12345"}, check=True)
    assert other.stdout.strip() == hash_block_tokens(None, tokens, ("salt",)).hex()

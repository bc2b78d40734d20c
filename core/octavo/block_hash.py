"""Chained block hashes: the keys of the prefix cache.

Block ``i`` of a request is identified by ``hash(hash of block i-1, its token ids, extra
keys)``. Chaining makes the hash of block ``i`` stand for the whole prefix up to and
including block ``i``, so two requests share a cached block exactly when they share every
token before it - which is what KV reuse needs, since a token's K/V depend on all earlier
tokens. Extra keys (LoRA adapter, cache salt) only enter the first block: the chain
carries them into every later one.

A prompt given as embeddings has placeholder token ids, so its blocks hash the embedding
bytes of their prompt rows instead (``hash_block_embeds``), tagged so that no such hash
can equal a token block's: two identical embeddings share blocks, an embedding and a token
prompt never do.

sha256 over a pickle rather than Python's ``hash()``: the latter is salted per process,
and a multi-process engine (or a KV connector sharing blocks across engines) needs every
process to compute the same hash for the same prefix.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from octavo.request import Request

BlockHash = bytes


def hash_block_tokens(
    parent_hash: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple[Any, ...] = ()
) -> BlockHash:
    payload = pickle.dumps((parent_hash, tuple(token_ids), extra_keys), protocol=5)
    return hashlib.sha256(payload).digest()


def hash_block_embeds(
    parent_hash: BlockHash | None, embed_rows: bytes, token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] = ()
) -> BlockHash:
    """The hash of a block that holds prompt-embedding rows (``embed_rows``: their float32
    bytes) and, in the block the prompt ends in, the output tokens after them
    (``token_ids``: the block's ids, placeholders included)."""
    payload = pickle.dumps((parent_hash, "prompt_embeds", embed_rows, tuple(token_ids),
                            extra_keys), protocol=5)
    return hashlib.sha256(payload).digest()


def first_block_extra_keys(request: Request) -> tuple[Any, ...]:
    """What besides the tokens decides the KV of a prefix: the LoRA adapter that computes it
    (the digest of its content, never its name: a name re-loaded with new weights must not
    reuse the old weights' blocks), and the cache salt that keeps one tenant's cached
    prefixes out of another's reach."""
    lora = None if request.lora is None else request.lora.digest
    return tuple(key for key in (lora, request.cache_salt) if key is not None)


def update_block_hashes(request: Request, block_size: int) -> list[BlockHash]:
    """Extend ``request.block_hashes`` to cover every full block of its known tokens.

    Incremental: only blocks completed since the last call are hashed, so a decode step
    costs nothing until ``block_size`` new tokens have arrived.
    """
    hashes = request.block_hashes
    num_full_blocks = request.num_tokens // block_size
    if len(hashes) == num_full_blocks:
        return hashes
    token_ids = request.all_token_ids
    embeds = request.prompt_embeds
    for index in range(len(hashes), num_full_blocks):
        parent = hashes[-1] if hashes else None
        extra = first_block_extra_keys(request) if index == 0 else ()
        start = index * block_size
        block_ids = token_ids[start:start + block_size]
        if embeds is not None and start < len(embeds):
            rows = embeds[start:start + block_size].tobytes()
            hashes.append(hash_block_embeds(parent, rows, block_ids, extra))
        else:
            hashes.append(hash_block_tokens(parent, block_ids, extra))
    return hashes

"""The chained block hash: the name under which a full block of KV is found again.

The K/V of the tokens in block i depend on every token before them, not only on the block's own tokens.
So a block is named by `hash(parent hash, its token ids, extra keys)`: the parent hash stands for the
whole prefix in 32 bytes, and two blocks get the same name only if their entire prefixes are equal.
The first block has no parent; it is chained to a fixed seed, `NONE_HASH`. Extra keys carry whatever else
changes the K/V or must isolate tenants; here a cache salt, mixed into the first block only — the chain
carries it to every later block (vLLM does the same with `cache_salt`).

SHA-256 over a compact byte encoding, not Python's `hash()` of a tuple: `hash()` is 64 bits, not
collision-resistant (prompts can be crafted to collide, and a collision silently serves another prompt's
K/V), and `hash()` of strings changes from process to process. SHA-256 costs a few microseconds per
16-token block here (the bench reports it per token), nothing next to the prefill it saves.
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes  # a 32-byte SHA-256 digest

# The parent of every first block. Fixed, so hashes are reproducible across processes and runs (vLLM draws
# it at random unless PYTHONHASHSEED is set, which makes hashes unguessable by another process).
NONE_HASH: BlockHash = hashlib.sha256(b"kvcourse step03: parent of every first block").digest()


def hash_block_tokens(parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """The hash of one full block: parent hash (None for the first block), its token ids, extra keys.

    Encoding: parent (32 bytes) | number of tokens (uint32) | the tokens (uint32 each, little-endian) |
    repr of the extra keys. The count makes the split between tokens and extras unambiguous.
    """
    # BEGIN SOLUTION task3.block_hash
    h = hashlib.sha256(NONE_HASH if parent is None else parent)
    h.update(struct.pack(f"<I{len(token_ids)}I", len(token_ids), *token_ids))
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()
    # END SOLUTION


def block_extra_keys(block_index: int, cache_salt: str | None) -> tuple:
    """Extra keys of block `block_index` of a request: its cache salt on the first block, nothing else."""
    return (("salt", cache_salt),) if block_index == 0 and cache_salt is not None else ()


def hash_token_blocks(token_ids: Sequence[int], block_size: int, cache_salt: str | None = None) -> list[BlockHash]:
    """The whole chain at once, one hash per full block (a partial last block has none). Sequences compute
    the same chain incrementally; this is the from-scratch version their invariants are checked against."""
    hashes: list[BlockHash] = []
    for i in range(len(token_ids) // block_size):
        block = token_ids[i * block_size: (i + 1) * block_size]
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None, block, block_extra_keys(i, cache_salt)))
    return hashes


def short_hash(h: BlockHash | None) -> str:
    """The first 6 hex digits, for pictures and logs."""
    return "root" if h is None else h.hex()[:6]

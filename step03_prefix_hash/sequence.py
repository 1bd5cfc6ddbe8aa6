"""HashedSequence: a chapter 2 Sequence that keeps the chained hash of each of its full blocks.

Hashes are computed once, incrementally: the prompt's full blocks when the request arrives, then one more
each time decoding fills a block (in `append_token`). Looking a request up in the cache, or publishing
its blocks, never rehashes its prefix (the mini-vllm tutorial's step14_5). A hash says what the block's tokens are, not
whether their K/V exist yet: the cache manager publishes a block only once it has been computed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from step02_paged.sequence import Sequence

from .block_hash import BlockHash, block_extra_keys, hash_block_tokens, hash_token_blocks


@dataclass(eq=False)
class HashedSequence(Sequence):
    block_size: int = field(kw_only=True)  # the pool's, given by the manager that creates the sequence
    cache_salt: str | None = None  # requests with different salts never share blocks
    block_hashes: list[BlockHash] = field(default_factory=list)  # one per full block of all_token_ids

    def __post_init__(self) -> None:
        super().__post_init__()
        self.update_block_hashes()

    def append_token(self, token: int) -> None:
        super().append_token(token)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Hash every block that became full since the last call, each chained to the one before."""
        # BEGIN SOLUTION task3.block_hash
        bs = self.block_size
        while (len(self.block_hashes) + 1) * bs <= self.num_tokens:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if i else None
            tokens = self.all_token_ids[i * bs: (i + 1) * bs]
            self.block_hashes.append(hash_block_tokens(parent, tokens, block_extra_keys(i, self.cache_salt)))
        # END SOLUTION

    def check_invariants(self) -> None:
        super().check_invariants()
        assert self.block_hashes == hash_token_blocks(self.all_token_ids, self.block_size, self.cache_salt), \
            f"sequence {self.seq_id}: its block hashes are not the chain of its tokens"

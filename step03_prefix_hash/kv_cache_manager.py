"""PrefixCachingKVCacheManager: vLLM v1's answers to the cache-manager questions, over a hash -> block map.

It composes chapter 2's pieces: block tables (one per sequence, as in chapter 2) over a
PrefixCachingBlockManager (chapter 2's BlockManager with the hash map and the LRU free queue).
- `get_computed_blocks`: walk the request's block hashes from the first; each one found in the map is a
  block whose K/V can be reused, and the walk stops at the first miss (a chain has no holes). At most
  `num_tokens - 1` tokens may hit: the last prompt token is always computed, because sampling needs its
  logits — a prompt found entirely in the cache still runs one token.
- `allocate_slots`: the hits are touched *before* any new block is allocated, so an allocation can never
  evict a block it is about to reuse; if the pool is too small nothing changes. A match whose blocks were
  evicted since the lookup is refused.
- `on_computed`: after every forward, publish the blocks that became full and computed — prompt blocks
  during prefill, and blocks filled by generated tokens during decode.
- `free`: tail blocks are released first, so a request's last blocks are evicted before its first ones,
  which other requests are likelier to share.
"""
from __future__ import annotations

from step01_kvcache.request import SamplingParams
from step02_paged.cache_manager import CacheManager, PrefixMatch, SharedPrefix
from step02_paged.geometry import PoolGeometry
from step02_paged.kv_cache_manager import check_block_tables, check_slot_usage
from step02_paged.kv_pool import KVPool

from .block_hash import block_extra_keys
from .block_manager import CacheEntry, PrefixCachingBlockManager
from .sequence import HashedSequence


class PrefixCachingKVCacheManager(CacheManager):
    """Block tables over a PrefixCachingBlockManager; sequences hash their full blocks as they fill."""

    design = "hash"

    def __init__(self, geometry: PoolGeometry, pool: KVPool | None = None) -> None:
        super().__init__(geometry, pool)
        self.block_manager = PrefixCachingBlockManager(geometry.num_blocks)
        self._num_published: dict[int, int] = {}  # seq_id -> blocks of its table already published

    def new_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams,
                     cache_salt: str | None = None) -> HashedSequence:
        """A sequence that hashes its blocks; only requests with the same `cache_salt` share blocks."""
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt must be a string, got {type(cache_salt).__name__}")
        return HashedSequence(seq_id, prompt_ids, params, block_size=self.block_size, cache_salt=cache_salt)

    def get_computed_blocks(self, seq: HashedSequence) -> PrefixMatch:
        """The longest chain of cached blocks that starts the sequence, within its first num_tokens - 1
        tokens. Only full blocks are ever cached, so it covers a multiple of the block size. Looks only:
        nothing is held until allocate_slots."""
        # BEGIN SOLUTION task3.lookup points=2
        max_blocks = (seq.num_tokens - 1) // self.block_size  # keep the last token: its logits are needed
        blocks = []
        for block_hash in seq.block_hashes[:max_blocks]:
            block = self.block_manager.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return PrefixMatch(tuple(blocks), len(blocks) * self.block_size)
        # END SOLUTION

    def allocate_slots(self, seq: HashedSequence, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Grow `seq.block_table` for `num_new_tokens` more tokens, all or nothing. On admission the match's
        hits are touched before anything is allocated (so the allocation cannot evict them); they count as
        published."""
        hits = list(match.blocks) if match else []
        self._check_match(seq, hits, match)
        admitting = seq.seq_id not in self.holders
        need = self.blocks_needed(seq, num_new_tokens, match)
        if not need and not admitting:  # most decode steps: the last block still has room
            return True
        bm = self.block_manager
        revived = sum(1 for b in hits if bm.ref_count[b] == 0)  # cached free blocks leave the free queue
        if not bm.can_allocate(need + revived):
            return False
        if admitting:
            bm.touch(hits)
        try:
            new = bm.allocate(need)
        except BaseException:  # the allocator failed: let go of the hits, so the sequence holds nothing
            if admitting:
                bm.release(hits)
            raise
        if admitting:
            seq.block_table = hits
            self.holders[seq.seq_id] = seq
            self._num_published[seq.seq_id] = len(hits)  # hits are published already
        seq.block_table += new
        return True

    def _check_match(self, seq: HashedSequence, hits: list[int], match: PrefixMatch | None) -> None:
        """Refuse, changing nothing, a match that is not this admission's: every block must still hold the
        sequence's content at its position (another admission may have evicted it since the lookup)."""
        if not hits:
            return
        if seq.block_table or match.num_tokens != len(hits) * self.block_size:
            raise ValueError(f"sequence {seq.seq_id}: a match is taken only on admission, as get_computed_blocks "
                             "returned it")
        for i, b in enumerate(hits):
            entry = self.block_manager.entries[b]
            if entry is None or i >= len(seq.block_hashes) or entry.block_hash != seq.block_hashes[i]:
                raise ValueError(f"sequence {seq.seq_id}: stale match, block {b} no longer holds its block {i} "
                                 "(evicted since the lookup); call get_computed_blocks again")

    def on_computed(self, seq: HashedSequence) -> None:
        """Publish the sequence's blocks that are now full of computed tokens, in order."""
        # BEGIN SOLUTION task3.publish points=2
        bs = self.block_size
        done = self._num_published.get(seq.seq_id, 0)
        full = min(seq.num_computed_tokens // bs, len(seq.block_hashes))
        for i in range(done, full):
            entry = CacheEntry(seq.block_hashes[i], seq.block_hashes[i - 1] if i else None,
                               tuple(seq.all_token_ids[i * bs: (i + 1) * bs]), block_extra_keys(i, seq.cache_salt))
            self.block_manager.cache_block(seq.block_table[i], entry)
        self._num_published[seq.seq_id] = max(done, full)
        # END SOLUTION

    def free(self, seq: HashedSequence) -> None:
        """Release the table tail first: the LRU queue then evicts a prefix's end before its start."""
        self.block_manager.release(seq.block_table[::-1])
        seq.block_table = []
        self.holders.pop(seq.seq_id, None)
        self._num_published.pop(seq.seq_id, None)

    def num_common_prefix_blocks(self, seq: HashedSequence) -> int:
        """Leading blocks of `seq`'s table that every request holding blocks lists too (vLLM's
        `get_num_common_prefix_blocks`): a block's ref_count is the number of block tables that list it, so a block
        whose count equals the number of holders is in all of them, at the same place (its content is its chain of
        hashes: it can only sit where that prefix sits). O(blocks counted), no new bookkeeping."""
        # BEGIN SOLUTION task3.common_prefix points=2
        holders, n = len(self.holders), 0
        for b in seq.block_table:
            if self.block_manager.ref_count[b] != holders:
                break
            n += 1
        return n
        # END SOLUTION

    def shared_prefixes(self, seqs: list[HashedSequence], min_blocks: int = 1) -> list[SharedPrefix]:
        """One group, every sequence, when all the requests holding blocks share at least `min_blocks` blocks (a
        request that shares less, even one still prefilling, leaves nothing common to all: ref counts cannot say
        who shares with whom, only how many)."""
        if len(seqs) < 2 or len(seqs) > len(self.holders) or any(s.seq_id not in self.holders for s in seqs):
            return []
        n = self.num_common_prefix_blocks(seqs[0])
        return [SharedPrefix(tuple(seqs), n)] if n >= min_blocks else []

    def reset_cache(self) -> int:
        """Drop every cached block; only when no request holds blocks (RuntimeError otherwise, nothing changed)."""
        if self.holders:
            raise RuntimeError(f"cannot reset the prefix cache while {len(self.holders)} requests hold blocks; "
                               "finish or abort them first")
        return self.block_manager.reset()

    def num_held_blocks(self) -> int:
        """As chapter 2 counts it: free cached blocks wait in the free queue, reclaimable, so not held."""
        return self.num_blocks - self.block_manager.num_free

    def check_invariants(self) -> None:
        """The block manager's; ref counts = block tables (chapter 2's rule); and: a sequence's hashes are the
        chain of its tokens; a cached block in a block table sits where the sequence has exactly that content,
        and only once the sequence has computed it; published counts cover computed blocks only."""
        self.block_manager.check_invariants()
        check_block_tables(list(self.holders.values()), self.block_manager, self.block_size)
        check_slot_usage(self)
        bs = self.block_size
        assert set(self._num_published) == set(self.holders), "published counts kept for sequences without blocks"
        for seq in self.holders.values():
            seq.check_invariants()
            assert self._num_published[seq.seq_id] * bs <= seq.num_computed_tokens, \
                f"sequence {seq.seq_id}: a block was published before its K/V were computed"
            for i, b in enumerate(seq.block_table):
                entry = self.block_manager.entries[b]
                if entry is None:
                    continue
                assert i < len(seq.block_hashes) and entry.block_hash == seq.block_hashes[i], \
                    f"sequence {seq.seq_id} holds cached block {b} at position {i}, where its content differs"
                assert seq.num_computed_tokens >= (i + 1) * bs, \
                    f"sequence {seq.seq_id} holds cached block {b} at position {i} but has not computed it"

"""RadixKVCacheManager: SGLang's radix cache as the engine's cache manager, one token per slot.

It composes chapter 2's BlockManager (block_size 1, so a block is a slot) with a RadixTree and implements
chapter 2's cache-manager interface. Ownership model (SGLang's): every slot of the pool has exactly one owner.
- the tree owns the slots of the tokens it caches (`insert` hands them over);
- a request owns the slots it allocated that are not in the tree yet (its *private* slots);
- the rest are on the free list.
The BlockManager keeps counting: a slot's ref_count is 1 when it has an owner and 0 when free. Sharing a cached
prefix adds no count: the request locks the tree node where its prefix ends (`lock_ref` along the parent chain)
and a locked node is never evicted. That is the only reference the request has to the tree - a node pointer,
`seq.last_node`, never a token path (locking by token path is the design mistake tests/step04 replays).

A request's block table therefore reads: `block_table[:cache_protected_len]` = the tree's slots along the path
to `last_node` (locked), `block_table[cache_protected_len:]` = private slots.

Life of a request:
1. admission: `get_computed_blocks` matches the prompt (all but its last token, whose logits are needed) and
   returns the slots with the node where the match ends; `allocate_slots` locks that node, evicts LRU leaves if
   the free list is short, allocates the rest;
2. after each prefill chunk: `cache_unfinished_req` inserts what is computed, frees the slots the tree already
   had (duplicates), points the block table at the tree's slots and moves the lock down to the new node;
3. finish, abort or preemption (`free`): `cache_finished_req` does the same insert, frees duplicates and
   unlocks. The tokens stay cached, evictable, until memory is needed.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from step01_kvcache.generate import SamplingParams
from step02_paged.block_manager import BlockManager
from step02_paged.cache_manager import CacheManager, PrefixMatch
from step02_paged.sequence import Sequence

from .radix_tree import RadixTree, TreeNode


@dataclass(eq=False)
class RadixSequence(Sequence):
    """A chapter 2 Sequence that also remembers its place in the radix tree."""

    last_node: TreeNode | None = None  # locked: where the part of block_table owned by the tree ends
    cache_protected_len: int = 0  # block_table[:cache_protected_len] are tree slots
    num_prefill_tokens: int = 0  # tokens to prefill when admitted: later forwards beyond it are decodes


@dataclass(frozen=True)
class TreeMatch(PrefixMatch):
    """A lookup's answer: the slots of the cached prefix and the node where it ends (locked on admission)."""

    node: TreeNode | None = None


def check_match(tree: RadixTree, seq: RadixSequence, admitting: bool, match: TreeMatch | None) -> None:
    """Refuse, changing nothing, a match that is not this admission's, or that went stale: between the lookup and
    the allocation another admission may have evicted the matched node."""
    if not (match and match.blocks):
        return
    if not admitting:
        raise ValueError(f"sequence {seq.seq_id}: a match is taken only on admission")
    node = match.node
    if node is None or not tree.contains(node) or tree.prefix_slots(node) != list(match.blocks) \
            or tree.prefix_tokens(node) != seq.all_token_ids[: tree.depth(node)]:
        raise ValueError(f"sequence {seq.seq_id}: stale match, its node was evicted since the lookup; "
                         "call get_computed_blocks again")


class RadixKVCacheManager(CacheManager):
    """A slot pool whose finished and in-flight prefixes live in a RadixTree."""

    def __init__(self, num_slots: int, block_size: int = 1) -> None:
        if block_size != 1:
            raise ValueError(f"the radix cache stores one token per slot: block_size must be 1, got {block_size}")
        self.block_size = 1
        self.block_manager = BlockManager(num_slots)
        self.tree = RadixTree()
        self.holders: dict[int, RadixSequence] = {}
        self.num_evicted = 0  # slots taken back from the tree under memory pressure
        # the first admission of each request, (seq_id, prompt tokens, of them cached), for hit rates
        self.admissions: deque[tuple[int, int, int]] = deque(maxlen=4096)

    def new_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams) -> RadixSequence:
        return RadixSequence(seq_id, prompt_ids, params)

    # ---- admission ---------------------------------------------------------------------------------------
    def get_computed_blocks(self, seq: RadixSequence) -> TreeMatch:
        """The cached slots of the sequence's prefix, leaving at least its last token to compute."""
        slots, node = self.tree.match_prefix(seq.all_token_ids[: seq.num_tokens - 1])
        return TreeMatch(tuple(slots), len(slots), node)

    def allocate_slots(self, seq: RadixSequence, num_new_tokens: int, match: TreeMatch | None = None) -> bool:
        """All or nothing. On admission the matched node is locked first (so that the eviction that may follow
        cannot take it); then LRU leaves are evicted if the free list is short, and new slots allocated."""
        admitting = seq.seq_id not in self.holders
        hits = list(match.blocks) if match else []
        check_match(self.tree, seq, admitting, match)
        node = match.node if hits else self.tree.root
        if admitting:
            self.tree.inc_lock_ref(node)
        computed = len(hits) if hits else seq.num_computed_tokens
        need = max(0, computed + num_new_tokens - len(seq.block_table) - len(hits))
        bm = self.block_manager
        if need > bm.num_free:
            self.evict(need - bm.num_free)
        if not bm.can_allocate(need):
            if admitting:
                self.tree.dec_lock_ref(node)
            return False
        if admitting:
            seq.block_table, seq.num_computed_tokens = hits, computed
            seq.last_node, seq.cache_protected_len = node, len(hits)
            seq.num_prefill_tokens = seq.num_tokens
            self.holders[seq.seq_id] = seq
            if seq.record_prompt_hit(len(hits)):
                self.admissions.append((seq.seq_id, seq.num_prompt_tokens, len(hits)))
        seq.block_table += bm.allocate(need)
        return True

    def evict(self, num: int) -> int:
        """Free at least `num` slots from unlocked leaves, least recently used first (fewer if the tree holds
        fewer unlocked ones). Returns the number freed."""
        freed = self.tree.evict(num, self.block_manager.release)
        self.num_evicted += freed
        return freed

    # ---- caching computed tokens -------------------------------------------------------------------------
    def on_computed(self, seq: RadixSequence) -> None:
        """After a prefill chunk (not after a decode step) the computed tokens join the tree at once, so that
        requests arriving meanwhile can share them."""
        if seq.num_computed_tokens <= seq.num_prefill_tokens:
            self.cache_unfinished_req(seq)

    def _insert(self, seq: RadixSequence) -> int:
        """Insert the computed tokens; free the private slots of tokens the tree already had. Returns how many
        tokens are now in the tree."""
        n = seq.num_computed_tokens
        slots = seq.block_table[:n]
        cached = self.tree.insert(seq.all_token_ids[:n], slots)
        self.block_manager.release(slots[seq.cache_protected_len: cached])  # duplicates of the tree's slots
        return n

    def cache_unfinished_req(self, seq: RadixSequence) -> None:
        """Give the computed prefix to the tree and keep using it through a lock on its last node."""
        n = self._insert(seq)
        slots, node = self.tree.match_prefix(seq.all_token_ids[:n])
        assert len(slots) == n, "the tokens just inserted must match in full"
        seq.block_table[:n] = slots  # the head of the table now names the tree's slots
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(seq.last_node)
        seq.last_node, seq.cache_protected_len = node, n

    def cache_finished_req(self, seq: RadixSequence) -> None:
        """Give every computed token to the tree, free the rest, and unlock."""
        n = self._insert(seq)
        self.block_manager.release(seq.block_table[n:])  # slots allocated but never written
        self.tree.dec_lock_ref(seq.last_node)
        seq.block_table, seq.last_node, seq.cache_protected_len = [], None, 0

    def free(self, seq: RadixSequence) -> None:
        """Finish, abort or preemption: the sequence's computed tokens stay cached (a preempted sequence will
        usually find them again when it is re-admitted)."""
        if seq.seq_id in self.holders:
            self.cache_finished_req(seq)
            del self.holders[seq.seq_id]

    def reset_cache(self) -> None:
        """Drop every cached token (nobody may hold a lock): the slots return to the free list."""
        if self.holders or self.tree.protected_size:
            raise ValueError(f"{len(self.holders)} sequences still use the cache; reset only a drained engine")
        self.block_manager.release(self.tree.all_slots())
        self.tree.reset()

    # ---- accounting --------------------------------------------------------------------------------------
    def private_slots(self, seq: RadixSequence) -> list[int]:
        """The part of the block table that is the request's own, after the tree's part."""
        return seq.block_table[seq.cache_protected_len:]

    def slot_usage(self) -> tuple[int, int]:
        """(allocated, filled) slots held for live requests: their private slots plus the locked part of the
        tree, each shared token once. Evictable cached tokens are reclaimable, so they are not counted (as a
        hash cache does not count its free cached blocks)."""
        private = sum(len(self.private_slots(s)) for s in self.holders.values())
        filled = sum(min(len(self.private_slots(s)), s.num_computed_tokens - s.cache_protected_len)
                     for s in self.holders.values())
        return private + self.tree.protected_size, filled + self.tree.protected_size

    def check_invariants(self) -> None:
        """The tree's and the BlockManager's; each request's place in the tree; each lock_ref counting the
        requests under it; then the ownership model: every slot has exactly one owner among the tree, one
        request (its private slots) and the free list, and ref_count 1 exactly when owned."""
        tree, bm = self.tree, self.block_manager
        tree.check_invariants()
        bm.check_invariants()
        locks: Counter = Counter()
        owned: Counter = Counter(tree.all_slots())
        for seq in self.holders.values():
            node = seq.last_node
            assert not seq.is_finished, f"finished sequence {seq.seq_id} still holds slots"
            assert node is not None and tree.contains(node), f"sequence {seq.seq_id} holds no node of the tree"
            assert seq.cache_protected_len == tree.depth(node), \
                f"sequence {seq.seq_id}: cache_protected_len {seq.cache_protected_len} != depth of its last_node"
            assert seq.block_table[: seq.cache_protected_len] == tree.prefix_slots(node), \
                f"sequence {seq.seq_id}: block table does not start with the tree's slots of its prefix"
            assert seq.all_token_ids[: seq.cache_protected_len] == tree.prefix_tokens(node), \
                f"sequence {seq.seq_id}: its last_node's path is not its own prefix"
            assert seq.num_computed_tokens <= len(seq.block_table) <= seq.num_tokens, \
                f"sequence {seq.seq_id}: {len(seq.block_table)} slots for {seq.num_computed_tokens} computed tokens"
            locks.update(n.id for n in tree.path(node))
            owned.update(self.private_slots(seq))
        for node in tree.nodes():
            assert node.lock_ref == locks.get(node.id, 0), \
                f"{node!r}: lock_ref {node.lock_ref} but {locks.get(node.id, 0)} live requests lock it"
        free = set(bm.free_blocks)
        for slot in range(self.num_blocks):
            owners = owned.get(slot, 0) + (slot in free)
            assert owners == 1, f"slot {slot} has {owners} owners among the tree, the requests and the free list"
            assert bm.ref_count[slot] == owned.get(slot, 0), \
                f"slot {slot}: ref_count {bm.ref_count[slot]} but {owned.get(slot, 0)} owners"

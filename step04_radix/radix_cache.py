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

The functions before the class are what any manager with a tree in front of a BlockManager does the same way,
whatever it counts (chapter 5's bridge calls them too): admission with a lock, the move of that lock, and the
invariants that tie each request to its place in the tree.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from step01_kvcache.request import SamplingParams
from step02_paged.block_manager import BlockManager
from step02_paged.cache_manager import CacheManager, PrefixMatch
from step02_paged.kv_cache_manager import check_slot_usage
from step02_paged.sequence import Sequence

from .radix_tree import RadixTree, TreeNode


@dataclass(eq=False)
class RadixSequence(Sequence):
    """A chapter 2 Sequence that also remembers its place in the radix tree."""

    last_node: TreeNode | None = None  # locked: where the part of block_table owned by the tree ends
    cache_protected_len: int = 0  # tokens of the locked prefix; their values head the block table
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


def allocate_on_tree(kv: RadixKVCacheManager, seq: RadixSequence, num_new_tokens: int,
                     match: TreeMatch | None) -> bool:
    """All or nothing. On admission the matched node is locked first (so that the eviction that may follow
    cannot take it) and the block table starts with the match's values; then LRU leaves are evicted if the free
    list is short, and the missing values allocated. Adds no reference count: that is the caller's model."""
    admitting = seq.seq_id not in kv.holders
    check_match(kv.tree, seq, admitting, match)
    need = kv.blocks_needed(seq, num_new_tokens, match)
    if not need and not admitting:  # a decode whose last block still has room
        return True
    node = match.node if match and match.blocks else kv.tree.root
    if admitting:
        kv.tree.inc_lock_ref(node)
    if need > kv.block_manager.num_free:
        kv.evict(need - kv.block_manager.num_free)
    if not kv.block_manager.can_allocate(need):
        if admitting:
            kv.tree.dec_lock_ref(node)
        return False
    if admitting:
        seq.block_table = list(match.blocks) if match else []
        seq.last_node, seq.cache_protected_len = node, kv.tree.depth(node)
        seq.num_prefill_tokens = seq.num_tokens
        kv.holders[seq.seq_id] = seq
    seq.block_table += kv.block_manager.allocate(need)
    return True


def move_lock(tree: RadixTree, seq: RadixSequence, num_tokens: int) -> list[int]:
    """Lock the node where the sequence's first `num_tokens` tokens end (they were just inserted) and unlock the
    one it held. Returns the values on the path to the new node."""
    values, node = tree.match_prefix(seq.all_token_ids[:num_tokens])
    assert tree.depth(node) == num_tokens, "the tokens just inserted must match in full"
    tree.inc_lock_ref(node)
    tree.dec_lock_ref(seq.last_node)
    seq.last_node, seq.cache_protected_len = node, num_tokens
    return values


def reset_tree(kv: CacheManager, tree: RadixTree, block_manager: BlockManager) -> int:
    """Forget everything `tree` caches and give its values back to `block_manager`; only while no request uses the
    cache (RuntimeError otherwise, nothing changed). Returns how many values were released."""
    if kv.holders or tree.protected_size:
        raise RuntimeError(f"cannot reset the prefix cache while {len(kv.holders)} requests use it; "
                           "finish or abort them first")
    values = tree.all_slots()
    block_manager.release(values)
    tree.reset()
    return len(values)


def check_tree_holders(tree: RadixTree, holders: dict[int, RadixSequence]) -> None:
    """Each live request's place in the tree: its last_node is attached, at the depth it believes, on its own
    prefix, and its block table starts with the values along that path; each lock_ref counts the requests whose
    locked path runs through the node."""
    locks: Counter = Counter()
    for seq in holders.values():
        node = seq.last_node
        assert not seq.is_finished, f"finished sequence {seq.seq_id} still holds slots"
        assert node is not None and tree.contains(node), f"sequence {seq.seq_id} holds no node of the tree"
        assert seq.cache_protected_len == tree.depth(node), \
            f"sequence {seq.seq_id}: cache_protected_len {seq.cache_protected_len} != depth of its last_node"
        assert seq.block_table[: tree.span(0, seq.cache_protected_len)] == tree.prefix_slots(node), \
            f"sequence {seq.seq_id}: block table does not start with the tree's values of its prefix"
        assert seq.all_token_ids[: seq.cache_protected_len] == tree.prefix_tokens(node), \
            f"sequence {seq.seq_id}: its last_node's path is not its own prefix"
        locks.update(n.id for n in tree.path(node))
    for node in tree.nodes():
        assert node.lock_ref == locks.get(node.id, 0), \
            f"{node!r}: lock_ref {node.lock_ref} but {locks.get(node.id, 0)} live requests lock it"


class RadixKVCacheManager(CacheManager):
    """A slot pool whose finished and in-flight prefixes live in a RadixTree."""

    design = "radix"

    def __init__(self, num_slots: int, block_size: int = 1) -> None:
        if block_size != 1:
            raise ValueError(f"the radix cache stores one token per slot: block_size must be 1, got {block_size}")
        super().__init__(block_size)
        self.block_manager = BlockManager(num_slots)
        self.tree = RadixTree()
        self.num_evicted = 0  # slots taken back from the tree under memory pressure

    def new_sequence(self, seq_id: int, prompt_ids: list[int], params: SamplingParams) -> RadixSequence:
        return RadixSequence(seq_id, prompt_ids, params)

    # ---- admission ---------------------------------------------------------------------------------------
    def get_computed_blocks(self, seq: RadixSequence) -> TreeMatch:
        """The cached slots of the sequence's prefix, leaving at least its last token to compute."""
        slots, node = self.tree.match_prefix(seq.all_token_ids[: seq.num_tokens - 1])
        return TreeMatch(tuple(slots), len(slots), node)

    def allocate_slots(self, seq: RadixSequence, num_new_tokens: int, match: TreeMatch | None = None) -> bool:
        """Lock, evict if needed, allocate (`allocate_on_tree`). The request takes no count on the tree's slots:
        its lock is what keeps them."""
        return allocate_on_tree(self, seq, num_new_tokens, match)

    def evict(self, num: int) -> int:
        """Free at least `num` slots from unlocked leaves, least recently used first (fewer if the tree holds
        fewer unlocked ones). Returns the number freed."""
        freed = self.tree.evict(num, lambda leaf: self.block_manager.release(leaf.value))
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
        tokens were inserted (all the computed ones)."""
        n = seq.num_computed_tokens
        slots = seq.block_table[:n]
        cached = self.tree.insert(seq.all_token_ids[:n], slots)
        self.block_manager.release(slots[seq.cache_protected_len: cached])  # duplicates of the tree's slots
        return n

    def cache_unfinished_req(self, seq: RadixSequence) -> None:
        """Give the computed prefix to the tree and keep using it through a lock on its last node; the head of
        the block table now names the tree's slots (its own duplicates were just freed)."""
        start = seq.cache_protected_len  # the table names the tree's slots up to here already
        n = self._insert(seq)
        seq.rewrite_blocks(start, move_lock(self.tree, seq, n)[start:])

    def cache_finished_req(self, seq: RadixSequence) -> None:
        """Give every computed token to the tree, free the rest, and unlock."""
        n = self._insert(seq)
        self.block_manager.release(seq.block_table[n:][::-1])  # slots allocated but never written, tail first
        self.tree.dec_lock_ref(seq.last_node)
        seq.block_table, seq.last_node, seq.cache_protected_len = [], None, 0

    def free(self, seq: RadixSequence) -> None:
        """Finish, abort or preemption: the sequence's computed tokens stay cached (a preempted sequence will
        usually find them again when it is re-admitted)."""
        if seq.seq_id in self.holders:
            self.cache_finished_req(seq)
            del self.holders[seq.seq_id]

    def reset_cache(self) -> int:
        """Drop every cached token (nobody may hold a lock): the slots return to the free list. Returns how many."""
        return reset_tree(self, self.tree, self.block_manager)

    # ---- accounting --------------------------------------------------------------------------------------
    def private_slots(self, seq: RadixSequence) -> list[int]:
        """The part of the block table that is the request's own, after the tree's part."""
        return seq.block_table[seq.cache_protected_len:]

    def num_held_blocks(self) -> int:
        """Slots live requests use: every owned slot but the tree's unlocked (evictable) ones, which are
        reclaimable, as a hash cache's free cached blocks are."""
        return self.num_blocks - self.block_manager.num_free - self.tree.evictable_size

    def check_invariants(self) -> None:
        """The tree's and the BlockManager's; each request's place in the tree and the lock counts
        (`check_tree_holders`); then the ownership model: every slot has exactly one owner among the tree, one
        request (its private slots) and the free list, and ref_count 1 exactly when owned."""
        tree, bm = self.tree, self.block_manager
        tree.check_invariants()
        bm.check_invariants()
        check_tree_holders(tree, self.holders)
        check_slot_usage(self)
        owned: Counter = Counter(tree.all_slots())
        for seq in self.holders.values():
            assert seq.num_computed_tokens <= len(seq.block_table) <= seq.num_tokens + seq.num_placeholders, \
                f"sequence {seq.seq_id}: {len(seq.block_table)} slots for {seq.num_computed_tokens} computed tokens"
            owned.update(self.private_slots(seq))
        free = set(bm.free_blocks)
        for slot in range(self.num_blocks):
            owners = owned.get(slot, 0) + (slot in free)
            assert owners == 1, f"slot {slot} has {owners} owners among the tree, the requests and the free list"
            assert bm.ref_count[slot] == owned.get(slot, 0), \
                f"slot {slot}: ref_count {bm.ref_count[slot]} but {owned.get(slot, 0)} owners"

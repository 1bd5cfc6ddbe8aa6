"""RadixKVCacheManager: chapter 2's KVCacheManager with SGLang's radix cache, one token per slot.

Ownership model (SGLang's): every slot of the pool has exactly one owner.
- the tree owns the slots of the tokens it caches (`insert` hands them over);
- a request owns the slots it allocated that are not in the tree yet (its *private* slots);
- the rest are on the free list.
The BlockManager (block_size 1, so a block is a slot) keeps counting: a slot's ref_count is 1 when it has an
owner and 0 when free. Sharing a cached prefix adds no count: the request locks the tree node where its prefix
ends (`lock_ref` along the parent chain) and a locked node is never evicted. That is the only reference the
request has to the tree - a node pointer, `seq.last_node`, never a token path (seed 000's Bug 3).

A request's block table therefore reads: `block_table[:cache_protected_len]` = the tree's slots along the path
to `last_node` (locked), `block_table[cache_protected_len:]` = private slots.

Life of a request:
1. admission: `get_computed_blocks` matches the prompt (all but its last token, whose logits are needed),
   `allocate_slots` locks the match, evicts LRU leaves if the free list is short, allocates the rest;
2. after each prefill chunk: `cache_unfinished_req` inserts what is computed, frees the slots the tree already
   had (duplicates), points the block table at the tree's slots and moves the lock down to the new node;
3. finish, abort or preemption (`free`): `cache_finished_req` does the same insert, frees duplicates and
   unlocks. The tokens stay cached, evictable, until memory is needed.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from course.draw import Dot
from step02_paged.kv_cache_manager import KVCacheManager, cdiv
from step02_paged.sequence import Sequence

from .radix_tree import Decode, RadixTree, TreeNode


@dataclass(eq=False)
class RadixSequence(Sequence):
    """A step02 Sequence that also remembers its place in the radix tree."""

    last_node: TreeNode | None = None  # locked: where the part of block_table owned by the tree ends
    cache_protected_len: int = 0  # block_table[:cache_protected_len] are tree slots
    num_prefill_tokens: int = 0  # tokens to prefill when admitted: later forwards beyond it are decodes


class RadixKVCacheManager(KVCacheManager):
    """A slot pool (block_size 1) whose finished and in-flight prefixes live in a RadixTree."""

    def __init__(self, num_slots: int, block_size: int = 1) -> None:
        super().__init__(num_slots, block_size)
        self.tree = self._make_tree()
        self._matched: dict[int, TreeNode] = {}  # seq_id -> node found by get_computed_blocks, not locked yet
        self.num_evicted = 0  # slots (blocks, in chapter 5) taken back from the tree under memory pressure
        # the latest admissions, (seq_id, prompt tokens, of them cached), for hit rates per request and round
        self.admissions: deque[tuple[int, int, int]] = deque(maxlen=4096)

    def _make_tree(self) -> RadixTree:
        if self.block_size != 1:
            raise ValueError(f"the radix cache stores one token per slot: block_size must be 1, got "
                             f"{self.block_size} (chapter 5 bridges a token tree to bigger blocks)")
        return RadixTree()

    # ---- admission ---------------------------------------------------------------------------------------
    def get_computed_blocks(self, seq: RadixSequence) -> tuple[list[int], int]:
        """The cached slots of the sequence's prefix, leaving at least its last token to compute."""
        slots, node = self.tree.match_prefix(seq.all_token_ids[: seq.num_tokens - 1])
        self._matched[seq.seq_id] = node
        return slots, len(slots) * self.block_size

    def allocate_slots(self, seq: RadixSequence, num_new_tokens: int, computed_blocks: list[int] = (),
                       num_computed_tokens: int = 0) -> bool:
        """Step02's all-or-nothing allocation, after locking the matched prefix (so that the eviction that may
        follow cannot take it) and evicting LRU leaves if the free list is short."""
        admitting = seq.seq_id not in self.holders
        node = self.tree.root
        if admitting:
            matched = self._matched.pop(seq.seq_id, self.tree.root)
            if computed_blocks:
                node = matched
                if (len(computed_blocks) * self.block_size != num_computed_tokens
                        or list(computed_blocks) != self.tree.prefix_slots(node)):
                    raise ValueError("computed_blocks must be what get_computed_blocks just returned")
            self.tree.inc_lock_ref(node)
        done = num_computed_tokens if computed_blocks else seq.num_computed_tokens
        need = cdiv(done + num_new_tokens, self.block_size) - len(seq.block_table) - len(computed_blocks)
        short = need - self.block_manager.num_free
        if short > 0:
            self.evict(short)
        if not super().allocate_slots(seq, num_new_tokens, computed_blocks, num_computed_tokens):
            if admitting:
                self.tree.dec_lock_ref(node)
            return False
        if admitting:
            seq.last_node, seq.cache_protected_len = node, self.tree.depth(node)
            seq.num_prefill_tokens = seq.num_tokens
            self.admissions.append((seq.seq_id, seq.num_prompt_tokens, seq.num_cached_tokens))
        return True

    def _share(self, blocks: list[int]) -> None:
        """No per-slot count for a shared prefix: the lock on `last_node` keeps it alive (see the module doc)."""

    def evict(self, num: int) -> int:
        """Free at least `num` slots (blocks, in chapter 5) from unlocked leaves, least recently used first
        (fewer if the tree holds fewer unlocked ones). Returns the number freed."""
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
        assert len(slots) == self.tree.span(0, n), "the tokens just inserted must match in full"
        self._use_tree_values(seq, slots)
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(seq.last_node)
        seq.last_node, seq.cache_protected_len = node, n

    def _use_tree_values(self, seq: RadixSequence, slots: list[int]) -> None:
        """Point the block table's head at the tree's slots (`_insert` already freed the private duplicates)."""
        seq.block_table[: len(slots)] = slots

    def cache_finished_req(self, seq: RadixSequence) -> None:
        """Give every computed token to the tree, free the rest, and unlock."""
        n = self._insert(seq)
        self.block_manager.release(seq.block_table[n:])  # slots allocated but never written
        self.tree.dec_lock_ref(seq.last_node)
        seq.block_table, seq.last_node, seq.cache_protected_len = [], None, 0

    def free(self, seq: RadixSequence) -> None:
        """Finish, abort or preemption: the sequence's computed tokens stay cached (a preempted sequence will
        usually find them again when it is re-admitted)."""
        self._matched.pop(seq.seq_id, None)
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
        return seq.block_table[self.tree.span(0, seq.cache_protected_len):]

    def expected_ref_counts(self) -> Counter:
        """One count per owner: the tree for its slots, a request for its private slots."""
        owners = Counter(self.tree.all_slots())
        for seq in self.holders.values():
            owners.update(self.private_slots(seq))
        return owners

    def slot_usage(self) -> tuple[int, int]:
        """(allocated, filled) slots held for live requests: their private slots plus the locked part of the
        tree, each shared token once. Evictable cached tokens are reclaimable, so they are not counted (as a
        hash cache does not count its free cached blocks)."""
        private = sum(len(self.private_slots(s)) for s in self.holders.values())
        filled = sum(min(len(self.private_slots(s)), s.num_computed_tokens - s.cache_protected_len)
                     for s in self.holders.values())
        return private + self.tree.protected_size, filled + self.tree.protected_size

    def check_invariants(self) -> None:
        """Step02's checks (every ref_count equals `expected_ref_counts`), the tree's, each request's place in
        the tree, each lock_ref counting the requests under it, then the ownership model."""
        self.tree.check_invariants()
        super().check_invariants()
        tree = self.tree
        locks: Counter = Counter()
        for seq in self.holders.values():
            node = seq.last_node
            assert node is not None and tree.contains(node), f"sequence {seq.seq_id} holds no node of the tree"
            assert seq.cache_protected_len == tree.depth(node), \
                f"sequence {seq.seq_id}: cache_protected_len {seq.cache_protected_len} != depth of its last_node"
            assert seq.block_table[: tree.span(0, seq.cache_protected_len)] == tree.prefix_slots(node), \
                f"sequence {seq.seq_id}: block table does not start with the tree's {tree.value_name} of its prefix"
            assert seq.all_token_ids[: seq.cache_protected_len] == tree.prefix_tokens(node), \
                f"sequence {seq.seq_id}: its last_node's path is not its own prefix"
            locks.update(n.id for n in tree.path(node))
        for node in tree.nodes():
            assert node.lock_ref == locks.get(node.id, 0), \
                f"{node!r}: lock_ref {node.lock_ref} but {locks.get(node.id, 0)} live requests lock it"
        self._check_ownership()

    def _check_ownership(self) -> None:
        """SGLang's single-owner model: every slot is owned by exactly one of the tree, one request (its
        private slots) or the free list."""
        owned: Counter = Counter(self.tree.all_slots())
        for seq in self.holders.values():
            owned.update(self.private_slots(seq))
        free = set(self.block_manager.free_blocks)
        for slot in range(self.num_blocks):
            owners = owned.get(slot, 0) + (slot in free)
            assert owners == 1, f"slot {slot} has {owners} owners among the tree, the requests and the free list"

    def occupancy_map(self) -> str:
        """One character per slot: a request's id (mod 36) for its private slots, '*' for locked tree slots,
        '-' for evictable cached slots, '.' for free ones."""
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"
        cells = ["."] * self.num_blocks
        for node in self.tree.nodes():
            for s in node.value:
                cells[s] = "*" if node.lock_ref else "-"
        for seq in self.holders.values():
            for s in self.private_slots(seq):
                cells[s] = digits[seq.seq_id % 36]
        return "".join(cells)

    def to_text(self, decode: Decode | None = None) -> str:
        """The tree as indented text, then one line per live request: the node it locks and what it holds."""
        lines = [self.tree.to_text(decode)]
        lines += [self._describe(seq) for seq in sorted(self.holders.values(), key=lambda s: s.seq_id)]
        return "\n".join(lines)

    def _describe(self, seq: RadixSequence) -> str:
        return (f"seq {seq.seq_id}: locks node #{seq.last_node.id} ({seq.cache_protected_len} tokens in the tree), "
                f"{len(self.private_slots(seq))} private {self.tree.value_name}")

    def to_dot(self, decode: Decode | None = None, name: str = "radix_cache") -> str:
        """The tree, plus one box per live request pointing at the node it locks."""
        dot = Dot(name, rankdir="LR", nodesep="0.2", ranksep="0.3")
        self.tree.draw(dot, decode)
        for seq in sorted(self.holders.values(), key=lambda s: s.seq_id):
            dot.node(f"seq{seq.seq_id}", f"seq {seq.seq_id}\n{seq.cache_protected_len} tok in tree, "
                     f"{len(self.private_slots(seq))} private", shape="note", fillcolor="#e8f0fe")
            dot.edge(f"seq{seq.seq_id}", f"n{seq.last_node.id}", "last_node", style="dashed", color="#1a73e8")
        return dot.source()

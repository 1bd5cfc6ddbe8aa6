"""Cache-aware scheduling: admit first the waiting requests whose prefix the cache already holds (SGLang's `lpm`
and `dfs-weight` schedule policies), without letting anyone wait forever.

Chapter 2's scheduler admits from the front of its waiting queue and lets a policy order that queue first; its
own policy, FCFS, keeps arrival order. When the pool cannot keep every shared prefix at once, arrival order can
thrash: a request evicts the prefix that the next one needed. A cache-aware policy asks the cache manager how
much of each waiting prompt is cached (`get_computed_blocks`, which looks only) and puts the best-served first,
so the prefixes in the pool are used while they are there.

Two costs come with it, and each has its guard:
- the lookup: ordering matches every waiting prompt at every admission, O(queue x prompt). Above
  `fcfs_above` waiting requests (SGLang's threshold: 128) the queue goes back to arrival order, with no lookup;
- starvation: a request whose prefix is never cached can be passed over for as long as better-served requests
  keep arriving. `max_overtakes` bounds it: no request is admitted after more than that many requests that
  arrived after it (`None`: no bound, as in SGLang).

Only requests never admitted are reordered: preempted ones stay at the front, as chapter 2 queued them. Request
ids are handed out in arrival order, so `seq_id` is the arrival order.
"""
from __future__ import annotations

from bisect import bisect_right, insort
from collections import Counter, deque

from step02_paged.cache_manager import CacheManager
from step02_paged.scheduler import FCFS, Policy
from step02_paged.sequence import Sequence

from .radix_tree import TreeNode
from .tree_cache import TreeCacheManager

FCFS_ABOVE = 128  # SGLang turns the cache-aware sort off above this many waiting requests


class CacheAwarePolicy(Policy):
    """What every cache-aware policy shares: the preempted head left alone, the fallback to arrival order on a long
    queue, and the bound on overtaking. A subclass says how to `rank` the requests never admitted."""

    name = "cache-aware"

    def __init__(self, max_overtakes: int | None = None, fcfs_above: int = FCFS_ABOVE) -> None:
        def count(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and x >= 0

        if not (max_overtakes is None or count(max_overtakes)):
            raise ValueError(f"max_overtakes must be None or an int >= 0, got {max_overtakes!r}")
        if not count(fcfs_above):
            raise ValueError(f"fcfs_above must be an int >= 0, got {fcfs_above!r}")
        self.max_overtakes, self.fcfs_above = max_overtakes, fcfs_above
        self.overtaken: dict[Sequence, int] = {}  # waiting request -> requests that arrived after it, admitted
        self._admitted: list[int] = []  # ids of the first admissions since the last call, as the scheduler told
        self.num_fcfs_fallbacks = 0  # calls answered in arrival order, without a lookup

    def on_admit(self, seq: Sequence) -> None:
        """A first admission (a recompute after a preemption overtakes nobody)."""
        if not seq.num_preemptions:
            self._admitted.append(seq.seq_id)

    def order(self, waiting: deque[Sequence], cache_manager: CacheManager, seats: int) -> None:
        """Preempted requests first, as they are; then the others ranked, within the bound on overtaking (at most
        `seats` of them are admitted before the next call)."""
        head = 0
        while head < len(waiting) and waiting[head].num_preemptions:
            head += 1
        fresh = list(waiting)[head:]
        self._count_overtakes(fresh)
        if len(fresh) < 2:
            return
        if len(fresh) > self.fcfs_above:  # the lookups would cost more than they save
            self.num_fcfs_fallbacks += 1
            ranked = sorted(fresh, key=lambda seq: seq.seq_id)
        else:
            ranked = self._bounded(self.rank(fresh, cache_manager), seats)
        for _ in fresh:
            waiting.pop()
        waiting.extend(ranked)

    def rank(self, fresh: list[Sequence], cache_manager: CacheManager) -> list[Sequence]:
        """The requests never admitted, best first (ties in arrival order)."""
        raise NotImplementedError

    def _count_overtakes(self, fresh: list[Sequence]) -> None:
        """Every request admitted since the last call overtook the requests still waiting that arrived before it."""
        admitted = sorted(self._admitted)
        self._admitted.clear()
        self.overtaken = {s: self.overtaken.get(s, 0) + len(admitted) - bisect_right(admitted, s.seq_id)
                          for s in fresh}

    def _bounded(self, ranked: list[Sequence], seats: int) -> list[Sequence]:
        """`ranked`, changed as little as needed so that admitting up to `seats` requests from its front overtakes
        nobody more than `max_overtakes` times in all.

        A request is *due* when the later arrivals among the first `seats` ranked ahead of it (those that could be
        admitted before it now), added to the requests that already overtook it, exceed the bound. If any is due,
        take the latest-arriving due request: it and every request that arrived before it go first, in arrival
        order (nobody among them is overtaken), and the rest keep their rank (none of them has more later arrivals
        ahead of it within the first `seats` than before, so none becomes due)."""
        if self.max_overtakes is None:
            return ranked
        # BEGIN SOLUTION task4.lpm points=2
        window: list[int] = []  # ids of the first `seats` ranked requests seen so far, sorted
        cut = -1  # the latest arrival among the due requests
        for i, seq in enumerate(ranked):
            later_ahead = len(window) - bisect_right(window, seq.seq_id)
            if self.overtaken.get(seq, 0) + later_ahead > self.max_overtakes:
                cut = max(cut, seq.seq_id)
            if i < seats:
                insort(window, seq.seq_id)
        if cut < 0:
            return ranked
        first = sorted((seq for seq in ranked if seq.seq_id <= cut), key=lambda seq: seq.seq_id)
        return first + [seq for seq in ranked if seq.seq_id > cut]
        # END SOLUTION


class LongestPrefixMatch(CacheAwarePolicy):
    """SGLang's `lpm`: the waiting request with the longest cached prefix first."""

    name = "lpm"

    def rank(self, fresh: list[Sequence], cache_manager: CacheManager) -> list[Sequence]:
        # BEGIN SOLUTION task4.lpm points=2
        cached = {seq: cache_manager.get_computed_blocks(seq).num_tokens for seq in fresh}
        return sorted(fresh, key=lambda seq: (-cached[seq], seq.seq_id))
        # END SOLUTION


class DFSWeight(CacheAwarePolicy):
    """SGLang's `dfs-weight`: the queue in the order of a depth-first walk of the tree, heaviest subtree first.

    Each waiting request sits at the node where its cached prefix ends; a node's weight is the number of requests
    at it or below it. The walk visits children heaviest first and lists a node's own requests after its
    subtree's, so requests that share a cached prefix run back to back, the most shared first. The SGLang paper
    shows that a depth-first order of a batch's tree is optimal for hits when the cache holds one root-to-leaf path;
    `lpm` approximates it online. It needs a tree: chapter 3's hash has none."""

    name = "dfs-weight"

    def check(self, cache_manager: CacheManager) -> None:
        """Only a manager with a radix tree: the one place that says so."""
        if not isinstance(cache_manager, TreeCacheManager):
            raise ValueError(f"policy 'dfs-weight' walks a radix tree; {type(cache_manager).__name__} has none "
                             "(use lpm)")

    def rank(self, fresh: list[Sequence], cache_manager: TreeCacheManager) -> list[Sequence]:
        tree = cache_manager.tree
        at: dict[TreeNode, list[Sequence]] = {}
        for seq in sorted(fresh, key=lambda s: s.seq_id):
            at.setdefault(cache_manager.get_computed_blocks(seq).node or tree.root, []).append(seq)
        weight: Counter = Counter()
        kids: dict[TreeNode, set[TreeNode]] = {}  # only the nodes on some request's path
        for node, seqs in at.items():
            while node is not tree.root:
                weight[node] += len(seqs)
                kids.setdefault(node.parent, set()).add(node)
                node = node.parent
        out: list[Sequence] = []
        stack: list[tuple[TreeNode, bool]] = [(tree.root, False)]
        while stack:  # post-order, iteratively: a node's subtree, heaviest child first, then its own requests
            node, visited = stack.pop()
            if visited:
                out.extend(at.get(node, ()))
                continue
            stack.append((node, True))
            stack.extend((c, False) for c in sorted(kids.get(node, ()), key=lambda c: (weight[c], -c.id)))
        return out


POLICIES = {"fcfs": FCFS, "lpm": LongestPrefixMatch, "dfs-weight": DFSWeight}


def make_policy(name: str, **options: object):
    """A fresh policy by SGLang's name (`fcfs`, `lpm`, `dfs-weight`); `options` go to a cache-aware one."""
    if name not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {name!r}")
    if name == "fcfs" and options:
        raise ValueError(f"fcfs takes no options, got {sorted(options)}")
    return POLICIES[name](**options)

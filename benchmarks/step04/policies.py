"""`python -m course bench step04 --workload multi_doc`: the waiting-queue policies (policy.py) side by side, on
every design a chapter passes in, with the real model.

All requests arrive at once, in the workload's interleaved order, on an engine with few seats. In a *tight* pool
(room for the running requests and little more) arrival order evicts each document before its next question,
while a cache-aware order keeps it; in a *roomy* pool (every document fits) the order cannot change what is
cached, and the lookups are pure cost. Per run: hit rate, prompt tokens computed (a preempted request's recompute
included), time to first token (mean and p99, in seconds and in forward tokens run before the request's first
token, which load on the machine cannot move), the most any request was overtaken, and the order of admission.
Greedy decoding: the answers must be identical under every policy and design.

`order_cost` times one `order` call of `lpm` on queues of 2k-token prompts, without the model: what the lookups
cost per admission step, and why SGLang stops sorting a queue longer than 128.
"""
from __future__ import annotations

import argparse
import random
import time
from collections import deque
from collections.abc import Callable
from statistics import mean, median

from benchmarks.runner import p99
from step01_kvcache.request import SamplingParams
from step02_paged import Engine, EngineConfig
from step02_paged.cache_manager import CacheManager
from step02_paged.geometry import PoolGeometry, cdiv
from step04_radix.policy import POLICIES, LongestPrefixMatch, make_policy
from step04_radix.radix_cache import RadixKVCacheManager

WORKLOAD = "multi_doc"  # the workload built for it: `python -m course bench step04 --workload multi_doc`
SEATS = 2  # few seats: the order of admission is what the policy decides
BOUND = 2  # the bounded variant of lpm: at most this many later arrivals admitted before anyone
# (label, policy name, options): every policy as it comes, and lpm with the bound after plain lpm
VARIANTS = [(name, name, {}) for name in POLICIES]
VARIANTS.insert(2, (f"lpm, <={BOUND} overtakes", "lpm", {"max_overtakes": BOUND}))
Design = tuple[Callable[[PoolGeometry], CacheManager], int]  # (manager factory, block size)


def pools(prompts: list[list[int]], new_tokens: int, seats: int = SEATS) -> dict[str, int]:
    """Pool sizes in tokens: `tight` holds the `seats` largest requests and a little more, `roomy` every request."""
    sizes = [len(p) + new_tokens for p in prompts]
    return {"tight": seats * max(sizes) + 32, "roomy": sum(sizes) + 64}


def run_policy(model, prompts: list[list[int]], design: Design, policy, pool_tokens: int, new_tokens: int,
               seats: int = SEATS) -> dict:
    """Every prompt added at once, then the engine stepped to the end; what the policy changed, measured."""
    manager, block_size = design
    engine = Engine(model, EngineConfig(num_blocks=cdiv(pool_tokens, block_size), block_size=block_size,
                                        max_num_seqs=seats, max_num_batched_tokens=256), manager, policy=policy)
    params = SamplingParams(max_new_tokens=new_tokens)
    ids = [engine.add_request(p, params) for p in prompts]
    done, first_at, computed, steps = {}, {}, 0, 0
    t0 = time.perf_counter()
    while engine.has_unfinished():
        outs = engine.step()
        if engine.stats.steps > steps:  # a forward ran
            steps = engine.stats.steps
            computed += sum(n for _, n in engine.last_scheduled)
        for seq in engine.seqs.values():
            if seq.output_ids and seq.seq_id not in first_at:
                first_at[seq.seq_id] = computed
        for out in outs:
            done[out.seq_id] = out
            first_at.setdefault(out.seq_id, computed)
    wall = time.perf_counter() - t0
    engine.check_invariants()
    outs = [done[i] for i in ids]
    ttft, ttft_tokens = [o.ttft_s for o in outs], [first_at[i] for i in ids]
    cached = sum(o.num_cached_tokens for o in outs)
    prompt_tokens = sum(map(len, prompts))
    admitted = [seq_id - ids[0] for seq_id, _, _ in engine.cache_manager.stats.recent]  # first admissions, in order
    return dict(
        hit_rate=round(cached / prompt_tokens, 4), cached_tokens=cached,
        prefill_tokens=computed - sum(len(o.output_ids) - 1 for o in outs),
        ttft_mean_s=round(mean(ttft), 4), ttft_p99_s=round(p99(ttft), 4),
        ttft_tokens_mean=round(mean(ttft_tokens), 1), ttft_tokens_p99=p99(ttft_tokens),
        wall_s=round(wall, 3), steps=steps, preemptions=sum(o.num_preemptions for o in outs),
        most_overtaken=max(sum(later > i for later in admitted[:k]) for k, i in enumerate(admitted)),
        fcfs_fallbacks=getattr(policy, "num_fcfs_fallbacks", 0), admission_order=admitted,
        ttft_s=[round(t, 4) for t in ttft], ttft_tokens=ttft_tokens, outputs=[o.output_ids for o in outs])


def compare_policies(chapter: str, designs: dict[str, Design], args: argparse.Namespace) -> dict:
    """Every design x every policy (dfs-weight where the manager has a tree) in the tight pool, and fcfs against
    lpm in the roomy one: one process, the real model, greedy; `args.repeats` passes, each run's fastest kept (one
    pass takes about a minute on 2 idle cores)."""
    from benchmarks.runner import progress
    from course.workloads import get_workload
    from step01_kvcache.pretrained import load_model, load_tokenizer

    workload = get_workload(args.workload)
    model, tok = load_model(args.model), load_tokenizer(args.model)
    prompts = workload.prompts(tok)
    new_tokens = args.max_new_tokens or 4
    sizes = pools(prompts, new_tokens)
    Engine(model, EngineConfig(num_blocks=512, block_size=16)).generate([prompts[0]], SamplingParams(max_new_tokens=2))
    plan = []
    for design, (manager, block_size) in designs.items():
        plan += [(design, label, name, options, "tight") for label, name, options in VARIANTS
                 if accepts(make_policy(name), manager(PoolGeometry(16, block_size)))]
        plan += [(design, label, name, {}, "roomy") for label, name, _ in VARIANTS[:2]]
    passes = max(1, args.repeats)
    best: dict[int, dict] = {}  # plan index -> its fastest pass (every pass computes the same tokens)
    answers = []
    for _ in range(passes):  # round-robin, so a burst of load on the machine hits every run alike
        for k, (design, label, name, options, pool) in enumerate(progress(plan, f"{chapter} {workload.name}")):
            run = run_policy(model, prompts, designs[design], make_policy(name, **options), sizes[pool], new_tokens)
            answers.append(run.pop("outputs"))
            if k not in best or run["wall_s"] < best[k]["wall_s"]:
                best[k] = dict(design=design, policy=label, pool=pool, **run)
    runs = [best[k] for k in range(len(plan))]
    return dict(chapter=chapter, workload=workload.name, requests=len(prompts), prompt_tokens=sum(map(len, prompts)),
                new_tokens=new_tokens, seats=SEATS, passes=passes, pool_tight_tokens=sizes["tight"],
                pool_roomy_tokens=sizes["roomy"], max_overtakes_bound=BOUND, runs=runs,
                outputs_identical=all(a == answers[0] for a in answers), order_cost=order_cost())


def accepts(policy, cache_manager: CacheManager) -> bool:
    """Whether `policy` can order this manager's queue (dfs-weight needs a tree)."""
    try:
        policy.check(cache_manager)
    except ValueError:
        return False
    return True


def order_cost(queue_lengths: tuple[int, ...] = (16, 128, 1024), prompt_len: int = 2048, repeats: int = 5,
               seed: int = 0) -> dict:
    """Median microseconds of one `lpm` order call on a queue of ~`prompt_len`-token prompts, each a cached prefix
    (one of 8 lengths) and a few new tokens, without the fallback; and with it (SGLang's threshold) at the longest
    queue."""
    rng = random.Random(seed)
    stem = [rng.randrange(49152) for _ in range(prompt_len)]
    longest = max(queue_lengths)
    kv = RadixKVCacheManager(PoolGeometry(prompt_len * 2, 1))
    kv.tree.insert(stem, kv.block_manager.allocate(prompt_len))
    params = SamplingParams(max_new_tokens=1)
    cuts = [rng.randrange(prompt_len // 2, prompt_len) for _ in range(8)]
    queue = [kv.new_sequence(i, stem[: rng.choice(cuts)] + [rng.randrange(49152) for _ in range(8)], params)
             for i in range(longest)]

    def timed(policy, n: int) -> float:
        waiting = deque(queue[:n])
        policy.order(waiting, kv, 8)  # the first call splits the tree where prompts leave the stem
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            policy.order(waiting, kv, 8)
            times.append(time.perf_counter() - t0)
        return round(median(times) * 1e6, 1)

    out = {f"lpm_{n}_us": timed(LongestPrefixMatch(fcfs_above=longest), n) for n in queue_lengths}
    out[f"fallback_{longest}_us"] = timed(LongestPrefixMatch(), longest)
    out["prompt_tokens"] = prompt_len
    return out

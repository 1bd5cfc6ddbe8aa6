"""Chapter 7's block for `python -m course report`: the `short` workload through the server, per cache design, as
the clients and a subscriber to the KV events saw it (results/short.json); then a multi-tenant workload through each
router in front of the same replicas, with small pools and with pools eight times larger (results/routing.json), and
its plot (results/routing.svg)."""
from __future__ import annotations

from benchmarks.reporting import Rendered, fmt, need, provenance, pyplot, register, svg, table

DESIGNS = {"hash": "hash (ch. 3)", "radix": "radix (ch. 4)", "bridge": "bridge (ch. 5)", "none": "none (ch. 2)"}


def headline() -> str:
    f = need("step07", "short")["figures"]
    b = next(r for r in f["designs"] if r["design"] == "bridge")
    return (f"`short` over HTTP: the bridge's KV events ({b['stored_blocks']} blocks stored, {b['removed_blocks']} "
            f"removed, {b['wire_bytes']:,} bytes) rebuild its cache exactly: {fmt(b['rebuilt_equal'])}; hit rate "
            f"{b['hit_rate']:.3f}; same answers from every design: {fmt(f['outputs_identical'])}")


SERVER = ("<!-- server:begin (python -m course report --write) -->", "<!-- server:end -->")


def server_table(rec: dict) -> list[str]:
    """The `short` workload through the server, per cache design: what the clients and a subscriber to the KV events
    saw (unit 1's *Measured here*, and the results page)."""
    f = rec["figures"]
    lines = [f"**The `short` workload through the server**: {f['requests']} requests in rounds of {f['per_round']} "
             f"streamed at once by clients on 127.0.0.1, {f['new_tokens']} new tokens each, greedy, a pool of "
             f"{f['pool_tokens']} tokens; a ZMQ subscriber to the KV events beside them. *TTFT* is the time to the "
             "first streamed event, median over the first round (every prompt new) and over the later ones.", ""]
    rows = [[DESIGNS[r["design"]], r["block_size"], f"{r['hit_rate']:.3f}",
             f"{r['ttft_first_round_median_s']:.3g} / {r['ttft_later_rounds_median_s']:.3g}", r["event_batches"],
             f"{r['stored_events']} / {r['stored_blocks']}", r["removed_blocks"], r["wire_bytes"],
             r["cached_blocks_at_end"], r["rebuilt_equal"]] for r in f["designs"]]
    lines += table(["design", "block size", "hit rate", "TTFT round 1 / later (s)", "event batches",
                    "BlockStored events / blocks", "blocks removed", "bytes on the wire", "blocks cached at the end",
                    "rebuilt = cache"], rows)
    lines += ["", f"Same answers from every design: {fmt(f['outputs_identical'])}. *rebuilt = cache*: the blocks a "
              "subscriber rebuilt from the events alone equal the cache's own, hashes, parents and tokens."]
    return lines


def sections() -> dict[tuple[str, str], str]:
    """Unit 1's *Measured here*: the server's table, with the machine it ran on."""
    rec = need("step07", "short")
    return {SERVER: "\n".join([provenance([rec]), ""] + server_table(rec)) + "\n"}


@register("step07", headline, sections=sections)
def render() -> Rendered:
    rec = need("step07", "short")
    lines = [provenance([rec]), ""] + server_table(rec) + [""]
    routing = need("step07", "routing")
    if routing["machine"] != rec["machine"]:
        lines += [provenance([routing]), ""]
    else:
        lines += [f"The routers were measured by `{routing['command']}` on {routing['date'][:10]}.", ""]
    lines += routing_table(routing["figures"])
    return "\n".join(lines) + "\n", {"routing.svg": svg(lambda: plot_routing(routing["figures"]))}


ROUTERS = {("course", "cache_aware"): "the course's, cache-aware (KV events)",
           ("course", "round_robin"): "the course's, round robin",
           ("smg", "cache_aware"): "smg, cache_aware (its own tree of texts)",
           ("smg", "round_robin"): "smg, round_robin",
           ("vllm-router", "kv_aware"): "vllm-router, kv_aware (KV events)"}


def routing_pools(f: dict) -> dict[str, str]:
    return {"small": f"{f['pools']['small']} blocks", "large": f"{f['pools']['large']} blocks"}


def routing_table(f: dict) -> list[str]:
    """The routers' table: per pool size and router, what the clients saw."""
    sizing = f["sizing"]
    lines = [f"**Replicas behind routers**: {f['replicas']} replicas of the server (one torch thread each, chapter "
             f"3's cache, blocks of {f['block_size']}, up to {f['max_num_seqs']} requests running each), "
             f"{f['tenants']} tenants whose system prompts share {min(sizing['shared_prefix_blocks'])}-"
             f"{max(sizing['shared_prefix_blocks'])} full blocks, {f['users']} users each asking one tenant one "
             f"question ({min(sizing['prompt_tokens'])}-{max(sizing['prompt_tokens'])} prompt tokens), "
             f"{f['concurrency']} streaming clients at once, {f['new_tokens']} new tokens each, greedy; fresh replicas "
             f"for every run. The small pool ({f['pools']['small']} blocks) holds about one replica's share of the "
             f"tenants' prefixes plus its running requests; the large one is {f['large_factor']}x that. *TTFT* is "
             "the time to the first token at the client, through the router.", ""]
    rows = []
    for r in f["runs"]:
        rows.append([f"{r['pool']} ({r['num_blocks']})", ROUTERS.get((r["router"], r["policy"]),
                                                                     f"{r['router']}, {r['policy']}"),
                     f"{r['hit_rate']:.3f}", f"{r['computed_prompt_tokens']:,}", f"{r['ttft_p50_s']:.3g}",
                     f"{r['ttft_p99_s']:.3g}", f"{r['tokens_per_s']:.3g}",
                     " / ".join(str(n) for n in r["served_per_replica"])])
    lines += table(["pool (blocks)", "router, policy", "hit rate", "prompt tokens computed", "TTFT p50 (s)",
                    "TTFT p99 (s)", "tokens/s", "requests per replica"], rows)
    small = {(r["router"], r["policy"]): r for r in f["runs"] if r["pool"] == "small"}
    best = max((r for k, r in small.items() if k[1] != "round_robin"), key=lambda r: r["hit_rate"])
    blind = small[("course", "round_robin")]
    lines += ["", f"Small pools: the best cache-aware router ({ROUTERS[(best['router'], best['policy'])]}) hits "
              f"{best['hit_rate'] / blind['hit_rate']:.2f}x as often as round robin, with a TTFT p50 of "
              f"{best['ttft_p50_s']:.3g} s against {blind['ttft_p50_s']:.3g} s. Same answers from every router and "
              f"pool: {fmt(f['outputs_identical'])}.", "", "![hit rate and TTFT per router](results/routing.svg)"]
    return lines


def plot_routing(f: dict):
    """Hit rate and TTFT p50 (p99 as a tick) per router, small pools beside large ones."""
    plt = pyplot()
    pools = [p for p in ("small", "large") if any(r["pool"] == p for r in f["runs"])]
    keys = list(dict.fromkeys((r["router"], r["policy"]) for r in f["runs"]))
    colors = {"cache_aware": "tab:red", "kv_aware": "tab:orange", "round_robin": "tab:gray"}
    fig, (hit, ttft) = plt.subplots(1, 2, figsize=(9.5, 3.6))
    width = 0.8 / len(keys)
    for j, key in enumerate(keys):
        runs = {r["pool"]: r for r in f["runs"] if (r["router"], r["policy"]) == key}
        xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(pools))]
        style = dict(color=colors.get(key[1], "tab:blue"), hatch="//" if key[0] == "smg" else "", edgecolor="black",
                     lw=0.4, width=width, label=f"{key[0]}, {key[1]}")
        hit.bar(xs, [runs[p]["hit_rate"] for p in pools], **style)
        ttft.bar(xs, [runs[p]["ttft_p50_s"] for p in pools], **style)
        ttft.plot(xs, [runs[p]["ttft_p99_s"] for p in pools], "_", color="black", ms=10)
    pool_names = routing_pools(f)
    for ax, title in ((hit, "prefix-cache hit rate"), (ttft, "TTFT p50 (bar), p99 (tick), s")):
        ax.set_xticks(range(len(pools)), [f"{p} pools\n({pool_names[p]})" for p in pools])
        ax.set_title(title, fontsize=10)
    hit.set_ylim(0, 1)
    hit.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{f['tenants']} tenants, {f['users']} users, {f['replicas']} replicas", fontsize=10)
    fig.tight_layout()
    return fig

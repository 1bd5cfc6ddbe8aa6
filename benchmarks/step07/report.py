"""Chapter 7's block for `python -m course report`: the `short` workload through the server, per cache design, as
the clients and a subscriber to the KV events saw it, drawn from results/short.json."""
from __future__ import annotations

from benchmarks.reporting import Rendered, fmt, need, provenance, register, table

DESIGNS = {"hash": "hash (ch. 3)", "radix": "radix (ch. 4)", "bridge": "bridge (ch. 5)", "none": "none (ch. 2)"}


def headline() -> str:
    f = need("step07", "short")["figures"]
    b = next(r for r in f["designs"] if r["design"] == "bridge")
    return (f"`short` over HTTP: the bridge's KV events ({b['stored_blocks']} blocks stored, {b['removed_blocks']} "
            f"removed, {b['wire_bytes']:,} bytes) rebuild its cache exactly: {fmt(b['rebuilt_equal'])}; hit rate "
            f"{b['hit_rate']:.3f}; same answers from every design: {fmt(f['outputs_identical'])}")


@register("step07", headline)
def render() -> Rendered:
    rec = need("step07", "short")
    f = rec["figures"]
    lines = [provenance([rec]), "",
             f"**The `short` workload through the server**: {f['requests']} requests in rounds of {f['per_round']} "
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
    return "\n".join(lines) + "\n", {}

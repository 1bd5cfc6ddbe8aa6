"""Speculative decoding against plain decoding, from results/speculative.json (`python -m course bench step05
--workload speculative`): the unit's plot and table (04_speculative.md), and the cost of a verify step, the control
and the targets (the chapter's README)."""
from __future__ import annotations

from benchmarks.reporting import COLORS, met, need, provenance, pyplot, svg, table

UNIT = ("<!-- speculative:begin (python -m course report --write) -->", "<!-- speculative:end -->")
COST = ("<!-- speculative-cost:begin (python -m course report --write) -->", "<!-- speculative-cost:end -->")

SPEC_TARGET = 1.8  # decode tokens/s with drafts over without, batch 1, on the workload that copies from its prompt
SPEC_OVERHEAD = 0.05  # at most this much slower where nothing is proposed


def spec_row(f: dict, workload: str, batch: int) -> dict:
    return next(r for r in f["rows"] if r["workload"] == workload and r["batch"] == batch)


def plot_speculative(rec: dict):
    """Decode tokens/s with drafts over without, per workload and batch size; and what a verify step of
    1 + k tokens costs against a plain decode step, on the same machine."""
    plt = pyplot()
    f = rec["figures"]
    workloads = list(dict.fromkeys(r["workload"] for r in f["rows"]))
    batches = sorted({r["batch"] for r in f["rows"]})
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.6))
    width = 0.8 / len(batches)
    for i, batch in enumerate(batches):
        xs = [j + (i - (len(batches) - 1) / 2) * width for j in range(len(workloads))]
        ax.bar(xs, [spec_row(f, w, batch)["speedup"] for w in workloads], width, label=f"batch {batch}",
               color=COLORS["on"] if i == 0 else COLORS["step03"])
    ax.axhline(1, color="0.3", lw=1)
    ax.axhline(SPEC_TARGET, color="0.4", ls="--", lw=1, label=f"target: {SPEC_TARGET}x (batch 1, `edit`)")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set(ylabel="decode tokens/s, drafts / none", title=f"prompt lookup, up to {f['num_speculative_tokens']} drafts")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    cost = f["verify_cost"]
    for i, (batch, row) in enumerate(cost["batches"].items()):
        ks = sorted(row["ratio"], key=int)
        bx.plot([int(k) for k in ks], [row["ratio"][k] for k in ks], "o-", label=f"batch {batch}",
                color=COLORS["on"] if i == 0 else COLORS["step03"])
    bx.axhline(1, color="0.3", lw=1)
    bx.set(xlabel="drafts k", ylabel="verify step / decode step", ylim=(0, None),
           title=f"cost of verifying k drafts ({cost['context']}-token context)")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def spec_block(rec: dict) -> list[str]:
    """Speculative decoding against plain decoding: how it was measured, the plot and the table."""
    f = rec["figures"]
    lo, hi = f["prompt_lookup"]
    lines = [f"**Speculative decoding**: prompt lookup (n-grams of {lo} to {hi} tokens) drafts up to "
             f"{f['num_speculative_tokens']} tokens per step; the same requests are decoded with and without drafts, "
             "at batch 1 (one request at a time) and batch 8, up to "
             f"{f['max_new_tokens']} new tokens each, greedy, stopping at end of turn. Only decode steps are clocked "
             "(a prompt is prefilled the same way either way); plain and speculative runs alternate, best of "
             f"{f['repeats']} rounds. *drafts / step* and *tokens / step* are per sequence and decode step; *accepted* "
             "is the share of verified drafts the model kept. " + provenance([rec]), "",
             "![speculative decoding: speed-up per workload and the cost of a verify step](results/speculative.svg)",
             ""]
    lines += table(["workload", "batch", "plain tok/s", "speculative tok/s", "speed-up", "drafts / step", "accepted",
                    "tokens / step", "same tokens"],
                   [[f"`{r['workload']}`", r["batch"], r["plain_tokens_per_s"], r["spec_tokens_per_s"],
                     f"{r['speedup']}x", r["drafts_per_step"], f"{r['acceptance_rate']:.0%}", r["tokens_per_step"],
                     r["outputs_identical"]] for r in f["rows"]])
    return lines


def cost_block(rec: dict) -> list[str]:
    """The rest of the measurement: nothing proposed, the targets, and the cost of a verify step."""
    f = rec["figures"]
    lines = []
    copy = spec_row(f, "edit", 1)
    idle = f["nothing_proposed"]
    control = [r for r in f["rows"] if "nothing_proposed_speedup" in r]
    lines += ["Every workload gets drafts (chat answers repeat their own phrases), so *nothing proposed* is "
              f"measured on `{idle['workload']}` with a third engine: speculation on, its proposer keeping its n-gram "
              "index but never drafting (`NoDrafts`), against the plain engine: "
              + ", ".join(f"batch {r['batch']}: {r['nothing_proposed_tokens_per_s']} tokens/s, "
                          f"{r['nothing_proposed_speedup']}x" for r in control) + "."]
    if any(r["nothing_proposed_speedup"] > 1 for r in control):
        lines[-1] += (" Above 1x is not a gain: both engines run the same forwards, so the gap is how much the "
                      "machine's speed varied between runs (best of the rounds), the margin to read every ratio here "
                      "with.")
    lines += [""] + table(["target", "measured", ""], [
        [f">= {SPEC_TARGET}x decode tokens/s at batch 1 on `edit`", f"{copy['speedup']}x",
         met(copy["speedup"] >= SPEC_TARGET)],
        [f"no more than {SPEC_OVERHEAD:.0%} slower where nothing is proposed (the slowest batch size)",
         f"{idle['speedup']}x", met(idle["speedup"] >= 1 - SPEC_OVERHEAD)]])
    cost = f["verify_cost"]
    lines += ["", f"**What a verify step costs** (`verify_step_cost`, {cost['context']} tokens of context per "
              f"sequence, median of {cost['repeats']} forwards, on {cost['device']}): one forward of 1 + k tokens per "
              "sequence, as a multiple of a plain decode step."]
    ks = sorted(next(iter(cost["batches"].values()))["ratio"], key=int)
    lines += [""] + table(["batch", "decode step (ms)"] + [f"k = {k}" for k in ks],
                          [[batch, row["decode_ms"]] + [f"{row['ratio'][k]}x" for k in ks]
                           for batch, row in cost["batches"].items()])
    return lines


def sections() -> dict[tuple[str, str], str]:
    """The unit's block and the README's."""
    rec = need("step05", "speculative")
    return {UNIT: "\n".join(spec_block(rec)) + "\n", COST: "\n".join(cost_block(rec)) + "\n"}


def plots() -> dict:
    rec = need("step05", "speculative")
    return {"speculative.svg": svg(lambda: plot_speculative(rec))}


def headline() -> str:
    copy = spec_row(need("step05", "speculative")["figures"], "edit", 1)
    return f"speculative decoding (prompt lookup) {copy['speedup']}x decode tokens/s at batch 1 on `edit`"

"""Chapter 2's measured results, for `python -m course report`: continuous batching against Hugging Face and
chapter 1, and the KV memory each holds step by step, drawn from results/batch.json; the engine's host work per
step (results/host.json). The whole block goes to the chapter's results page (RESULTS.md); each unit's *Measured
here* gets one of its tables between its own markers (`sections`): the KV memory (paging), the throughput
(continuous batching) and the host bench (the host's work per step)."""
from __future__ import annotations

from benchmarks.reporting import COLORS, Rendered, fmt, met, need, provenance, pyplot, register, svg, table
from course import results

HOST_TARGET_US = 300  # the host bench's target: µs per decode step at most, every manager and context
HOST_FLAT = 1.3  # and flat: the longest context's step at most this many times the shortest's
MEMORY = "<!-- memory:begin (python -m course report --write) -->", "<!-- memory:end -->"  # the paging unit's
THROUGHPUT = "<!-- throughput:begin (python -m course report --write) -->", "<!-- throughput:end -->"  # batching's
HOST = "<!-- host:begin (python -m course report --write) -->", "<!-- host:end -->"  # the host-work unit's


def plot_throughput_and_memory(rec: dict):
    """Chapter 2: tokens/s of the contenders, and the KV memory held at every engine step."""
    plt = pyplot()
    f = rec["figures"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
    names = ["paged engine\n(all at once)", "HF generate\nbatched, padded", "HF generate\none by one",
             "chapter 1\none by one"]
    vals = [f["tokens_per_s"], f["hf_batched_tokens_per_s"], f["hf_tokens_per_s"], f["step01_tokens_per_s"]]
    ax.bar(names, vals, color=[COLORS["on"], COLORS["hf"], COLORS["recipe"], COLORS["off"]])
    ax.set(ylabel="generated tokens / s", title=f"{f['requests']} ragged requests ({f['workload']})")
    ax.tick_params(axis="x", labelsize=8)
    mem = f["kv_mib_per_step"]
    for key, label, color in (("paged", "paged pool: blocks held", COLORS["on"]),
                              ("contiguous", "contiguous: prompt + max_new per request", COLORS["contiguous"]),
                              ("hf_batched", "HF padded batch: every row as long as the longest", COLORS["hf"])):
        bx.plot(range(1, len(mem[key]) + 1), mem[key], label=label, color=color)
    bx.set(xlabel="step", ylabel="KV cache held (MiB)", title="KV memory per step, same requests")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_host(rec: dict):
    """Chapter 2: the engine's host microseconds per decode step against the context, one line per cache manager."""
    plt = pyplot()
    f = rec["figures"]
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    colors = {"none": COLORS["off"], "hash": COLORS["step03"], "radix": COLORS["step04"], "bridge": COLORS["step05"]}
    for name, row in f["host_us_per_step"].items():
        contexts = sorted(row, key=int)
        ax.plot([int(c) for c in contexts], [row[c] for c in contexts], "o-", label=name, color=colors.get(name))
    ax.axhline(HOST_TARGET_US, color="0.4", ls="--", lw=1, label=f"target: {HOST_TARGET_US} µs")
    ax.set(xscale="log", xlabel="context per sequence (tokens)", ylabel="host µs per decode step", ylim=(0, None),
           title=f"{f['requests']} sequences decoding, no model: the engine's own work")
    ax.set_xticks(f["contexts"], [str(c) for c in f["contexts"]])
    ax.legend(title="cache manager", fontsize=7, title_fontsize=7, loc="lower center", ncol=5)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def host_table(f: dict, per_round: bool = False) -> list[str]:
    """µs per step, each manager, each context, and the longest context over the shortest (and per round)."""
    contexts = [str(c) for c in f["contexts"]]
    extra = ["per round"] if per_round else []
    return table(["manager"] + [f"{c} tok" for c in contexts] + ["longest / shortest"] + extra,
                 [[name] + [row[c] for c in contexts] + [f"{f['growth_longest_over_shortest'][name]}x"]
                  + ([", ".join(map(str, f["growth_per_round"][name]))] if per_round else [])
                  for name, row in f["host_us_per_step"].items()])


def host_block(rec: dict) -> list[str]:
    """The host bench's table: µs per step, each manager, each context; flat is what the engine's rules buy."""
    f = rec["figures"]
    lines = ["", f"**Host work per decode step**: {f['requests']} sequences decoding at once, a "
             "stand-in runner that returns zero logits at once (`NullRunner`), so that no model and no attention "
             "run and what is timed is the engine itself (scheduler, cache manager, block-table rows, the step's "
             f"batch, sampling, bookkeeping): µs per step, the median of {f['steps_timed']} steps, the median of "
             f"{f.get('rounds', 1)} rounds. The contexts of one manager are timed in turns of a few steps (a machine "
             "whose speed drifts slows them alike); *longest / shortest* is the row's last cell over its first, and "
             "*per round* the same ratio within each round. "
             + provenance([rec], "no model"), "",
             "![host µs per decode step against the context](results/host.svg)", ""]
    lines += host_table(f, per_round=True)
    growth, worst = max(f["growth_longest_over_shortest"].values()), f["max_host_us_per_step"]
    lines += [""] + table(["target", "measured", ""],
                          [[f"flat: longest context / shortest <= {HOST_FLAT}x, every manager", f"{growth}x",
                            met(growth <= HOST_FLAT)],
                           [f"<= {HOST_TARGET_US} µs per step at {f['requests']} sequences, every manager and context",
                            f"{worst} µs", met(worst <= HOST_TARGET_US)]])
    if "profile" in f:
        profiles = f["profile"]
        phases = list(profiles[0]["share"])
        per_seq = ", ".join(f"{n} {us} µs" for n, us in f["us_per_sequence_per_step"].items())
        lines += ["", f"**Where a step's host time goes** at {profiles[0]['context']} tokens: each part of "
                  "`Engine.step` timed by the clock around the method that does it, the median step; an engine "
                  "without the clocks steps in turn with it, so the two µs rows are the same minutes of the machine "
                  "(and need not match the table above, timed at other minutes). Per sequence and step, the fastest "
                  f"cell above is {per_seq}.", ""]
        lines += table(["part of the step"] + [p["manager"] for p in profiles],
                       [[phase] + [f"{p['share'][phase]:.0%}" for p in profiles] for phase in phases]
                       + [["µs per step, with the clocks"] + [p["us_per_step"] for p in profiles]]
                       + [["µs per step, without"] + [p.get("plain_us_per_step", "—") for p in profiles]])
        lines += ["", "Hottest functions by their own time under cProfile (which slows small calls most: where to "
                  "look, not shares): " + "; ".join(f"{p['manager']}: " + ", ".join(f"`{name}` {share:.0%}"
                  for name, share in p["top_functions"][:3]) for p in profiles) + "."]
    return lines


def throughput_table(f: dict) -> list[str]:
    return table(["contender", "tokens/s", "engine's speed-up over it"],
                 [["paged engine, continuous batching", f["tokens_per_s"], "-"],
                  ["HF `generate`, all requests in one left-padded batch", f["hf_batched_tokens_per_s"],
                   f"{f['speedup_vs_hf_batched']}x"],
                  ["HF `generate`, one request at a time", f["hf_tokens_per_s"], f"{f['speedup_vs_hf']}x"],
                  ["chapter 1's `generate`, one at a time", f["step01_tokens_per_s"], f"{f['speedup_vs_step01']}x"]])


def same_tokens(f: dict) -> str:
    return (f"Same tokens as HF one by one and chapter 1: {fmt(f['outputs_identical'])}; as HF's padded batch: "
            f"{fmt(f['hf_batched_outputs_identical'])} (padding changes fp32 sums slightly, so a near-tie may flip).")


def memory_table(f: dict) -> list[str]:
    """Peak KV memory and the allocated-but-unfilled fraction: the paged pool, contiguous buffers, HF's batch."""
    mem = f["kv_mib_per_step"]
    return table(["", "peak (MiB)", "allocated but unfilled"],
                 [["paged pool (blocks of 16)", max(mem["paged"]),
                   f"{f['kv_waste_fraction']:.1%}"],
                  ["contiguous buffers, prompt + max_new_tokens each", max(mem["contiguous"]),
                   f"{f['contiguous_waste_fraction']:.1%}"],
                  ["HF's padded batch", max(mem["hf_batched"]), "-"]])


def _machine(rec: dict) -> str:
    """A unit's one line on where its table was measured; the results page has the whole provenance."""
    m = rec["machine"]
    return f"measured on {m['cpu']} with {m['cores']} cores, torch {m['torch']}, fp32, on {rec['date'][:10]}"


def sections() -> dict[tuple[str, str], str]:
    """Each unit's *Measured here*: one table, with the machine it ran on."""
    rec = need("step02", "batch")
    f = rec["figures"]
    out = {
        MEMORY: "\n".join([f"KV memory held by the {f['requests']} requests of the `{f['workload']}` workload over "
                           f"the engine's {f['steps']} steps, SmolLM2-135M-Instruct, {_machine(rec)}:", ""]
                          + memory_table(f)) + "\n",
        THROUGHPUT: "\n".join([f"The `{f['workload']}` workload, {f['requests']} ragged requests ({f['prompt_tokens']} "
                               f"prompt tokens, {f['new_tokens']} generated, greedy), SmolLM2-135M-Instruct, best "
                               f"of 3 interleaved rounds, {_machine(rec)}:", ""]
                              + throughput_table(f) + ["", same_tokens(f)]) + "\n",
    }
    host = results.load("step02", "host")
    if host is not None:
        h = host["figures"]
        out[HOST] = "\n".join([f"Host µs per decode step, {h['requests']} sequences decoding at once, no model, the "
                               f"median of {h['steps_timed']} steps and of {h.get('rounds', 1)} rounds, "
                               f"{_machine(host)}:", ""] + host_table(h)) + "\n"
    else:
        out[HOST] = "No measurement committed yet: `python -m course bench step02 --workload host --save` writes it.\n"
    return out


def headline() -> str:
    two = need("step02", "batch")["figures"]
    line = (f"{two['requests']} ragged requests: continuous batching {two['speedup_vs_hf_batched']}x HF `generate` "
            f"batched (SDPA), {two['speedup_vs_hf']}x HF one by one; unfilled KV {two['kv_waste_fraction']:.1%} paged "
            f"vs {two['contiguous_waste_fraction']:.1%} contiguous")
    return line


@register("step02", headline, sections=sections)
def render() -> Rendered:
    rec = need("step02", "batch")
    f = rec["figures"]
    lines = [provenance([rec]), "",
             f"**Throughput**: the `{f['workload']}` workload, {f['requests']} ragged requests "
             f"({f['prompt_tokens']} prompt tokens, {f['new_tokens']} generated, greedy, stopping at end of turn), "
             "best of 3 interleaved rounds. Every contender is credited with each request's own tokens only. "
             "Hugging Face uses SDPA; its fair baseline is the batched call.", "",
             "![throughput and KV memory per step](results/throughput_memory.svg)", ""]
    lines += throughput_table(f)
    lines += ["", same_tokens(f), "", "**KV memory** over the engine's {} steps:".format(f["steps"]), ""]
    lines += memory_table(f)
    plots = {"throughput_memory.svg": svg(lambda: plot_throughput_and_memory(rec))}
    host = results.load("step02", "host")
    if host is not None:
        lines += host_block(host)
        plots["host.svg"] = svg(lambda: plot_host(host))
    return "\n".join(lines) + "\n", plots

"""What every chapter's report shares: how measured results become a lesson's tables, plots and headline.

`make bench` leaves one JSON per run in each chapter's `results/` folder (course/results.py). Each chapter's
`benchmarks/stepNN/report.py` registers here (`register`) how it turns those files into the markdown its pages show
between their markers (its README, its units, or its results page `RESULTS.md`: whichever holds the marker), the
plots beside them (`results/*.svg`) and one headline for the root README's table;
`python -m course report` (course/report.py) runs them. Nothing here measures: rerun `make bench` for new numbers.

Which baseline each ratio uses is said next to it: Hugging Face always runs with its default attention
(SDPA); for throughput it is `generate` with all requests in one left-padded batch.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from course import results
from course.paths import REPO_ROOT

BEGIN = "<!-- results:begin (python -m course report --write) -->"
END = "<!-- results:end -->"
WORKLOADS = ("short", "long", "shared_prefix", "diverge")
DESIGNS = {"step03": "hash (ch. 3, 16-token blocks)", "step04": "radix (ch. 4, 1-token slots)",
           "step05": "bridge (ch. 5, 16-token blocks)"}
COLORS = {"off": "tab:gray", "on": "tab:red", "hf": "tab:blue", "recipe": "tab:cyan", "step03": "tab:orange",
          "step04": "tab:green", "step05": "tab:red", "contiguous": "tab:gray"}


Draw = Callable[[Path], None]  # draws one plot into the file it is given
Rendered = tuple[str, dict[str, Draw]]  # a README block's markdown, {its plots' file names in results/: Draw}


@dataclass(frozen=True)
class ChapterReport:
    """What a chapter registers: its README block, its row of the root README's table, its block's marker, and the
    other marked blocks of its README that the data writes (`sections`: {(begin, end) marker: text}, e.g. measured
    numbers inside the lesson's Theory)."""

    render: Callable[[], Rendered]
    headline: Callable[[], str]
    begin: str = BEGIN
    sections: Callable[[], dict[tuple[str, str], str]] | None = None


REPORTS: dict[str, ChapterReport] = {}


def register(chapter: str, headline: Callable[[], str], begin: str = BEGIN,
             sections: Callable[[], dict[tuple[str, str], str]] | None = None):
    """Decorates a chapter's `render()`; `headline()` is the chapter's one line in the root README; `sections()`, its
    README's other marked blocks."""
    def wrap(render: Callable[[], Rendered]) -> Callable[[], Rendered]:
        REPORTS[chapter] = ChapterReport(render, headline, begin, sections)
        return render
    return wrap


class MissingResults(Exception):
    """A chapter's results/*.json are not there yet: run `make bench` (or the command named)."""


def need(chapter: str, name: str) -> dict:
    record = results.load(chapter, name)
    if record is None:
        raise MissingResults(f"{results.results_path(chapter, name).relative_to(REPO_ROOT)} is missing: run "
                             f"`make bench` (or its line for {chapter})")
    return record


def provenance(records: list[dict], model: str = "SmolLM2-135M-Instruct") -> str:
    """One line per distinct machine: what, when, how loaded, and the commands that wrote the files."""
    m = records[0]["machine"]
    dates = sorted({r["date"][:10] for r in records})
    loads = [r["machine"]["load_avg_1m_at_start"] for r in records] + \
        [r["machine"].get("load_avg_1m_at_end", 0) for r in records]
    many = len(records) > 1
    forms = dict.fromkeys(r["command"].replace(f"--workload {r['workload']}", "--workload W" if many else
                                               f"--workload {r['workload']}") for r in records)
    commands = ", ".join(f"`{c}`" for c in forms)
    if many and any("--workload W" in c for c in forms):
        commands += " for W in " + ", ".join(f"`{r['workload']}`" for r in records if "--workload" in r["command"])
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    spread = f"{min(loads)}" if min(loads) == max(loads) else f"{min(loads)}-{max(loads)}"
    return (f"Measured on {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch threads), torch {m['torch']}, "
            f"transformers {m['transformers']}, fp32, {model}, greedy, on {when}; 1-minute load "
            f"average {spread} at the start and end of the runs (a bench's own {m['torch_threads']} "
            "threads count; more means another job shared the cores). "
            f"Written by {commands}; `python -m course report --write` drew this block.")


def met(ok: bool) -> str:
    """A target's verdict: met, or **missed** (bold, so that it stands out in a table)."""
    return "met" if ok else "**missed**"


def fmt(x, digits: int = 4) -> str:
    """A table cell: booleans as yes / **no** (a failed check stands out), floats to `digits` digits."""
    if isinstance(x, bool):
        return "yes" if x else "**no**"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"  # significant digits, or whole thousands
    return f"{x:,}" if isinstance(x, int) else str(x)


def table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]


# ---- plots ---------------------------------------------------------------------------------------------------

def pyplot():
    """pyplot, without choosing a backend: a script gets a headless one, a notebook keeps its inline one."""
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "kvcourse"  # deterministic ids, so a redraw of the same data diffs clean
    return plt


def save_svg(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None})
    pyplot().close(fig)


def svg(figure: Callable[[], object]) -> Draw:
    """A plot that returns its matplotlib figure, as a Draw: saved as an SVG without a date, so it diffs clean."""
    return lambda path: save_svg(figure(), path)


def plot_ttft(chapter: str, recs: dict[str, dict]):
    """Chapters 3-5: time to first token, cold and warm, our cache off and on, next to Hugging Face's two."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(recs), figsize=(3.1 * len(recs), 3.8), squeeze=False)
    bars = (("ttft_cold_off_s", "cold, cache off", COLORS["off"], ""),
            ("ttft_cold_on_s", "cold, cache on", COLORS["on"], ""),
            ("hf_ttft_cold_s", "cold, HF", COLORS["hf"], ""),
            ("ttft_off_warm_median_s", "warm, cache off", COLORS["off"], "//"),
            ("ttft_on_warm_median_s", "warm, cache on", COLORS["on"], "//"),
            ("hf_nocache_ttft_warm_median_s", "warm, HF no cache", COLORS["hf"], "//"),
            ("hf_recipe_ttft_warm_median_s", "warm, HF prompt-cache recipe", COLORS["recipe"], "//"))
    from matplotlib.ticker import FormatStrFormatter

    for ax, (name, rec) in zip(axes[0], recs.items()):
        f = rec["figures"]
        values = [f[key] * 1e3 for key, *_ in bars]
        for i, (value, (_, label, color, hatch)) in enumerate(zip(values, bars)):
            ax.bar(i, value, color=color, hatch=hatch, edgecolor="black", lw=0.4, label=label)
        # log scale, with room below the smallest bar so that every bar shows its height
        ax.set(yscale="log", title=name, xticks=[], ylim=(min(values) / 2, max(values) * 1.5))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter(""))
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("time to first token (ms, log)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(f"{chapter}: TTFT per workload (warm = median over the requests after the first)", fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def plot_hit_rates(by_chapter: dict[str, dict[str, dict]]):
    """Hit rate of each design on each workload (cached prompt tokens / prompt tokens, over every round)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.6, 3.9))
    width = 0.8 / len(by_chapter)
    for i, (chapter, recs) in enumerate(by_chapter.items()):
        xs = [j + (i - (len(by_chapter) - 1) / 2) * width for j in range(len(WORKLOADS))]
        ax.bar(xs, [recs[w]["figures"]["hit_rate"] for w in WORKLOADS], width, label=DESIGNS[chapter],
               color=COLORS[chapter])
    ax.set_xticks(range(len(WORKLOADS)), WORKLOADS)
    ax.set(ylabel="hit rate (cached / prompt tokens)", ylim=(0, 1), title="Prompt tokens reused, per design")
    ax.legend(fontsize=8, ncol=len(by_chapter), loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


# ---- the prefix-caching chapters' shared block ----------------------------------------------------------------
def prefix_records(chapter: str) -> dict[str, dict]:
    return {w: need(chapter, w) for w in WORKLOADS}


def prefix_cache_block(chapter: str) -> Rendered:
    """Chapters 3, 4 and 5 share one table: the same bench, the same workloads, the same baselines."""
    recs = prefix_records(chapter)
    lines = [provenance(list(recs.values())), "",
             "Every workload runs sequentially through the engine with the cache off and on, then through Hugging "
             "Face `generate` (SDPA) without a cache and with its prompt-cache recipe (the prefix all requests "
             "share, prefilled once and deep-copied per request), all in one process. *Cold* is the first "
             "request, one sample, so it moves from run to run more than *warm*, the median of the rest.", "",
             "![time to first token per workload](results/ttft.svg)", ""]
    rows = []
    for w, rec in recs.items():
        f = rec["figures"]
        pair = lambda a, b, f=f: f"{f[a]:.3g} / {f[b]:.3g}"  # noqa: E731
        rows.append([f"`{w}`", f"{f['hit_rate']:.3f}", pair("ttft_cold_off_s", "ttft_cold_on_s"),
                     f"{f['hf_ttft_cold_s']:.3g}", pair("ttft_off_warm_median_s", "ttft_on_warm_median_s"),
                     pair("hf_nocache_ttft_warm_median_s", "hf_recipe_ttft_warm_median_s"),
                     f"{f['speedup_warm']}x (bound {f['speedup_bound']}x)", f"{f['warm_ttft_vs_hf_recipe']}x",
                     f"{f['kv_peak_bytes_off'] / 2**20:.0f} / {f['kv_peak_bytes_on'] / 2**20:.0f}",
                     f["outputs_identical"] and f["hf_first_tokens_match"]])
    lines += table(["workload", "hit rate", "cold TTFT off / on (s)", "cold, HF (s)", "warm TTFT off / on (s)",
                    "warm, HF no cache / recipe (s)", "warm on vs off", "warm vs HF recipe", "KV peak off / on (MiB)",
                    "same tokens"], rows)
    lines += ["", "*warm on vs off* is our engine against itself; *warm vs HF recipe* is the recipe's warm TTFT "
              "over ours (above 1: ours is faster). *same tokens*: cache on = cache off, and HF's first tokens = ours."]
    plots = {"ttft.svg": svg(lambda: plot_ttft(chapter, recs))}
    return "\n".join(lines) + "\n", plots


# ---- the READMEs' generated blocks ------------------------------------------------------------------------
def _block(begin: str, end: str) -> re.Pattern:
    return re.compile(re.escape(begin) + r"\n(.*?)" + re.escape(end), re.S)


def readme_block(readme: str, begin: str = BEGIN, end: str = END) -> str:
    """The text between a README's results markers (a ValueError names the markers if they are gone)."""
    match = _block(begin, end).search(readme)
    if not match:
        raise ValueError(f"no {begin} ... {end} block")
    return match.group(1)


RESULTS_PAGE = "RESULTS.md"  # a chapter's generated results page, beside its README and units


def results_page(folder: Path) -> str:
    """Where the root README's overview sends a reader for a chapter's results: its results page, or, for a chapter
    without one, its README's *Measured here*."""
    return RESULTS_PAGE if (folder / RESULTS_PAGE).is_file() else "README.md#measured-here"


def page_with(folder: Path, begin: str) -> Path:
    """The Markdown page of a chapter's folder that holds the block `begin` opens: its README, a unit or its results
    page (a ValueError names the marker if none does)."""
    for page in sorted(folder.glob("*.md")):
        if begin in page.read_text():
            return page
    raise ValueError(f"no page of {folder.name} holds a {begin} block")


def write_block(path: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    readme = path.read_text()
    readme_block(readme, begin, end)  # fails loudly if the markers are gone
    path.write_text(_block(begin, end).sub(lambda _: f"{begin}\n{text}{end}", readme))

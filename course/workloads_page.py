"""`python -m course workloads [NAME ...] [--json] [--markdown [--write]]`: the shared workloads and their token counts.

Without flags it prints a table to read in a terminal. `--markdown` prints the tables of WORKLOADS.md (the course's
page of workloads), every number measured here: the text workloads through the real tokenizer's chat template
(course/workloads.py), the benches' own inputs (random token ids, or no model at all) from the benches' code.
`--write` puts them into WORKLOADS.md between its markers; a test checks that the committed page is what this prints.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from course.chapters import chapters
from course.paths import REPO_ROOT
from course.workloads import WORKLOADS, get_workload, measure, shared_prefix_len

PAGE = "WORKLOADS.md"
BEGIN = "<!-- workloads:begin (python -m course workloads --markdown --write) -->"
END = "<!-- workloads:end -->"

# The chapters whose benches, demos or lessons run each text workload (tests/course/test_workloads_page.py checks
# that each listed chapter names it, and that a chapter naming it in both its README and its benches is listed).
USES: dict[str, tuple[int, ...]] = {
    "short": (3, 4, 5, 6, 7),
    "long": (3, 4, 5, 6),
    "shared_prefix": (3, 4, 5, 6),
    "batch": (2, 5, 6),
    "diverge": (3, 4, 5, 6),
    "multi_turn": (5, 6),
    "multi_doc": (4, 5, 6),
    "edit": (5,),
}


def chapter_link(number: int) -> str:
    """A link from the root of the repository to chapter `number`'s README."""
    folder = next(c for c in chapters() if c.startswith(f"step{number:02d}_"))
    return f"[{number}]({folder}/README.md)"


def anchor(name: str) -> str:
    """The workload's name as the table's first cell, with the anchor that lessons link to (WORKLOADS.md#NAME)."""
    return f'<a id="{name}"></a>`{name}`'


def spread(low: int, high: int) -> str:
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def text_rows(names: list[str], tokenizer) -> tuple[list[str], list[list[str]]]:
    """The text workloads: what each is, who runs it, and its token counts."""
    header = ["workload", "what it is", "chapters", "requests", "prompt tokens (min / mean / max)",
              "shared prefix", "own tokens (min-max)", "ideal hit rate"]
    rows = []
    for name in names:
        w = get_workload(name)
        s = measure(w, tokenizer)
        requests = f"{s['requests']}" + (f" x {s['rounds']} rounds" if s["rounds"] > 1 else "")
        rows.append([anchor(name), w.description, ", ".join(chapter_link(c) for c in USES[name]), requests,
                     f"{s['tokens_min']:,} / {s['tokens_mean']:,} / {s['tokens_max']:,}", f"{s['shared_prefix']:,}",
                     spread(s["new_min"], s["new_max"]), f"{s['ideal_hit_rate']:.1%}"])
    return header, rows


def bench_rows() -> tuple[list[str], list[list[str]]]:
    """The benches' own inputs, from their code: chapter 2's model-free host bench and chapter 6's GPU workloads."""
    from benchmarks.step02 import host
    from benchmarks.step06 import engine
    from step01_kvcache.tiny import SMOLLM2_135M

    header = ["workload", "what it is", "chapter", "requests", "prompt tokens (min / mean / max)", "shared prefix",
              "own tokens (min-max)", "new tokens"]
    rows = [[anchor("host"), f"sequences in decode at one context length, without a model (contexts "
             f"{', '.join(f'{c:,}' for c in host.CONTEXTS)}): the engine's host work per step", chapter_link(2),
             f"{host.SEQS}", "the context", "-", "-", f"{host.STEPS} timed steps"]]
    what = {"random": "unrelated prompts of random token ids, all at once: the engine against Hugging Face "
                      "`generate`",
            "shared_system": "random token ids behind one shared system prompt, all at once: prefix caching and "
                             "cascade attention on a GPU",
            "long": "the Pico-vLLM write-up's benchmark in random token ids: one request at a time, the first "
                    "cold, the others finding the prefix cached (time to first token)"}
    for name in what:
        prompts, new = engine.workload(name, SMOLLM2_135M["vocab_size"])
        lengths = [len(p) for p in prompts]
        shared = shared_prefix_len(prompts)
        own = [n - shared for n in lengths]
        label = anchor(name) if name != "long" else '<a id="long-gpu"></a>`long` (GPU)'
        rows.append([label, what[name], chapter_link(6), f"{len(prompts)}",
                     f"{min(lengths):,} / {sum(lengths) / len(lengths):,.1f} / {max(lengths):,}", f"{shared:,}",
                     spread(min(own), max(own)), f"{new:,}"])
    return header, rows


def markdown(tokenizer, names: list[str] | None = None) -> str:
    """The tables of WORKLOADS.md, as `--markdown` prints them and the page holds them."""
    from benchmarks.reporting import table

    text = table(*text_rows(names or list(WORKLOADS), tokenizer))
    bench = table(*bench_rows())
    return "\n".join(["**Text workloads** (course/workloads.py), through SmolLM2's tokenizer and chat template:", "",
                      *text, "", "**The benches' own inputs** (random token ids in SmolLM2's vocabulary, or no "
                      "model):", "", *bench]) + "\n"


def write(text: str, page: Path = REPO_ROOT / PAGE) -> None:
    """Put `text` between the page's markers."""
    from benchmarks.reporting import write_block

    write_block(page, text, BEGIN, END)


def main(argv: list[str]) -> int:
    """`python -m course workloads [NAME ...] [--json] [--markdown [--write]]`: measured token counts per workload."""
    parser = argparse.ArgumentParser(prog="python -m course workloads", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"workloads to measure (default: all of "
                        f"{', '.join(WORKLOADS)})")
    parser.add_argument("--json", action="store_true", help="also print one JSON object on the last line")
    parser.add_argument("--markdown", action="store_true", help=f"print the tables of {PAGE} instead")
    parser.add_argument("--write", action="store_true", help=f"with --markdown: write them into {PAGE}")
    args = parser.parse_args(argv)
    if args.write and not args.markdown:
        parser.error("--write goes with --markdown")
    names = args.names or list(WORKLOADS)
    try:
        workloads = [get_workload(n) for n in names]
    except ValueError as e:
        parser.error(str(e))

    from .tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    if args.markdown:
        text = markdown(tokenizer, names)
        print(text, end="")
        if args.write:
            write(text)
        return 0
    stats = {w.name: measure(w, tokenizer) for w in workloads}
    header = (f"{'workload':<13} {'requests':>8} {'rounds':>6} {'tok min':>7} {'tok mean':>8} {'tok max':>7} "
              f"{'shared':>6} {'new min':>7} {'new max':>7} {'ideal hit':>9}")
    print(header)
    print("-" * len(header))
    for name, s in stats.items():
        print(f"{name:<13} {s['requests']:>8} {s['rounds']:>6} {s['tokens_min']:>7} {s['tokens_mean']:>8} "
              f"{s['tokens_max']:>7} {s['shared_prefix']:>6} {s['new_min']:>7} {s['new_max']:>7} "
              f"{s['ideal_hit_rate']:>9.1%}")
    print("\ntokens: templated prompt with generation prompt; shared: longest prefix common to all requests; "
          "new: tokens after it;\nideal hit: tokens a perfect token-level prefix cache reuses over all rounds.")
    if args.json:
        print(json.dumps({"workloads": stats}))
    return 0

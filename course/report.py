"""`python -m course report [--write] [CHAPTER ...]`: every chapter's measured results, drawn from its data.

Each chapter's `benchmarks/stepNN/report.py` says how its committed `results/*.json` become its README's block, plots
and headline (benchmarks/reporting.py holds what they share). Without `--write` this prints the markdown; with it, it
rewrites the blocks of the chapters' pages (README, units, results page) and redraws the plots. Nothing here
measures: rerun `make bench` for new numbers.
"""
from __future__ import annotations

import argparse
import sys

from benchmarks import check_times
from benchmarks.reporting import (
    REPORTS,
    ChapterReport,
    Draw,
    MissingResults,
    page_with,
    results_page,
    table,
    write_block,
)
from course import results
from course.paths import REPO_ROOT


def reports() -> dict[str, ChapterReport]:
    """Every chapter's report, in chapter order: importing a chapter's report module registers it."""
    from benchmarks.step01 import report as _01  # noqa: F401
    from benchmarks.step02 import report as _02  # noqa: F401
    from benchmarks.step03 import report as _03  # noqa: F401
    from benchmarks.step04 import report as _04  # noqa: F401
    from benchmarks.step05 import report as _05  # noqa: F401
    from benchmarks.step06 import report as _06  # noqa: F401
    from benchmarks.step07 import report as _07  # noqa: F401
    return dict(sorted(REPORTS.items()))


# ---- the READMEs ---------------------------------------------------------------------------------------------
def overview(chapters: dict[str, ChapterReport]) -> str:
    """The root README's table: one headline per chapter, each from the same files as the chapter's block."""
    folders = {chapter: results.chapter_dir(chapter) for chapter in chapters}
    rows = [[str(int(chapter.removeprefix("step"))),
             f"[results]({folders[chapter].name}/{results_page(folders[chapter])})", report.headline()]
            for chapter, report in chapters.items()]
    return "\n".join(["Every figure below is drawn from the chapters' `results/*.json` by `python -m course "
                      "report --write`; `make bench` (CPU, chapters 1-5) and chapter 6's GPU command write them. "
                      "Each chapter's block says on which machine, when, and under what load.", ""]
                     + table(["chapter", "tables and plots", "headline"], rows)) + "\n"


def publish(chapter: str, report: ChapterReport, text: str, plots: dict[str, Draw]) -> None:
    """Write a chapter's blocks into the pages that hold their markers (README, units, results page) and draw its
    plots into its results/ folder."""
    folder = results.chapter_dir(chapter)
    write_block(page_with(folder, report.begin), text, report.begin)
    for (begin, end), section in (report.sections() if report.sections else {}).items():
        write_block(page_with(folder, begin), section, begin, end)
    for name, draw in plots.items():
        draw(folder / "results" / name)


def main(argv: list[str] | None = None) -> int:
    every = reports()
    p = argparse.ArgumentParser(prog="python -m course report", description=__doc__.splitlines()[0])
    p.add_argument("chapters", nargs="*", help=f"default: all of {', '.join(every)}")
    p.add_argument("--write", action="store_true", help="rewrite the READMEs' results blocks and redraw the plots")
    args = p.parse_args(argv)
    chosen = [c.split("_")[0] for c in args.chapters] or list(every)
    unknown = [c for c in chosen if c not in every]
    if unknown:
        p.error(f"no report for {', '.join(unknown)}; choose from {', '.join(every)}")
    failed = 0
    for chapter in chosen:
        try:
            text, plots = every[chapter].render()
        except MissingResults as e:
            print(f"{chapter}: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"## {chapter}\n{text}")
        if args.write:
            publish(chapter, every[chapter], text, plots)
    if not args.chapters and not failed:
        text = overview(every)
        print(f"## overview\n{text}")
        if args.write:
            write_block(REPO_ROOT / "README.md", text)
    if not args.chapters and check_times.guide_path().is_file():  # the instructors' guide (not in a student edition)
        text = check_times.render(check_times.load())
        print(f"## check times (instructors/README.md)\n{text}")
        if args.write:
            write_block(check_times.guide_path(), text, check_times.BEGIN, check_times.END)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

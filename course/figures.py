"""`python -m course figures [--check] [chapter ...]`: the lessons' pictures, drawn by the chapters' own code.

Every chapter's `pictures.lesson_figures()` runs the chapter's structures on a small fixed scenario and returns
{name: DOT source}. This command writes each to `stepNN_x/figures/NAME.dot` and, when graphviz's `dot` is
installed, renders `NAME.svg` beside it for the README. DOT text is compared, never SVG: the text depends only
on the code, the SVG also on the graphviz version. `--check` writes nothing; it exits 1 naming every figure
whose committed .dot differs from what the code draws now (the tests ask the same question).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType

from .chapters import chapters
from .draw import has_dot, render_svg
from .paths import REPO_ROOT


def figures_dir(chapter: str) -> Path:
    return REPO_ROOT / chapter / "figures"


def lesson_figures(chapter: str) -> dict[str, str]:
    """{name: DOT source} of a chapter's lesson pictures (`pictures.lesson_figures()`)."""
    return pictures()[chapter].lesson_figures()


def pictures() -> dict[str, ModuleType]:
    """Every chapter's `pictures` module, by chapter."""
    from step01_kvcache import pictures as p01
    from step02_paged import pictures as p02
    from step03_prefix_hash import pictures as p03
    from step04_radix import pictures as p04
    from step05_bridge import pictures as p05
    from step06_triton import pictures as p06
    from step07_serving import pictures as p07
    return {m.__name__.split(".")[0]: m for m in (p01, p02, p03, p04, p05, p06, p07)}


def stale(chapter: str) -> list[str]:
    """What `--check` reports for one chapter: figures whose .dot is missing or differs, and .dot files that no
    figure writes any more."""
    drawn, folder = lesson_figures(chapter), figures_dir(chapter)
    problems = []
    for name, source in drawn.items():
        path = folder / f"{name}.dot"
        if not path.is_file():
            problems.append(f"{path.relative_to(REPO_ROOT)} is missing")
        elif path.read_text() != source:
            problems.append(f"{path.relative_to(REPO_ROOT)} differs from what the code draws")
    problems += [f"{p.relative_to(REPO_ROOT)} is drawn by nothing" for p in sorted(folder.glob("*.dot"))
                 if p.stem not in drawn]
    return problems


def write(chapter: str) -> list[Path]:
    """Write a chapter's figures (.dot, and .svg when graphviz is installed); remove the .dot/.svg of figures
    the chapter no longer draws. Returns the files written."""
    drawn, folder = lesson_figures(chapter), figures_dir(chapter)
    if not drawn:
        return []
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.dot"):
        if old.stem not in drawn:
            old.unlink()
            old.with_suffix(".svg").unlink(missing_ok=True)
    written = []
    for name, source in drawn.items():
        written.append(folder / f"{name}.dot")
        written[-1].write_text(source)
        svg = render_svg(source)
        if svg is not None:
            written.append(folder / f"{name}.svg")
            written[-1].write_text(svg)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course figures", description=__doc__.split("\n\n")[1])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a committed .dot differs from what the code draws")
    parser.add_argument("chapters", nargs="*", metavar="CHAPTER", help="e.g. step02 or step02_paged (default: all)")
    args = parser.parse_args(argv)
    selected = [c for c in chapters() if not args.chapters or any(c.startswith(a) for a in args.chapters)]
    if not selected:
        parser.error(f"no chapter matches {' '.join(args.chapters)}")
    if args.check:
        problems = [p for chapter in selected for p in stale(chapter)]
        if problems:
            print("\n".join(problems) + f"\n{len(problems)} stale figure(s): run `make figures`", file=sys.stderr)
            return 1
        print(f"figures of {len(selected)} chapter(s) are up to date")
        return 0
    for chapter in selected:
        for path in write(chapter):
            print(f"wrote {path.relative_to(REPO_ROOT)} ({path.stat().st_size:,} bytes)")
    if not has_dot():
        print("graphviz's `dot` is not installed: wrote the DOT sources only", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

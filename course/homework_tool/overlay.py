"""`python -m course homework run|notebook`: a chapter's demo, any command, or its notebook, on the student's copy.

The command runs in a process of its own whose Python imports the chapter from `homework/<package>/` rather than
the course's package: overlay_site/sitecustomize.py, put first on PYTHONPATH, installs an import finder ahead of
sys.path (where `python -m` puts the repository root first, and the venv's .pth file puts it too). A notebook's
kernel inherits the same environment. The chapters before it come from the course (its reference) or from the
student's copies in `homework/`, as `--earlier` chooses:

- `auto` (default): as `homework check` imports them: the course's own when it holds their reference bodies, the
  student's copy in a student edition that stubs them;
- `reference`: the course's own, so a student who has not finished chapter N-1 can still run chapter N (in a
  student edition, only for the chapters the instructor released with their reference bodies);
- `copy`: the student's copies wherever there is one (the student's own chapter N-1 under chapter N).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from ..paths import REPO_ROOT, shown
from .tasks import DEFAULT_DEST, CheckError, earlier_chapters, resolve_chapter

SITE = Path(__file__).resolve().parent / "overlay_site"  # holds the sitecustomize.py that every child imports
EARLIER = ("auto", "reference", "copy")


class Overlay(NamedTuple):
    """Which copy of each chapter a command run on the student's code imports."""

    package: str
    copies: dict[str, Path]  # package -> the student's copy that replaces the course's
    notes: list[str]  # one line per chapter: where it comes from

    def env(self, root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) with the copies installed for every Python it starts."""
        env = dict(os.environ if base is None else base)
        paths = [str(SITE), str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["KVCOURSE_HOMEWORK"] = json.dumps({p: str(c) for p, c in self.copies.items()})
        return env


def overlay(chapter: str, dest: Path | str = DEFAULT_DEST, earlier: str = "auto", root: Path | None = None) -> Overlay:
    """The student's copy of `chapter` in `dest`, and the earlier chapters as `earlier` chooses (see the module)."""
    if earlier not in EARLIER:
        raise CheckError(f"--earlier {earlier!r}: choose one of {', '.join(EARLIER)}")
    root = (root or REPO_ROOT).resolve()
    package, _ = resolve_chapter(chapter, root)
    dest = Path(dest).resolve()
    copy = dest / package
    if not (copy / "__init__.py").is_file():
        raise CheckError(f"no student copy at {shown(copy)}; run: python -m course homework start {chapter}")
    copies, notes = {package: copy}, [f"{package}: your copy {shown(copy)}"]
    for e in earlier_chapters(package, dest, root):
        stubs = f" (still stubs: {', '.join(e.unsolved)})" if e.unsolved else ""
        if earlier == "copy" and e.has_copy or earlier == "auto" and e.from_copy:
            copies[e.package] = e.copy
            notes.append(f"{e.package}: your copy {shown(e.copy)}{stubs}")
        elif e.reference:
            notes.append(f"{e.package}: the course's reference" + (" (you have no copy)" if earlier == "copy" else ""))
        elif earlier == "reference":
            raise CheckError(f"{e.package} is stubbed in this edition of the course: it holds no reference of it to "
                             f"run {package} on. Use --earlier copy (your own {shown(e.copy)}), or ask your "
                             "instructor for an edition that keeps its reference")
        else:
            notes.append(f"{e.package}: the course's stubs (you have no copy: its code raises NotImplementedError; "
                         f"python -m course homework start {e.package.split('_')[0]})")
    return Overlay(package, copies, notes)


def notebook_of(package: str, root: Path) -> Path:
    """notebooks/NN_name.ipynb, the notebook of chapter stepNN_name."""
    path = root / "notebooks" / f"{package.removeprefix('step')}.ipynb"
    if not path.is_file():
        raise CheckError(f"{package} has no notebook ({shown(path)} is missing)")
    return path


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """`homework run ... -- COMMAND`'s arguments before the first `--`, and the command after it (argparse cannot
    take both: a command's own flags would be read as the tool's)."""
    if argv[:1] == ["run"] and "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def command(cmd: list[str], package: str) -> list[str]:
    """What `run` starts: the chapter's demo (`python -m <package>`) when `cmd` is empty or only flags for it; a
    leading `python` is this interpreter (the course's venv)."""
    if not cmd or cmd[0].startswith("-"):
        return [sys.executable, "-m", package, *cmd]
    return [sys.executable, *cmd[1:]] if cmd[0] in ("python", "python3") else cmd


def notebook_command(nb: Path, execute: bool, output: Path | None) -> list[str]:
    """Jupyter on the notebook, or nbconvert executing it headless into `output` (the course's copy untouched)."""
    if not execute:
        return [sys.executable, "-m", "jupyter", "lab", str(nb)]
    assert output is not None
    return [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", str(nb),
            "--output-dir", str(output.parent), "--output", output.name]


def add_commands(sub: argparse._SubParsersAction) -> None:
    """`run` and `notebook`, the subcommands of `python -m course homework` that this module runs."""
    p_run = sub.add_parser("run", help="run the chapter's demo, or any command, on your homework/ copy",
                           usage="python -m course homework run CHAPTER [--dest DIR] [--earlier {auto,reference,copy}]"
                                 " [-- COMMAND ...]",
                           epilog="After --: the command (e.g. -- python -m step02_paged --prompt 'Hi'), or flags "
                                  "alone for the chapter's demo (-- --prompt 'Hi').",
                           description="Run COMMAND (default: the chapter's demo, python -m stepNN_x) with the "
                           "chapter imported from your copy in homework/.")
    p_nb = sub.add_parser("notebook", help="open (or --execute) the chapter's notebook on your homework/ copy",
                          description="Open the chapter's notebook in Jupyter, or execute it headless, with the "
                          "chapter imported from your copy in homework/.")
    for p in (p_run, p_nb):
        p.add_argument("chapter", help="step01 or step01_kvcache")
        p.add_argument("--dest", type=Path, default=DEFAULT_DEST, metavar="DIR",
                       help="folder of student copies (default: homework/)")
        p.add_argument("--earlier", choices=EARLIER, default="auto",
                       help="the chapters before it: as `check` imports them (auto, default), the course's "
                            "reference, or your copies")
        p.add_argument("--root", type=Path, help=argparse.SUPPRESS)  # another course checkout (for tests)
    p_nb.add_argument("--execute", action="store_true",
                      help="run every cell headless (nbconvert) and write the executed notebook to --output")
    p_nb.add_argument("--output", type=Path, metavar="FILE",
                      help="where --execute writes (default: DIR/notebooks/NN_name.ipynb)")


def main(args: argparse.Namespace, cmd: list[str]) -> int:
    """Run `args.command` ("run" or "notebook"; `cmd`: what followed `run`'s `--`); its exit code."""
    root = (args.root or REPO_ROOT).resolve()
    try:
        plan = overlay(args.chapter, args.dest, args.earlier, root)
        if args.command == "run":
            cmd = command(cmd, plan.package)
        else:
            nb = notebook_of(plan.package, root)
            output = (args.output or Path(args.dest) / "notebooks" / nb.name).resolve() if args.execute else None
            cmd = notebook_command(nb, args.execute, output)
    except CheckError as exc:
        print(f"homework {args.command}: {exc}", file=sys.stderr)
        return 2
    print(f"homework {args.command}: imports " + "\n  ".join(plan.notes), file=sys.stderr, flush=True)
    try:
        code = subprocess.run(cmd, env=plan.env(root), check=False).returncode
    except FileNotFoundError as exc:
        print(f"homework {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if args.command == "notebook" and args.execute and code == 0:
        print(f"homework notebook: wrote {shown(output)}", file=sys.stderr)
    return code

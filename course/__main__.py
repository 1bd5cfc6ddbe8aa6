"""`python -m course <command>`: bench, report, figures, homework, workloads."""
from __future__ import annotations

import sys

USAGE = """usage: python -m course <command> [args]

commands:
  bench <chapter> --workload <name> [--json]   a chapter's engine, cache off vs on, in one process
  report [--write] [chapter ...]               the READMEs' result tables and plots, from results/*.json
  figures [--check] [<chapter> ...]            the lessons' pictures, drawn by the chapters' code (stepNN_x/figures/)
  homework start|check <chapter> ...           student copies and per-task grading
  homework run|notebook <chapter> ...          a chapter's demo, a command or its notebook on your homework/ copy
  homework timings [<chapter> ...]             check's time per chapter on the reference (instructors/README.md)
  homework release DIR [--chapters ...]        a student edition of the course (no solutions)
  homework autograder <chapter> OUT.zip ...    a Gradescope autograder for one chapter
  homework written <chapter> [--output FILE]   the answer sheet of a chapter's thought questions (the written part)
  workloads [--markdown [--write]]             the shared workloads and their token counts (WORKLOADS.md)
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from .bench import main as run
    elif command == "report":
        from .report import main as run
    elif command == "figures":
        from .figures import main as run
    elif command == "homework":
        from .homework_tool import main as run
    elif command == "workloads":
        from .workloads_page import main as run
    else:
        print(f"unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())

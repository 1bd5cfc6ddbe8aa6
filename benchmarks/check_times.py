"""The instructors' table of how long `python -m course homework check` takes per chapter, drawn from the committed
`instructors/check_times.json` (which `python -m course homework timings` measures: course/homework_tool/timings.py).
`python -m course report --write` writes it between the markers below in `instructors/README.md`; nothing here
measures."""
from __future__ import annotations

import json
from pathlib import Path

from course.paths import REPO_ROOT

from .reporting import table

BEGIN = "<!-- check-times:begin (python -m course report --write) -->"
END = "<!-- check-times:end -->"
COMMAND = "python -m course homework timings"


def data_path(root: Path | None = None) -> Path:
    return (root or REPO_ROOT) / "instructors" / "check_times.json"


def guide_path(root: Path | None = None) -> Path:
    return (root or REPO_ROOT) / "instructors" / "README.md"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 60 else f"{int(s // 60)} min {round(s % 60):02d} s"


def render(record: dict | None) -> str:
    """The block's markdown: a table, one row per chapter, and the machine it was measured on (`record`: the
    JSON's content; None: not measured)."""
    if record is None:
        return (f"No measurement is committed: run `{COMMAND}` on a quiet machine, then `python -m course report "
                "--write`.\n")
    m = record["machine"]
    load = f"load {m['load_avg_1m_at_start']:g} at the start, {m['load_avg_1m_at_end']:g} at the end"
    rows, full, scored = [], 0.0, 0.0
    for chapter, c in record["chapters"].items():
        rows.append([chapter.split("_")[0], f"{c['tasks']} ({c['points']} points)", str(c["tests"]),
                     _seconds(c["check"]["wall_s"]), _seconds(c["scored_only"]["wall_s"]),
                     str(c["scored_only"]["tests"])])
        full += c["check"]["wall_s"]
        scored += c["scored_only"]["wall_s"]
    rows.append(["all", "", "", _seconds(full), _seconds(scored), ""])
    lines = [
        f"Measured by `{record['command']}` on {record['date'][:10]} at commit {record['commit'][:7]}: {m['cpu']}, "
        f"{m['cores']} cores ({load}), Python {m['python']}, torch {m['torch']}. Each chapter's reference, copied "
        "as `homework start` copies it with nothing stubbed, checked once with the default limits "
        f"(`--timeout {record['timeout']:g}` per test): the wall-clock time of the whole command, Python's start, "
        "torch's import and the test process included. `--scored-only` runs the tagged tests alone, as the "
        "Gradescope autograder does.", "",
        *table(["chapter", "tasks", "tests", "`check`", "`check --scored-only`", "tagged tests"], rows)]
    return "\n".join(lines) + "\n"


def load(root: Path | None = None) -> dict | None:
    path = data_path(root)
    return json.loads(path.read_text()) if path.is_file() else None

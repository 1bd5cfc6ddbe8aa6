"""What a task needs solved before its tests can pass: the *needs* column of each chapter's Exercises table.

A task needs another when its tests run the other's body (the proof's reference run records it, trace.py):
until that body is written, the tests stop in its stub, whatever this task's own body does. The column is
written for a reader and read back here to be checked against what the tests run:

- the chapter's own tasks one by one: `` `task4.match` ``;
- an earlier chapter whose tasks are all needed: `chapter 1`, or several at once, `chapters 1-2`;
- most of an earlier chapter: `chapter 4 (not `task4.lpm`)`; a few of its tasks, one by one;
- nothing: `—`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

TASK = re.compile(r"`(task\d+\.[\w\-]+)`")
_CHAPTERS = re.compile(r"\bchapters? (\d+(?:\s*(?:[-–,]|and)\s*\d+)*)(?:\s*\(not ([^)]*)\))?")
NOTHING = "—"


def _chapter(task: str) -> int:
    return int(task.split(".")[0].removeprefix("task"))


def _numbers(text: str) -> list[int]:
    """`1-3`, `1, 2 and 4` -> [1, 2, 3], [1, 2, 4]."""
    out: list[int] = []
    for part in re.split(r"\s*(?:,|and)\s*", text.strip()):
        if m := re.fullmatch(r"(\d+)\s*[-–]\s*(\d+)", part):
            out += range(int(m[1]), int(m[2]) + 1)
        elif part:
            out.append(int(part))
    return out


def describe(needed: Iterable[str], own: str, tasks: Mapping[int, list[str]]) -> str:
    """The column's text for a task of chapter `own` ('task4.insert''s chapter) that needs `needed`; `tasks`:
    chapter number -> its tasks in the order of its table."""
    needed = set(needed)
    mine = _chapter(own)
    order = {t: i for c in sorted(tasks) for i, t in enumerate(tasks[c])}
    parts = [f"`{t}`" for t in sorted((t for t in needed if _chapter(t) == mine), key=lambda t: order.get(t, 0))]
    whole: list[int] = []
    for chapter in sorted(c for c in tasks if c < mine):
        have = [t for t in tasks[chapter] if t in needed]
        if have == tasks[chapter]:
            whole.append(chapter)
            continue
        if whole:
            parts.append(_whole(whole))
            whole = []
        missing = [t for t in tasks[chapter] if t not in needed]
        if len(have) > len(missing):
            parts.append(f"chapter {chapter} (not {', '.join(f'`{t}`' for t in missing)})")
        else:
            parts += [f"`{t}`" for t in have]
    if whole:
        parts.append(_whole(whole))
    return ", ".join(parts) or NOTHING


def _whole(chapters: list[int]) -> str:
    if len(chapters) == 1:
        return f"chapter {chapters[0]}"
    if chapters == list(range(chapters[0], chapters[-1] + 1)):
        return f"chapters {chapters[0]}-{chapters[-1]}"
    return f"chapters {', '.join(map(str, chapters[:-1]))} and {chapters[-1]}"


def parse(cell: str, tasks: Mapping[int, list[str]]) -> set[str]:
    """The tasks a *needs* cell names (see the module docstring), chapters expanded; `tasks` as for `describe`."""
    found: set[str] = set()
    rest = cell
    for m in _CHAPTERS.finditer(cell):
        left_out = set(TASK.findall(m[2] or ""))
        for chapter in _numbers(m[1]):
            found |= {t for t in tasks.get(chapter, []) if t not in left_out}
        rest = rest.replace(m[0], " ")
    return found | set(TASK.findall(rest))

"""The processes of a check: every worker, and everything its tests started, found through /proc and killed.

A worker runs in a session of its own (start_new_session), so its session and process group hold what it
starts. A process that calls setsid() leaves both, and once its parent dies it would become init's child; so
while workers run, the grader is a child subreaper (Linux's PR_SET_CHILD_SUBREAPER): such an orphan becomes
the grader's own child instead, and `sweep` finds it. Where /proc or prctl is missing (not Linux), only the
worker's process group can be killed; a process that left it survives the check there.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


class Proc(NamedTuple):
    ppid: int
    pgrp: int
    session: int
    zombie: bool


def processes() -> dict[int, Proc]:
    """Every process /proc shows, by pid ({} where there is no /proc)."""
    out: dict[int, Proc] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it ended meanwhile
        state, ppid, pgrp, session = stat[stat.rfind(b")") + 2:].split()[:4]  # the name may hold spaces and ')'
        out[int(name)] = Proc(int(ppid), int(pgrp), int(session), state in (b"Z", b"X"))
    return out


def children() -> set[int]:
    """This process's children, now."""
    me = os.getpid()
    return {pid for pid, p in processes().items() if p.ppid == me}


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """While the block runs, orphans among this process's descendants become its children (Linux); yields
    whether that worked. The previous setting comes back afterwards."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        yield False
        return
    previous = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) or prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
        yield False
        return
    try:
        yield True
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, previous.value, 0, 0, 0)


def _targets(table: dict[int, Proc], sessions: set[int], roots: set[int], keep: set[int]) -> set[int]:
    """The processes of `sessions` (as session or process group), `roots`, this process's children outside
    `keep` (orphans it adopted as subreaper), and the descendants of all of them."""
    me = os.getpid()
    tops = {pid for pid, p in table.items()
            if p.session in sessions or p.pgrp in sessions or pid in roots or (p.ppid == me and pid not in keep)}
    below: dict[int, list[int]] = {}
    for pid, p in table.items():
        below.setdefault(p.ppid, []).append(pid)
    out: set[int] = set()
    stack = list(tops)
    while stack:
        pid = stack.pop()
        if pid in out or pid == me or pid in keep:
            continue
        out.add(pid)
        stack.extend(below.get(pid, []))
    return out


def sweep(sessions: Iterable[int], keep: Iterable[int] = (), unreaped: Iterable[int] = ()) -> int:
    """SIGKILL every process of `sessions` (each worker leads one: its pid), their descendants, and every child
    of this process not in `keep` (orphans handed to it as subreaper) with theirs, until a scan finds none;
    reap those that were this process's children, except `unreaped` (subprocess.Popen reaps the workers).
    Returns how many processes it killed, workers aside."""
    me, sessions, keep, unreaped = os.getpid(), set(sessions), set(keep), set(unreaped)
    roots: set[int] = set()  # killed in an earlier round: what they forked meanwhile is theirs too
    killed: set[int] = set()
    for _ in range(500):  # a fork bomb forks while it is killed: rounds until a scan finds nothing
        table = processes()
        roots &= table.keys()
        targets = _targets(table, sessions, roots, keep)
        for pid in targets:
            if table[pid].ppid == me and table[pid].zombie and pid not in unreaped:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        live = {pid for pid in targets if not table[pid].zombie}
        if not live:
            break
        for pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= live
        roots |= live
        time.sleep(0.005)
    return len(killed - unreaped)

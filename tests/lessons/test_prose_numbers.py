"""Every number in the lessons' prose against where it comes from.

The prose is what a reader reads of the root README, each chapter's README and each notebook's markdown cells,
less fenced code, inline `code`, link targets, HTML comments and the blocks that `python -m course report
--write` generates from the committed results (those cannot drift): see course/markdown.py. Hand-typed tables
are prose. Each number there is

- checked by a `says` of this file: formatted from the committed results (`stepNN_*/results/*.json`, which
  `make bench` and chapter 6's GPU commands rewrite: never typed here), recomputed from the code (a constant, a
  formula, a workload's token counts), or from another number the lesson states and a check reads;
- structure, found by `STRUCTURE`: a cross-reference ("chapter 3", "question 9"), a list's or a heading's
  number, an arXiv id, a paper's venue and year;
- or listed in `ALLOWED`, per file and grouped by kind, each kind with its reason: a question's own givens, the
  fixed scenario of a picture, a source's own figures, a version, a count in a definition.

`says(path, *strings)` checks that the lesson states each string (a number formatted as the lesson writes it,
with the words around it) and marks the numbers inside it as checked; a test names every string of its own that
it did not find, so a rerun of a bench makes the file name each prose number that moved. The last test finds
every number of the prose and fails on one that nothing covered, naming file, line and number.
"""
from __future__ import annotations

import functools
import json
import re
from collections import defaultdict

import pytest

from benchmarks.step06 import engine_report
from benchmarks.step06 import report as step06_report
from course.homework_tool.release import is_release
from course.markdown import Document, documents, prose
from course.paths import REPO_ROOT
from step01_kvcache.tiny import SMOLLM2_135M

from .conftest import MOVED

# 8,192 and 0.0906 are one number each; h200, fp32 and v0.10.2 none; 1..8,192 two
NUMBER = re.compile(r"(?:(?<![\w.])|(?<=\.\.))[0-9]+(?:[,.][0-9]+)*")
STRUCTURE = re.compile("|".join([
    r"\b(?:[Cc]hapters?|[Qq]uestions?|[Uu]nits?|ch\.|[Rr]ounds?)\s+\d+(?:\s*(?:[-–,]|and|or|to)\s*\d+)*",  # references
    r"^[ \t]*(?:#+[ \t]+|\*\*)?\d+\.(?=\s)",  # a numbered list item or heading
    r"\bN\s*[+−]\s*1\b",  # the step after step N
    r"\barXiv[: ]\d{4}\.\d{4,5}\b",  # a paper's arXiv id
    r"\b(?:NeurIPS|OSDI|SOSP|MLSys|EMNLP|ATC|MAPL|CACM|ICML|ICLR)\s+(?:19|20)\d\d\b",  # a paper's venue and year
]), re.M)


@functools.cache
def _documents() -> dict[str, Document]:
    return {d.path: d for d in documents(REPO_ROOT)}


class _Prose:
    """A document's prose numbers (offset -> number) and a whitespace-collapsed view of its text to search in."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        text = prose(doc.text)
        structure = [m.span() for m in STRUCTURE.finditer(text)]
        self.numbers: dict[int, str] = {}
        self.structure: dict[int, str] = {}
        for m in NUMBER.finditer(text):
            inside = any(a <= m.start() and m.end() <= b for a, b in structure)
            (self.structure if inside else self.numbers)[m.start()] = m[0]
        self.flat, self.index = [], []  # the text with each run of whitespace one space; flat offset -> offset
        for m in re.finditer(r"\s+|\S", doc.text):
            self.flat.append(" " if m[0].isspace() else m[0])
            self.index.append(m.start())
        self.flat = "".join(self.flat)
        self.index.append(len(doc.text))

    def covered(self, string: str) -> set[int]:
        """Offsets of the prose numbers inside any occurrence of `string` (whitespace collapsed)."""
        needle = " ".join(string.split())
        found: set[int] = set()
        start = self.flat.find(needle)
        while start >= 0:
            a, b = self.index[start], self.index[start + len(needle) - 1] + 1
            found |= {o for o, n in self.numbers.items() if a <= o and o + len(n) <= b}
            start = self.flat.find(needle, start + 1)
        return found


@functools.cache
def _prose(path: str) -> _Prose:
    docs = _documents()
    assert path in docs, f"no lesson {path}"
    return _Prose(docs[path])


CHECKED: dict[str, set[int]] = defaultdict(set)  # path -> offsets of the numbers that a `says` checked
# A student release writes the root README without its sections for instructors: what they say is not there.
CUT = {"README.md"} if is_release() else set()


def says(path: str, *strings: str) -> None:
    """The lesson at `path` (relative to the repository) states each string in its prose (whitespace aside), with
    at least one number of it outside code and generated blocks; those numbers count as checked for the audit.
    A string it does not state is named when the test ends (with every other one the test missed)."""
    lesson = _prose(path)
    for s in strings:
        hit = lesson.covered(s)
        if not hit and path not in CUT:
            MOVED.append(f"  {path} should say {s!r}")
        CHECKED[path] |= hit


def pages(folder: str) -> tuple[str, ...]:
    """A chapter's pages (its README, its units, its results page), as `documents` lists them."""
    return tuple(p for p in _documents() if p.startswith(folder) and p.endswith(".md"))


def says_in(folder: str, *strings: str) -> None:
    """`says` for a chapter of several pages (its README, units and results page, under `folder`): each string is
    checked in every page that states it, and named if none does. A path that is not a folder is one page."""
    if not folder.endswith("/"):
        return says(folder, *strings)
    for s in strings:
        where = [p for p in pages(folder) if _prose(p).covered(s)]
        for path in where or [f"{folder}README.md"]:
            says(path, s)


CHAPTER4 = "step04_radix/"
CHAPTER5 = "step05_bridge/"
CHAPTER6 = "step06_triton/"


def fmt(x: float, digits: int) -> str:
    """A number as the lessons write it: thousands separated, `digits` decimals."""
    return f"{x:,.{digits}f}"


# ---------------------------------------------------------------- the committed results, and the code


def _results(chapter: str, name: str) -> dict:
    folder = next(p for p in REPO_ROOT.glob(f"{chapter}_*") if p.is_dir())
    return json.loads((folder / "results" / f"{name}.json").read_text())


def figures(chapter: str, name: str) -> dict:
    """A committed run of a chapter's bench (`python -m course bench stepNN --workload NAME --save`)."""
    return _results(chapter, name)["figures"]


@functools.cache
def workload(name: str) -> dict:
    """A workload's token counts as `python -m course workloads` prints them (the real tokenizer)."""
    from course.workloads import get_workload, measure

    return measure(get_workload(name), _tokenizer())


@functools.cache
def prompts(name: str) -> list[list[int]]:
    from course.workloads import get_workload

    return get_workload(name).prompts(_tokenizer())


@functools.cache
def _tokenizer():
    from step01_kvcache.pretrained import load_tokenizer

    return load_tokenizer()


S = SMOLLM2_135M



@functools.cache
def _params() -> int:
    """SmolLM2's parameter count, from chapter 1's model built on the meta device (no weights)."""
    import torch

    from step01_kvcache.config import ModelConfig
    from step01_kvcache.model import Transformer

    with torch.device("meta"):
        return sum(p.numel() for p in Transformer(ModelConfig(**S)).parameters())


def kv_bytes(dtype_bytes: int = 4) -> int:
    """K and V of one token over every layer (chapter 1's formula, from SmolLM2's config)."""
    from step01_kvcache.config import ModelConfig

    return ModelConfig(**S).kv_bytes_per_token(dtype_bytes)


MIB = 2**20


# ---------------------------------------------------------------- every chapter: the homework tables


@pytest.mark.parametrize("package", sorted(p.parent.name for p in REPO_ROOT.glob("step[0-9][0-9]_*/README.md")))
def test_homework_points(package: str):
    """Each task's points as its markers give them, and their sum where the lesson states it."""
    from course.homework_tool import find_tasks, task_points

    path = f"{package}/README.md"
    points = task_points(find_tasks(package.split("_")[0]))
    says(path, *(f"| `{task}` | {n} |" for task, n in points.items()))
    if "points in all" in _documents()[path].text:
        says(path, f"({sum(points.values())} points in all)")


@pytest.mark.parametrize("package", sorted(p.parent.name for p in REPO_ROOT.glob("step[0-9][0-9]_*/README.md")))
def test_thought_question_points(package: str):
    """Each thought question's points (the README is their source: the answer sheet and the rubrics follow it), and
    the written part's total as their sum."""
    from course.homework_tool import written

    path = f"{package}/README.md"
    if asked := written.questions(package):
        says(path, *(f"{q.number}. *({q.points} points)*" for q in asked),
             f"the written part is worth {sum(q.points or 0 for q in asked)} points in all")


# ---------------------------------------------------------------- the root README


def test_root_readme():
    import tomllib

    from course.homework_tool import grading, leaks, markers, runner

    path = "README.md"
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    torch_pin = next(d for d in project["dependencies"] if d.startswith("torch=="))
    says(path, f"PyTorch {'.'.join(torch_pin.removeprefix('torch==').split('.')[:2])} CPU",
         f"Python ≥ {project['requires-python'].removeprefix('>=')}")
    machine = _results("step01", "single")["machine"]
    says(path, f"on a {machine['cores']}-core machine seconds move with load",
         f"prefills {round(workload('long')['tokens_mean'] / 1000)}k-token prompts")
    says(path, f"({markers.Region._field_defaults['points']} unless the marker says `points=N`)",
         f"default {grading.check.__defaults__[1]:g}: an infinite")
    # the instructors' guide (no lesson: the student edition leaves it out) states the grader's numbers too
    guide = (REPO_ROOT / "instructors" / "README.md").read_text()
    for number in (f"Python ≥ {project['requires-python'].removeprefix('>=')}",
                   f"(no `points=` means {markers.Region._field_defaults['points']})",
                   f"or a {leaks.KEY_NODES}-node formula", f"or a {leaks.KEY_TOKENS}-token formula",
                   f"{leaks.KEY_WORDS} consecutive words of a key",
                   f"max({runner._grace(0):g} s, {runner._grace(1000) / 10:g} %)"):
        assert number in guide, f"instructors/README.md should say {number!r}"
    oracle = (REPO_ROOT / "tests" / "step01" / "test_oracle.py").read_text()
    tolerance, new = "1e-4", re.search(r"\bn = (\d+)", oracle)[1]
    assert f"diff <= {tolerance}" in oracle
    says(path, f"(≤ {tolerance}, fp32)", f"for {new} new tokens")


# ---------------------------------------------------------------- chapter 1


def test_step01_readme():
    import torch

    from step01_kvcache.config import ModelConfig
    from step01_kvcache.model import Transformer

    path = "step01_kvcache/README.md"
    per_token, weights = kv_bytes(), _params() * 4
    says(path, f"(≈ {weights / MIB:.0f} MiB of fp32 weights)", f"(≈ {weights / MIB:.0f} MiB in fp32)",
         f"against {weights / MIB:.0f} MiB of weights",
         f"At 512 tokens the K/V rows are {512 * per_token / MIB:.1f} MiB",
         f"1,000 tokens take {1000 * per_token / MIB:.0f} MiB",
         f"**Grouped-query attention** is already a {S['num_heads'] // S['num_kv_heads']}× saving",
         f"SmolLM2 has {S['num_heads']} query heads but only {S['num_kv_heads']} KV heads",
         f"a group of {S['num_heads'] // S['num_kv_heads']} query heads",
         f"would cache {S['num_heads']} heads, i.e. "
         f"{per_token * S['num_heads'] // S['num_kv_heads']:,} bytes per token",
         f"8,192 tokens here, i.e. {8192 * per_token / MIB:.0f} MiB per request", f"({per_token:,} bytes",
         f"why SmolLM2 has {S['num_kv_heads']} KV heads for {S['num_heads']} query heads")
    assert S["max_position_embeddings"] == 8192, "the lesson reserves the model's whole context"
    with torch.device("meta"):
        layer = Transformer(ModelConfig(**S)).layers[0]
    per_layer = sum(isinstance(m, torch.nn.Linear) for m in layer.modules())
    says(path, f"the same {per_layer * S['num_layers'] + 1} matrix products ({per_layer} per layer and the")
    single = figures("step01", "single")
    says(path, f"a {single['prompt_tokens']}-token prompt plus a short answer",
         f"on a {_results('step01', 'single')['machine']['cores']}-core machine move with load")



# ---------------------------------------------------------------- chapter 2


def test_step02_readme():
    from benchmarks.step02 import report
    from benchmarks.step02.host import CONTEXTS, SEQS
    from step02_paged.config import EngineConfig

    path = "step02_paged/"  # the README, its units and its results page
    default = EngineConfig()
    bs = default.block_size
    says_in(path, f"not by the block size ({bs})", f"at block size {bs})",
            f"at most {default.max_num_seqs * (bs - 1)} slots are unfilled",  # eight running sequences: the seats
            f"would make a 2,000-token prompt take {-(-2000 // bs)}", f"up to {bs - 1} unfilled slots per sequence",
            f"SmolLM2 stores {S['num_kv_heads']} heads instead of {S['num_heads']}",
            "16-token block holds", f"bytes ({bs * kv_bytes() / MIB:.1f} MiB): {bs} tokens of chapter 1's",
            f"{kv_bytes():,} bytes per token")
    host = figures("step02", "host")
    assert (host["requests"], tuple(host["contexts"])) == (SEQS, CONTEXTS), "the committed host run is another setting"
    contexts = f"at contexts of {host['contexts'][0]} to {host['contexts'][-1]:,} tokens"
    says_in(path, f"of {SEQS} sequences of {CONTEXTS[-1]:,} tokens each, how many entries would a step write at "
                  f"block size {bs}")  # question 8
    says_in(path, f"with {SEQS} sequences of {CONTEXTS[-1] // 1024}k tokens",
            f"`design`) {contexts}",
            f"level from {host['contexts'][0]} to {host['contexts'][-1]:,} tokens",
            f"at most {report.HOST_TARGET_US} µs per step at {host['requests']} sequences",
            f"no more than {report.HOST_FLAT}x", f"the {report.HOST_TARGET_US} µs target is missed")
    bench = (REPO_ROOT / "benchmarks" / "step02" / "bench.py").read_text()
    config = dict(re.findall(r"(num_blocks|block_size|max_num_batched_tokens)=(\d+)", bench))
    batch = figures("step02", "batch")
    new = re.search(r"SamplingParams\(max_new_tokens=args.max_new_tokens or (\d+)", bench)[1]
    says_in(path, f"the engine uses {config['num_blocks']} blocks of {config['block_size']} tokens, "
                  f"`max_num_seqs = {batch['requests']}` and a [token budget](../GLOSSARY.md#token-budget) of "
                  f"{config['max_num_batched_tokens']} tokens per step",
            f"({batch['requests']} unrelated requests of very different lengths, up to "
            f"{new} new tokens each",
            f"--workload batch`: {batch['requests']} ragged requests", f"A user with {batch['requests']} prompts",
            f"up to {batch['requests']} sequences reads every weight matrix once for {batch['requests']} rows",
            f"slows an {batch['requests']}-row matmul")
    cores = _results("step02", "batch")["machine"]["cores"]
    says_in(path, f"on a shared {cores}-core host", f"Timings on {cores} cores depend on load")


def test_step05_speculative():
    """Speculative decoding's unit: the proposer's defaults, the rollback figure as `pictures.py` draws it, what the
    unit and the chapter take from the committed run (results/speculative.json), and the report's targets."""
    from benchmarks.step05 import speculative_report as report
    from step05_bridge import SpeculativeConfig
    from step05_bridge.pictures import rollback_figure

    path = "step05_bridge/04_speculative.md"
    default = SpeculativeConfig(1)
    says(path,
         f"`prompt_lookup_min` and `prompt_lookup_max` ({default.prompt_lookup_min} and {default.prompt_lookup_max})")
    says("step05_bridge/RESULTS.md", f"Its targets: at least {report.SPEC_TARGET}x the",
         f"no more than {report.SPEC_OVERHEAD:.0%} slower where nothing is")
    figure = rollback_figure()
    during, after = figure.split('"after"', 1)
    block = int(re.search(r'COLSPAN="(\d+)"', figure)[1])
    computed = int(re.search(r"(\d+) positions computed", during)[1])
    kept = int(re.search(r"after the rollback<BR/>(\d+) computed", after)[1])
    freed = re.findall(r"block (\d+) \(freed\)", after)
    drafts = during.count("#fde293")  # the drafts' cells (yellow) in the verify step's panel
    assert len(freed) == 1 and int(freed[0]) == computed // block, "one block freed, the fifth, the drafts' last"
    says(path, f"the verify step writes positions {computed - 1 - drafts}-{computed - 1} into five blocks; after the "
               f"rollback the fifth block is freed and slot {kept} holds a rejected draft",
         f"`KVCacheManager` of {block}-token blocks and the prompt-lookup proposer",
         f"the counter goes back from {computed} to {kept}, block {freed[0]} held only rejected",
         f"slot {kept} (red) holds")
    run = figures("step05", "speculative")
    batches = sorted({r["batch"] for r in run["rows"]})
    assert len(batches) == 2 and report.spec_row(run, "edit", batches[0]), "the target's row: `edit` at batch 1"
    says(path, f"on the real model, at batch {batches[0]} and {batches[-1]};",
         f"at batch {batches[-1]} every extra row")
    says("step05_bridge/RESULTS.md",
         f"plain\ndecoding at batch {batches[0]} on a workload whose answers copy from their prompt")


# ---------------------------------------------------------------- chapters 3 to 5: the prefix caches


def _layer_flops() -> tuple[int, int]:
    """One token through one layer of SmolLM2: the matmuls' FLOPs, and attention's FLOPs per key it attends."""
    import torch

    from step01_kvcache.config import ModelConfig
    from step01_kvcache.model import Transformer

    with torch.device("meta"):
        layer = Transformer(ModelConfig(**S)).layers[0]
    linear = sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))
    return 2 * linear, 4 * S["num_heads"] * S["head_dim"]  # QK and PV: two multiply-adds per key and dimension


def _warm_long(block: int = 16) -> tuple[int, int]:
    """`long`'s median warm request: (its prompt tokens, the tokens it computes past its cached whole blocks)."""
    from statistics import median

    from course.workloads import shared_prefix_len

    every = prompts("long")
    cached = shared_prefix_len(every) // block * block
    return int(median(len(p) for p in every[1:])), int(median(len(p) - cached for p in every[1:]))


def test_step03_readme():
    import hashlib
    import sys

    from benchmarks.step03.bench import BLOCK_SIZE, micro_benchmarks
    from course.workloads import TEXTS, _lcp
    from step02_paged.config import EngineConfig

    path = "step03_prefix_hash/"  # the README and its results page
    long, B = workload("long"), BLOCK_SIZE
    prompt, new = _warm_long(B)
    linear, per_key = _layer_flops()
    attention = per_key * prompt / (per_key * prompt + linear)
    cold = prompt * linear + per_key * prompt * (prompt + 1) / 2  # every token attends over the ones before it
    warm = new * linear + per_key * sum(range(prompt - new + 1, prompt + 1))
    run = figures("step03", "long")
    assert run["hf_shared_prefix_tokens"] == long["shared_prefix"]
    says_in(path, f"a reference manual + a {long['new_min']}–{long['new_max']}-token question",
            f"the same {long['shared_prefix']:,} tokens) the model runs ~{long['tokens_min']:,} tokens through "
            f"{S['num_layers']} layers", f"the ~{new} question tokens are new",
            f"total / new ≈ {run['speedup_bound']:.0f}×", f"a shared reference text and {long['requests']} questions",
            f"ours is a {len(_tokenizer().encode((TEXTS / 'long_reference.txt').read_text().strip())):,}-token manual",
            f"bring to {long['shared_prefix']:,} shared tokens", f"computes only its ~{new} new tokens",
            f"those {new} tokens still attend over all ~{prompt:,} keys",
            f"attention is about {round(attention, 1):.0%} of a", f"nearer {cold / warm:.0f}×",
            f"and {new}-row matmuls",
            f"({S['num_layers']} layers × K and V × {long['shared_prefix']:,} tokens × {S['num_kv_heads']} KV heads × "
            f"{S['head_dim']} × 4 bytes ≈ "
            f"{S['num_layers'] * 2 * long['shared_prefix'] * S['num_kv_heads'] * S['head_dim'] * 4 / 1e6:.0f} MB)",
            f"in {hashlib.sha256().digest_size} bytes", f"it is {sys.hash_info.width} bits")
    budget = EngineConfig().max_num_batched_tokens
    says_in(path, f"than the {budget}-row chunks of the cold", f"every score of a {budget}-token chunk")
    diverge = workload("diverge")
    says_in(path, f"workload shares {diverge['shared_prefix']} tokens, and a block cache reuses "
                  f"{diverge['shared_prefix'] // B * B} of them",
            f"A {2 * B}-token prompt that is entirely cached reuses {(2 * B - 1) // B * B} tokens and recomputes "
            f"{2 * B - (2 * B - 1) // B * B}")
    says_in(path, f"The setting: {run['new_tokens']} new tokens per request, blocks of {B} tokens",
            f"on a shared {_results('step03', 'long')['machine']['cores']}-core machine)")
    shared = figures("step03", "shared_prefix")
    per_round = shared["requests"] // 2
    hits = [round(r * per_round) for r in shared["request_hit_rate_per_round"]]
    says_in(path, f"round 1, {hits[0]} of {per_round} requests hit", f"round 2, {hits[1]} of {per_round}",
            f"reuses the {shared['hf_shared_prefix_tokens']} shared tokens rounded down to "
            f"{shared['hf_shared_prefix_tokens'] // B * B} ({shared['hf_shared_prefix_tokens'] // B} whole blocks)")
    short = prompts("short")
    personas = [_lcp(short[i], short[j]) for i in range(3) for j in range(i + 3, 9, 3)]
    says_in(path, f"each persona shares {min(personas)}–{max(personas)} tokens, and whole blocks cover "
                  f"{min(personas) // B * B} of them",
            f"a perfect token cache's {workload('short')['ideal_hit_rate']:.1%}")
    assert max(personas) // B == min(personas) // B
    probe = micro_benchmarks.__defaults__[0]
    says_in(path, f"hashed {round(probe / 1000)}k-token prompt is {(probe - 1) // B} dict probes")



def test_step04_pages():
    """Chapter 4's README, its units (the tree, the scheduling policies) and its results page: each string is checked
    in the page that states it."""
    from benchmarks.step03.bench import BLOCK_SIZE as B
    from benchmarks.step04.bench import bookkeeping_bench
    from course.workloads import DIVERGE_SHARED_PREFIX
    from step04_radix.policy import FCFS_ABOVE

    path = CHAPTER4
    shared = workload("diverge")["shared_prefix"]
    assert shared == DIVERGE_SHARED_PREFIX
    says_in(path, f"reuse only whole {B}-token blocks", f"cuts every prompt into {B}-token blocks",
            f"Two prompts that share {shared} tokens share {shared // B} full blocks ({shared // B * B} tokens); the "
            f"other {shared % B} are computed again",
            f"share exactly {shared} = {B}·{shared // B} + {shared % B} tokens")
    prefix, new = bookkeeping_bench.__defaults__[:2]
    run = figures("step04", "long")
    assert run["bookkeeping_tokens"] == prefix + new and run["bookkeeping_us_median"] < run["bookkeeping_budget_us"]
    says_in(path, f"Measured on a {prefix + new:,}-token request with a cached {prefix:,}-token prefix",
            f"well under {run['bookkeeping_budget_us'] / 1000:g} ms",
            f"(the tree's work for one {round((prefix + new) / 1000)}k-token request)",
            f"unlock of a {round((prefix + new) / 1000)}k-token request costs", f"`page_size = 1`; a {B}-token")
    says_in(path, f"than {FCFS_ABOVE} requests wait: the queue goes back", f"When more than {FCFS_ABOVE} requests wait",
            f"stops sorting above {FCFS_ABOVE}", f"arrival order above {FCFS_ABOVE}",
            f"the fallback above {FCFS_ABOVE}")
    repeats = re.search(r'"--repeats", type=int, default=(\d+)', (REPO_ROOT / "course" / "bench.py").read_text())[1]
    cores = _results("step04", "multi_doc")["machine"]["cores"]
    says_in(path, f"about a minute on {cores} cores", f"default {repeats}, keeps", f"a shared\n{cores}-core machine")
    radix, hashed = figures("step04", "diverge"), figures("step03", "diverge")
    warm = radix["requests"] - 1
    says_in(path, f"reuse all {radix['cached_tokens'] // warm} shared tokens where chapter 3's {B}-token block hash "
                  f"stops at {hashed['cached_tokens'] // warm}")
    long = workload("long")
    says_in(path, f"every request starts\nwith the same {long['shared_prefix']:,} tokens and the tree caches all of "
                  f"them, hence a bound of {run['speedup_bound']}x")
    rounds = figures("step04", "shared_prefix")
    per_round = rounds["requests"] // 2
    hit = [round(r * per_round) for r in rounds["request_hit_rate_per_round"]]
    assert hit[1] == per_round, "the lesson says round 2 hits every request"
    says_in(path, f"{hit[0]} of {per_round} requests in round 1 hit",
            f"expected {hit[0] / per_round:.0%} / {hit[1] / per_round:.0%}",
            f"a forward of one token over {workload('shared_prefix')['tokens_min'] - 1} cached ones")





def test_step05_pages():
    """Chapter 5's README, its units (the bridge, the host tier) and its results page: each string is checked in the
    page that states it."""
    import inspect

    from benchmarks.step05 import bench as designs_bench
    from course.chat import chat_ids
    from step01_kvcache.demo import DEFAULT_PROMPT, DEFAULT_SYSTEM
    from step02_paged.config import EngineConfig
    from step05_bridge import BridgeKVCacheManager

    path = CHAPTER5
    B = EngineConfig().block_size
    says_in(path, f"allocator ({B} tokens per block by default")
    sizes = sorted({r["block_size"] for r in step06_report.load()["kernels"]["decode"]})
    says_in(path, f"at blocks of {sizes[0]} and of {sizes[-1]} side by side")
    m = 125  # the lesson's example: a match that ends at token 125
    says_in(path, f"returns {m // B} blocks, {m // B * B} tokens; tokens {m // B * B}..{m - 1} are routed",
         f"tokens {m // B * B}..{m - 1} sit in the first {m - m // B * B} slots of a block whose last "
         f"{B - m % B} slots hold the *other* branch's tokens {m}..{(m // B + 1) * B - 1}",
         f"diverges at {m} must write its own tokens {m}..{(m // B + 1) * B - 1}", f"(copy the {m - m // B * B} slots")
    first, second, part = 48, 32, 20  # the textbook's example, as the lesson gives it
    cut = part // B * B  # the textbook cuts the upper node back to a block boundary
    says_in(path, f"reuses block 100 ({cut} tokens) and computes its tokens {cut}–{second - 1} into a block of its own",
         f"block 101 (tokens {cut}–{2 * B - 1} of the first prompt)",
         f"| tokens 0–{cut - 1}, block 100 | tokens 0–{part - 1}, block 100 |",
         f"| tokens {part}–{first - 1}, blocks 101, 102, `offset = {part % B}` | "
         f"tokens {part}–{first - 1}, blocks 101, 102 |",
         f"| tokens {cut}–{second - 1}, block 200 | tokens {part}–{second - 1}, block 200 |",
         f"from token {cut}. The first", f"slot {part % B} of block 101", f"keeps all {part} shared tokens",
         f"Tokens {cut}–{part - 1} of the first prompt are on no edge",
         f"reads tokens 0–{cut - 1}, then {part}–{first - 1}",
         f"the same token {cut}),", f"after {part % B} tokens, and reuses {cut} tokens",
         f"reuses all {first}.", f"prompt's token {part} and the second prompt's token {cut}",
         f"(tokens {cut}–{part - 1} are matched", f"reusing tokens {cut}–{part - 1} takes")
    from step05_bridge.pictures import offset_split_dot  # the textbook's design built: the same example, drawn

    drawn = offset_split_dot()
    assert drawn.count(f"offset {part % B}: own tokens from {part}") == 2 and "<TD>200</TD>" in drawn
    says_in(path, f"request 1 ({first} tokens) is cached in blocks 100, 101 and 102; request 2 shares its first {part}",
         f"Its match returns block 100 ({cut} tokens) and offset {part % B}",
         f"the first prompt's branch blocks 101 and 102 with offset {part % B}, and the second prompt's branch block "
         f"200, from token {cut}", f"branch starts at token {part} and tokens {cut}–{part - 1} are on no edge",
         "the upper node holds block 100", "But block 101 holds their K/V", "whoever reuses block 101")
    least = inspect.signature(BridgeKVCacheManager.__init__).parameters["min_load_tokens"].default
    says_in(path, f"({least} by default): a shorter span")
    bf16 = kv_bytes(2)
    outside = _params() - S["vocab_size"] * S["hidden_size"]  # the embedding is a lookup, not a matmul
    flops = 2 * outside
    says_in(path, f"| SmolLM2-135M ({S['num_layers']} layers, {S['num_kv_heads']} KV heads × {S['head_dim']}; "
               f"{outside / 1e8:.2f} × 10⁸ parameters outside the embedding) | {bf16:,} | "
               f"≈ {flops / 1e8:.1f} × 10⁸ | "
               f"≈ {round(flops / bf16, -2):,.0f} |", f"(2 × {outside / 1e8:.2f} × 10⁸ FLOPs per token)")
    llama = 2 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336)  # a Llama-3-8B layer: Q, O, K, V, the MLP
    assert llama / 4096 > 10 * flops / bf16, "the lesson says: more than ten times SmolLM2's FLOPs per byte"
    run = figures("step05", "long")
    designs = figures("step05", "designs")
    bench_source = (REPO_ROOT / "benchmarks" / "step05" / "bench.py").read_text()
    sizes = designs["block_sizes"]
    toy_layers = re.search(r"num_layers=(\d+)", bench_source)[1]
    says_in(path, f"engine ({run['block_size']}-token blocks) with its cache off",
         f"({run['new_tokens']} new tokens per request)",
         f"(a {toy_layers}-layer toy model",
         f"at block sizes {', '.join(map(str, sizes[:-1]))} and {sizes[-1]}",
         f"median of {designs_bench.compare.__defaults__[0]} passes")
    rounds = figures("step05", "shared_prefix")["request_hit_rate_per_round"]
    says_in(path, f"request-level hits {rounds[0]:.0%} in round 1", f"and {rounds[1]:.0%} in round 2")
    long = workload("long")
    prompt, new = _warm_long(run["block_size"])
    cached = long["shared_prefix"] // run["block_size"] * run["block_size"]
    token = figures("step04", "long")["speedup_bound"]  # chapter 4's tree caches every shared token
    says_in(path, f"every request starts with the same {long['shared_prefix']:,} tokens, and the bridge caches the "
                  f"{cached:,} of them that fill whole {run['block_size']}-token blocks",
            f"and {long['requests']} questions", f"A warm request computes ~{new} tokens instead of ~{prompt:,}",
            f"toward a bound of {run['speedup_bound']}x (prompt /",
            f"against {token}x for chapter 4's tree, which caches all {long['shared_prefix']:,}",
            f"{new} tokens through every matmul and attention over {cached:,} cached keys")
    row = next(d for d in designs["designs"] if d["workload"] == "diverge")
    hits = {bs: row[f"bridge bs={bs}"]["cached_tokens"] // (workload("diverge")["requests"] - 1) for bs in sizes}
    assert all(row[f"bridge bs={bs}"]["cached_tokens"] == row[f"hash bs={bs}"]["cached_tokens"] for bs in sizes)
    says_in(path, f"({workload('diverge')['shared_prefix']} shared tokens) {sizes[0]}-token blocks stop at "
               f"{hits[sizes[0]]}, {sizes[1]}-token blocks at {hits[sizes[1]]}, and {sizes[2]}-token blocks reach all "
               f"{hits[sizes[2]]}", f"At {sizes[0]}-token blocks its bookkeeping is above the hash's",
         f"At {sizes[-1]}-token blocks it beats the hash")
    for d in designs["designs"]:
        cost = {(name, bs): d[f"{name} bs={bs}"]["bookkeeping_us"] for name in ("bridge", "hash") for bs in sizes}
        assert cost["bridge", sizes[0]] > cost["hash", sizes[0]], f"{d['workload']}: the hash is dearer at 16"
        assert cost["bridge", sizes[-1]] < cost["hash", sizes[-1]], f"{d['workload']}: the bridge is dearer at 1"
    asked = len(chat_ids(_tokenizer(), DEFAULT_PROMPT, DEFAULT_SYSTEM))
    says_in(path, f"(the second time {(asked - 1) // B * B} of {asked} prompt tokens come from the")
    spec_test = (REPO_ROOT / "tests" / "step05" / "test_speculative.py").read_text()
    cases = re.search(r'parametrize\("block_size,num_blocks", \[(.*?)\]', spec_test)[1]
    spec_sizes = sorted({int(b) for b, _ in re.findall(r"\((\d+), (\d+)\)", cases)})
    says_in(path, f"runs the engine at block sizes {' and '.join(map(str, spec_sizes))}")



def test_step05_offset_unit():
    """The mini-runtime textbook's tree beside the hash and the bridge: the engines on SmolLM2
    (results/designs_engine.json) and the model-free designs bench (results/designs.json)."""
    path = "step05_bridge/03_offset_tree.md"
    engines, designs = figures("step05", "designs_engine"), figures("step05", "designs")
    B, trio = engines["block_size"], ("hash", "bridge", "offset")
    run = {r["workload"]: r for r in engines["designs"]}
    free = {r["workload"]: r for r in designs["designs"]}
    for w, row in run.items():
        assert len({row[d]["prompt_tokens_computed"] for d in trio}) == 1, f"{w}: the designs computed different tokens"
        assert all(row[d]["outputs_identical"] for d in trio), f"{w}: cache on differs from cache off"
        assert row["bridge"]["peak_blocks"] == row["offset"]["peak_blocks"] <= row["hash"]["peak_blocks"], w
    for w, row in free.items():
        for bs in designs["block_sizes"]:
            assert len({row[f"{d} bs={bs}"]["cached_blocks"] for d in trio}) == 1, f"{w}, {bs}: different blocks"
            assert row[f"offset bs={bs}"]["bookkeeping_us"] > row[f"bridge bs={bs}"]["bookkeeping_us"], (w, bs)
    long, diverge = run["long"], run["diverge"]
    says(path, f": {long['offset']['prompt_tokens_computed']:,} of {long['prompt_tokens']:,})",
         f"the same blocks ({free['long'][f'offset bs={B}']['cached_blocks']} on `long`)")
    shared = workload("diverge")["shared_prefix"]
    warm = workload("diverge")["requests"] - 1
    offsets = {w: free[w][f"offset bs={B}"]["offset_tokens"] for w in ("short", "diverge")}
    assert offsets["diverge"] == warm * (shared % B), "each warm `diverge` request re-prefills the shared part-block"
    says(path, f"The offsets add up to {offsets['short']} tokens over", f"and {offsets['diverge']} on",
         f"({warm} warm requests × {shared % B})")
    says(path, f"a peak of {long['bridge']['peak_blocks']} blocks instead of {long['hash']['peak_blocks']} on `long`, "
               f"{diverge['bridge']['peak_blocks']} instead of {diverge['hash']['peak_blocks']} on `diverge`")
    one = min(designs["block_sizes"])
    book = {(d, bs): free["long"][f"{d} bs={bs}"]["bookkeeping_us"] for d in trio for bs in (B, one)}
    assert 0.7 < book["offset", one] / book["hash", one] < 1.3, "the lesson says: near the hash's"
    warm = [long[d]["ttft_on_warm_median_s"] * 1e3 for d in trio]
    turns = run["multi_turn"]
    assert turns["hash"]["ttft_off_warm_median_s"] > max(turns[d]["ttft_off_warm_median_s"] for d in trio[1:]), \
        "the lesson says the hash's multi_turn run was slower with its cache off too"
    says(path, f"({min(warm):.0f}–{max(warm):.0f} ms on `long`)")
    says(path, f"on `long` at {B}-token blocks, {book['offset', B]:,} µs per warm request against the bridge's "
               f"{book['bridge', B]:,} and the hash's {book['hash', B]:,}; at {one}-token blocks, "
               f"{book['offset', one]:,} µs, near the hash's {book['hash', one]:,}")


# ---------------------------------------------------------------- chapter 6: the H200


def _decode_row(heads: str, ragged: bool, block: int, batch: int | None = None) -> dict:
    return next(r for r in step06_report.load()["kernels"]["decode"] if r["heads"] == heads and r["ragged"] == ragged
                and r["block_size"] == block and (batch is None or r["batch"] == batch))


def _pct(x: float) -> str:
    return f"{x:.0%}"


def test_step06_theory():
    import torch

    from benchmarks.step06.kernels import HEADS, RAGGED, UNIFORM_SHAPES
    from step06_triton import cascade as cascade_kernels
    from step06_triton import cascade_policy, cuda_graph, decode_attention, extend_attention
    from step06_triton.cascade import CascadeGrid

    path = CHAPTER6
    kernels = step06_report.load()["kernels"]
    sms = kernels["machine"]["sms"]
    hq, hkv, _ = HEADS["32/8x128"]
    bf16 = torch.bfloat16.itemsize
    says_in(path,
            f"In bf16 ({bf16} bytes) that is", f"{hq // hkv} FLOP/byte for a Llama-3-8B layer ({hq} / {hkv} heads), "
               f"{S['num_heads'] // S['num_kv_heads']} for SmolLM2 ({S['num_heads']} / {S['num_kv_heads']})",
         f"the H200 has {sms}, each", f"({S['num_heads']} query / {S['num_kv_heads']} KV heads)",
         f"{hq} / {hkv} heads on {sms} SMs", f"on {sms} SMs? Why does", f"{S['num_heads']} query heads, "
         f"{extend_attention.SHORT_CHUNK_TILE[0]}-row query blocks")
    copies = [r["copy_tb_s"] for r in kernels["decode"]] + [kernels["ceilings"]["copy_tb_s"]]
    ridge = kernels["ceilings"]["matmul_tflop_s"] / max(copies)
    says_in(path, f"puts the ridge above {int(ridge // 50 * 50)} FLOP/byte")
    tile = decode_attention.DECODE_TILE[S["head_dim"]][0]
    says_in(path, "(padded to 16, the smallest", f"tiles of {tile} tokens, loads")  # tl.dot's smallest M: 16
    sizes = sorted({r["block_size"] for r in kernels["decode"]})
    says_in(path, f"the bench measures blocks of {sizes[-1]} and of {sizes[0]}")
    long_uniform = next(r for r in kernels["decode"] if r["context"] == max(c for _, c in UNIFORM_SHAPES))
    says_in(path, f"A batch of {long_uniform['batch']} long sequences with {long_uniform['hkv']} KV heads is "
               f"{long_uniform['batch'] * long_uniform['hkv']} programs for {sms} SMs",
         f"walks {long_uniform['context'] // 1024}k tokens")
    fill = decode_attention.FILL_PER_SM
    assert decode_attention.PROGRAMS_PER_SM == 16, "the lesson says about sixteen programs per SM"
    uniform = _decode_row("32/8x128", False, 16, 64)
    says_in(path, f"enough to keep {fill} programs per SM",
         f"{uniform['batch']} contexts of {uniform['context']:,} tokens "
               f"with {uniform['hkv']} KV heads are {uniform['programs']} programs",
         f"` = {fill * sms // uniform['programs']} split each (the floor: {uniform['programs']} programs come close "
         f"enough to {fill * sms})",
         f"Draw {RAGGED['batch']} contexts from 1..{RAGGED['max_context']:,} tokens: still "
         f"{RAGGED['batch'] * hkv}", f"ranges from 1 to {RAGGED['max_context']:,} tokens",
         f"({RAGGED['batch']} contexts from 1..{RAGGED['max_context']:,} tokens",
         f"the uniform {uniform['batch']} × {uniform['context']:,} batch?")
    assert uniform["programs"] == RAGGED["batch"] * hkv == uniform["batch"] * uniform["hkv"]
    splits = long_uniform["splits_per_sequence"][0]
    says_in(path, f"too few to fill the GPU ({long_uniform['batch']}\nsequences of {long_uniform['context'] // 1024}k "
               f"tokens become {splits} splits each; {uniform['batch']} of {uniform['context'] // 1024}k stay whole",
         f"`min_split_len` ({decode_attention.MIN_SPLIT_LEN} tokens)")
    short = step06_report.load()["short"]
    best = {}
    for r in short["rows"]:  # each floor's best tile, per head shape
        best[r["heads"], r["min_split_len"]] = min(best.get((r["heads"], r["min_split_len"]), float("inf")), r["us"])
    floor = decode_attention.MIN_SPLIT_LEN
    from benchmarks.step06.kernels import SHORT
    says_in(path, f"({short['lengths']['batch']} contexts of {SHORT['low']} to {short['lengths']['max']:,} tokens",
         f"takes {best['9/3x64', floor]:.1f} µs with\nSmolLM2's heads where a floor of 256 tokens would take "
         f"{best['9/3x64', 256]:.1f} and one of 32 takes {best['9/3x64', 32]:.1f}, and "
         f"{best['32/8x128', floor]:.1f} µs with 32 / 8\nheads where 256 takes {best['32/8x128', 256]:.1f}",
         f"the floor stays at {floor}")
    assert best["32/8x128", floor] == min(v for (h, _), v in best.items() if h == "32/8x128"), "the best on 32 / 8"
    assert 0.05 < 1 - best["9/3x64", 256] / best["9/3x64", floor] < 0.15, "a tenth off the best on SmolLM2"
    first, prompt = _first_warm_long()
    cached = first - prompt
    says_in(path, f"computes {prompt} tokens after {cached:,}\ncached ones: one query block per head, {S['num_heads']} "
               f"programs for SmolLM2 on {sms} SMs, each walking {first:,} keys",
         f"fewer\nthan {extend_attention.FILL_PER_SM} programs per SM", f"(no shorter than "
         f"{extend_attention.MIN_SPLIT_LEN}\ntokens, at most {extend_attention.MAX_SPLITS})",
         f"computes {prompt} tokens after {cached:,} cached ones. How many programs",
         "why is a\nchunk of 8,192 tokens")
    ragged16 = _decode_row("32/8x128", True, 16)
    says_in(path, f"SmolLM2's graphs serve contexts up to {S['max_position_embeddings']:,} tokens",
         f"For\na step of {RAGGED['batch']} sequences whose longest context is 300 tokens",
         f"(longest context {ragged16['context']:,} tokens)")
    shared = _cascade()["engine_smollm2"]["shared_system"]
    says_in(path, f"{shared['requests']} requests behind one system prompt compute",
         f"{shared['requests']} requests behind {shared['system_tokens'][0]:,} shared tokens read those tokens' K/V "
         f"{shared['requests']} times")
    row = _cascade()["attention"]["smollm2_135m"]
    batch, (prefix,), own = row["batch"], row["prefixes"], row["own_tokens"]
    mean_own = sum(own) / 2  # the bench draws each sequence's own tokens uniformly from that range
    says_in(path, f"With {batch} sequences behind {prefix:,} shared tokens and {own[0]}-{own[1]} tokens of their own, "
               f"plain decode reads about\n{batch * (prefix + mean_own) / 1e6:.2f} M tokens' K/V",
         f"cascade about {(prefix + batch * mean_own) / 1e3:.0f} k")
    says_in(path, f"decode rows ({cascade_policy.MIN_SEQS}) sharing", f"tokens ({cascade_policy.MIN_TOKENS}, vLLM's "
         "threshold)")
    group = S["num_heads"] // S["num_kv_heads"]
    buckets = decode_attention.split_buckets(S["max_position_embeddings"])
    kv, one_axis, axis = S["num_kv_heads"], buckets[-1], row["graph_suffix_splits"]
    grid = CascadeGrid.for_batch(batch, group, cascade_policy.MIN_SEQS, S["head_dim"], splits=one_axis)
    assert grid.prefix_splits == cascade_kernels.MAX_PREFIX_SPLITS
    assert axis == decode_attention.split_bucket(buckets, own[1])
    big = _cascade()["attention"]["llama_3_2_1b"]
    says_in(path, f"tiles for any groups of {cascade_policy.MIN_SEQS} or more rows, {grid.prefix_splits} prefix splits",
         f"At {batch}\nrows of SmolLM2's heads a captured step launches {kv} × {grid.tiles} tiles × "
         f"{grid.prefix_splits} splits = {kv * grid.tiles * grid.prefix_splits:,} prefix programs",
         f"needs {kv} × {row['tiles']} × {row['prefix_splits'][0]} = {kv * row['tiles'] * row['prefix_splits'][0]:,}",
         f"sized for the longest context a graph serves ({one_axis} splits for {S['max_position_embeddings']:,} "
         f"tokens), it launched {kv} × {batch} × {one_axis} = {kv * batch * one_axis:,} programs where {kv * batch} do "
         f"the work", f"the step took {row['cascade_one_axis_us']} µs against the eager plan's {row['cascade_us']}",
         f"(`split_buckets`: {', '.join(map(str, buckets[:-1]))} and {one_axis} splits here",
         f"suffixes of {own[0]}-{own[1]} tokens take the axis of {axis} split, {kv} × {batch} × {axis} = "
         f"{kv * batch * axis:,} programs", f"the captured step takes {row['cascade_graph_grid_us']} µs (the 1B heads: "
         f"{big['cascade_graph_grid_us']} against {big['cascade_one_axis_us']} on the single axis and "
         f"{big['cascade_us']} eager)")
    engine = engine_report.load()["smollm2_135m"]["random"]["decode"]
    says_in(path, f"SmolLM2 with {engine['batch']} sequences is")
    says_in(path,
            f"SmolLM2-135M's decode step moves about {(engine['weight_bytes'] + engine['kv_bytes']) / 1e9:.1f} GB "
               f"(its {engine['weight_bytes'] / 1e6:.0f} MB of weights",
         f"that is about {engine['floor_us'] / 1e3:.1f} ms")
    assert engine["weight_bytes"] == 2 * _params()
    sizes = cuda_graph.EXTEND_SIZES
    says_in(path, f"padded to {sizes[0]}, {sizes[1]}, … {sizes[4]} tokens")
    says_in(path,
            f"SmolLM2 ({S['num_kv_heads']} KV heads of {S['head_dim']} dimensions, {S['num_layers']} layers, bf16)")
    system = re.search(r"system = ids\((\d+)\)", (REPO_ROOT / "benchmarks" / "step06" / "engine.py").read_text())[1]
    says_in(path, f"requests share a\n{int(system):,}-token system prompt")


def _first_warm_long(block: int = 16) -> tuple[int, int]:
    """`long`'s first warm request, as chapter 6's GPU bench runs it: (its prompt tokens, the tokens it computes)."""
    from benchmarks.step06.engine import workload as gpu_workload

    every, _ = gpu_workload("long", S["vocab_size"])
    shared = next(i for i, (x, y) in enumerate(zip(every[0], every[1])) if x != y)
    return len(every[1]), len(every[1]) - shared // block * block


def _cascade() -> dict:
    return json.loads((REPO_ROOT / "step06_triton" / "results" / "h200_cascade.json").read_text())


def test_step06_measured():
    from benchmarks.step06.kernels import PREFILL_SHAPE
    from step06_triton import extend_attention

    path = CHAPTER6
    kernels = step06_report.load()["kernels"]
    tests = (REPO_ROOT / "step06_triton" / "results" / "h200_pytest.txt").read_text().strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", tests)[1]
    says_in(path, f"): {passed} passed — graph replays")
    assert "failed" not in tests, "the lesson says none failed"
    uniform, ragged = _decode_row("32/8x128", False, 16, 64), _decode_row("32/8x128", True, 16)
    long = _decode_row("32/8x128", False, 16, 8)
    small = _decode_row("9/3x64", True, 16)
    small_mb = small["total_tokens"] * small["hkv"] * small["d"] * 2 * 2 / 1e6  # K and V in bf16
    says_in(path, f"its fastest device copy: {step06_report.fastest_copy(step06_report.load())} TB/s in the")
    says_in(path, f"noisy in this run: {kernels['ceilings']['copy_tb_s']:.1f} TB/s for the\n1-GiB",
         f"{ragged['copy_tb_s']:.1f} TB/s for the {long['batch']} × {long['context'] // 1024}k and ragged Llama rows",
         f"moves only ~{round(small_mb, -1):.0f} MB",
         f"reaches {small['copy_tb_s']:.1f} TB/s, and the kernel ({small['triton_tb_s']:.1f}) moves about as much")
    assert abs(uniform["copy_tb_s"] - kernels["ceilings"]["copy_tb_s"]) < 0.05, \
        "the lesson says the uniform rows' copies read as the 1-GiB copy does"
    goals = {g["goal"]: g for g in kernels["goals"]}
    small_target = next(g for name, g in goals.items() if name.startswith("decode ragged 9/3x64"))
    big_target = next(g for name, g in goals.items() if name.startswith("decode ragged 32/8x128"))
    target = lambda g: float(re.search(r">= ([\d.]+) TB/s", g["goal"])[1])  # noqa: E731
    says_in(path,
            f"its target of\n{target(small_target)} TB/s is missed", f"the target\nof {target(small_target)} TB/s "
         "is above")
    says_in(path, f"no paging at all ({uniform['contiguous_sdpa_tb_s']:.1f} TB/s)",
         f"falls far behind at {long['batch']} × {long['context'] // 1024}k",
         f"({long['batch']} × {long['context'] // 1024}k gets {long['splits_per_sequence'][0]} splits per sequence)")
    block16 = [r for r in kernels["decode"] if not r["ragged"] and r["block_size"] == 16]
    block1 = [r for r in kernels["decode"] if not r["ragged"] and r["block_size"] == 1 and r["batch"] != 256]
    worst16 = max(1 - r["triton_tb_s"] / r["first_version_tb_s"] for r in block16)
    above = [r for r in block16 if r["triton_tb_s"] > r["first_version_tb_s"]]
    lost = sorted(1 - r["triton_tb_s"] / r["first_version_tb_s"] for r in block1)
    assert len(above) == 1, "the lesson names one row above the first version"
    says_in(path,
            f"blocks of 16 are within {worst16:.0%} of it ({above[0]['batch']} × {above[0]['context']:,} above it)",
         f"Blocks of 1 lose {lost[0]:.0%}-{lost[-1]:.0%} against".replace("%-", "-"),
         f"at {uniform['batch']} × {uniform['context']:,} and {long['batch']} × {long['context'] // 1024}k "
         "(the target")
    ragged1 = _decode_row("32/8x128", True, 1)
    from benchmarks.step06.kernels import GRAPH_CONTEXT
    from step06_triton.decode_attention import split_bucket, split_buckets
    one_axis_splits, one_axis_tb_s = ragged["graph_grid_splits"], ragged["triton_graph_grid_tb_s"]
    bucket = split_bucket(split_buckets(GRAPH_CONTEXT), ragged["context"])
    assert bucket == ragged["max_splits"], "the lesson says the captured step replays the eager launch"
    says_in(path, f"to {ragged['triton_tb_s']} with blocks of 16 and {ragged1['triton_tb_s']} with blocks of 1, at "
                  "three times")
    says_in(path, f"lifts the {ragged['hq']}/{ragged['hkv']} × {ragged['d']} layer from "
               f"{ragged['triton_first_rule_tb_s']} TB/s",
         f"to {ragged['triton_tb_s']} with blocks of 16 and {ragged1['triton_tb_s']} with blocks of 1 — "
               f"{1 - ragged['triton_tb_s'] / target(big_target):.1%} under and just over the target\nof "
               f"{target(big_target)}",
         f"contexts up to\n{GRAPH_CONTEXT // 1024}k tokens ({one_axis_splits} split programs",
         f"it moves {one_axis_tb_s:.2f}:", f"for this\nbatch that is {bucket} splits, the very launch",
         f"The SmolLM2 layer ({small['hq']}/{small['hkv']} × {small['d']}) moves {small['triton_tb_s']:.2f}, from "
         f"{small['triton_first_rule_tb_s']:.2f} under the first rule",
         f"~{round(small_mb, -1):.0f} MB moves {small['copy_tb_s']:.2f}")
    assert ragged1["triton_tb_s"] > target(big_target) > ragged["triton_tb_s"]
    prefill, flex = kernels["prefill"], kernels["prefill"]["flex"]["tflop_s"]
    assert (prefill["batch"], prefill["prefix"], prefill["new"]) == PREFILL_SHAPE
    long_tile, short_tile = extend_attention.LONG_CHUNK_TILE, extend_attention.SHORT_CHUNK_TILE
    says_in(path, f"at ({prefill['batch']}, {prefill['prefix']:,}, {prefill['new']:,}) the kernel moves "
               f"{prefill['triton_tflop_s']} TFLOP/s against FlexAttention's {flex}",
         f"ahead by\n{prefill['triton_tflop_s'] / flex - 1:.1%}",
         f"({long_tile[0]} × {long_tile[1]} on {long_tile[2]} warps for long chunks, "
         f"{short_tile[0]} × {short_tile[1]} for\nshort)",
         f"taken on the {short_tile[0]} × {short_tile[1]} tile", f"the {long_tile[0]}-row tile is")
    ncu = (REPO_ROOT / "step06_triton" / "results" / "h200_ncu_prefill.txt").read_text()
    busy = [float(x) for x in re.findall(r"SM Busy\s+%\s+([\d.]+)", ncu)]
    warps = {int(x) for x in re.findall(r"Theoretical Active Warps per SM\s+warp\s+(\d+)", ncu)}
    says_in(path, f"both kernels at {warps.pop()} warps per SM and the SM ~{round(min(busy), -1):.0f}% busy")
    rp = kernels["ragged_prefill"]
    says_in(path, f"({rp['batch']} chunks of {min(rp['news'])}..{max(rp['news'])} tokens after prefixes up to "
               f"{max(rp['prefixes']):,})", f"keep the {short_tile[0]} × {short_tile[1]} tile, {rp['triton_tflop_s']} "
               f"against FlexAttention's {rp['flex']['tflop_s']}")
    e = engine_report.load()
    small_e, big_e = e["smollm2_135m"], e["llama_3_2_1b"]
    busy = sorted(m[w]["decode"]["overlap"]["gpu_busy_fraction"] for m in (small_e, big_e)
                  for w in ("random", "shared_system") if w in m)
    idle = 1 - small_e["random"]["decode"]["sync"]["gpu_busy_fraction"]
    long_run, dec = small_e["long"], small_e["random"]["decode"]
    goals = {g["goal"]: g for g in e["goals"]}
    ratio = next(g for name, g in goals.items() if name.startswith("smollm2_135m random: engine >="))
    cold = next(g for name, g in goals.items() if "cold TTFT" in name)
    warm = next(g for name, g in goals.items() if "warm TTFT" in name)
    number = lambda goal: re.search(r"([\d.]+)(?: ms|x HF)", goal["goal"])[1]  # noqa: E731
    profile = {row["function"].split("(")[-1].rstrip(")"): row for row in long_run["host_profile"]["functions"]}
    products = [us / n for name, n, us in dec["kernel_profile"] if name.startswith("nvjet") and n >= 30]
    from benchmarks.step06.engine import cold_ms, floor_us, warm_split
    from benchmarks.step06.report import fastest_copy, load
    says_in(path, f"the overlapped engine makes {small_e['random']['engine_overlap']['ratio_vs_hf_static']}x Hugging",
         f"(against a target of {float(number(ratio)):g}x: {'met' if ratio['met'] else 'missed'})",
         f"{big_e['random']['engine_overlap']['ratio_vs_hf_static']}x on the 1B shape and "
         f"{small_e['shared_system']['engine_overlap']['ratio_vs_hf_static']}x where "
         f"{small_e['shared_system']['requests']} requests share a", f"its GPU is busy {busy[0]:.0%}-{busy[-1]:.0%} "
         f"of the decode phase".replace("%-", "-"), f"idle {idle:.0%}.",
         f"A decode step of SmolLM2 at {dec['batch']} sequences is {dec['kernels_per_step']} kernels, "
         f"{dec['kernels_per_layer']} per layer",
         f"and {dec['gpu_us_per_step'] / 1e3:.1f} ms of GPU against a {floor_us(dec, fastest_copy(load())) / 1e3:.1f} "
         "ms floor",
         f"its attention takes {dec['kernel_profile'][0][2] / dec['kernel_profile'][0][1]:.0f} µs a layer and each of "
         f"its matrix products {min(products):.1f} to\n{max(products):.1f} µs at {dec['batch']} rows",
         f"a cold request takes {cold_ms(long_run['cache_on'])} ms (target {number(cold)}: "
         f"{'met' if cold['met'] else 'missed'})", f"a warm one {long_run['cache_on']['warm_median_ms']} ms (target "
         f"{number(warm)}: {'met' if warm['met'] else 'missed'})",
         f"{warm_split(long_run)[0] / 1e3:.2f} ms of GPU",
         f"{warm_split(long_run)[1] / 1e3:.2f} ms of host work",
         f"(`tolist`, {next(r for k, r in profile.items() if 'tolist' in k)['own_us'] / 1e3:.2f} ms a request",
         f"({profile['replay']['own_us'] / 1e3:.2f} ms for a graph",
         f"the radix tree's match ({profile['common_prefix_len']['own_us'] / 1e3:.2f} ms)",
         f"`ForwardBatch` ({profile['build']['own_us'] / 1e3:.2f} ms)")


def test_step06_fp8():
    """The FP8 cache: e4m3's arithmetic from torch.float8_e4m3fn, the pools' bytes and the accuracy run
    (results/fp8.json), the kernels' code, and what the H200 measured (results/h200_fp8.json)."""
    import inspect
    import math
    import tomllib

    import torch

    from benchmarks.step06.fp8_report import REQUESTS_OF
    from step06_triton import decode_attention
    from step06_triton.fp8_pool import FP8_MAX, KVScales, token_scales
    from step06_triton.pictures import fp8_block_dot
    from step06_triton.store_kvcache import scale_layout

    path = CHAPTER6
    nan = [b for b in range(256) if torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).isnan().item()]
    says_in(path, "(S.1111.111: two encodings, " + " and ".join(f"0x{b:02X}" for b in nan) + ")")
    e4m3 = torch.finfo(torch.float8_e4m3fn)
    mantissa = round(-math.log2(e4m3.eps))
    exponent = e4m3.bits - 1 - mantissa
    low, high = round(math.log2(e4m3.smallest_normal)), math.floor(math.log2(e4m3.max))  # the normals' exponents
    step = torch.tensor([1], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()  # the smallest subnormal
    largest = f"{FP8_MAX:.0f}"
    assert e4m3.max == FP8_MAX and high - low + 1 == 15, "the lesson says fifteen powers of two"
    says_in(path, f"a float of {e4m3.bits - exponent - mantissa} sign bit, {exponent} exponent bits (bias {1 - low}) "
               f"and {mantissa} mantissa bits",
         f"largest is {e4m3.max / 2 ** high:g} · 2^{high} = {largest}. Normal values run from 2^{low} to {largest}; "
         f"below 2^{low} the subnormals keep a fixed step of 2^{round(math.log2(step))}",
         f"Between two powers of two there are {2 ** mantissa} values, so a normal value is stored within half a "
         f"step: within 1/{2 ** (mantissa + 1)} of itself", f"That is why an {e4m3.bits}-bit *float*",
         f"e4m3 keeps every value within 1/{2 ** (mantissa + 1)} of itself", f"e4m3's 1/{2 ** (mantissa + 1)} suggests",
         f"saturated at ±{largest}, and reads", f"s = max |row| / {largest} at the moment",
         f"element is stored as {largest} exactly", f"largest value at {largest} and store it exactly",
         f"one more binade ({largest})", f"below {e4m3.bits} bits: K per channel")
    # the scales' bytes, from the pools' `bytes_per_block` as the accuracy run recorded them
    run = figures("step06", "fp8")
    small, llama = run["capacity"]["smollm2_135m"], run["capacity"]["llama_3_8b"]
    assert [small[k] for k in ("layers", "kv_heads", "head_dim")] == [S[k] for k in ("num_layers", "num_kv_heads",
                                                                                    "head_dim")]
    fp32, bf16, block = torch.float32.itemsize, torch.bfloat16.itemsize, run["block_size"]
    pools = {name: {pool: p["bytes_per_block"] for pool, p in m["pools"].items()}
             for name, m in run["capacity"].items()}
    share = {}  # the scales' bytes over the fp8 elements' bytes
    for name, m in run["capacity"].items():
        token, static = pools[name]["fp8, scales per token and head"], pools[name]["fp8, static scales"]
        assert token - static == m["layers"] * 2 * block * m["kv_heads"] * fp32, "one fp32 scale per head row"
        share[name] = (token - static) / static
    d, big = small["head_dim"], llama["head_dim"]
    says_in(path, f"one fp32 per head row: {fp32} bytes per {d} (SmolLM2, {share['smollm2_135m']:.2%}) or per {big} "
               f"(Llama, {share['llama_3_8b']:.1%})",
         f"It pays {share['smollm2_135m']:.2%} of the fp8 bytes at head_dim {d} ({share['llama_3_8b']:.1%} at {big}): "
         f"{pools['smollm2_135m']['bf16'] / pools['smollm2_135m']['fp8, scales per token and head']:.2f}x the blocks "
         f"of bf16 in the same bytes rather than "
         f"{pools['smollm2_135m']['bf16'] / pools['smollm2_135m']['fp8, static scales']:.0f}x.",
         f"trade {share['llama_3_8b']:.0%}-{share['smollm2_135m']:.0%} of the bytes".replace("%-", "-"),
         f"for {share['smollm2_135m']:.0%} more bytes than per-layer scales",
         f"Decode reads {d + fp32} bytes per head row instead of {d * bf16} at head_dim {d} ({big + fp32} instead of "
         f"{big * bf16} at {big})")
    per_requests, gib = REQUESTS_OF["smollm2_135m"]
    says_in(path, f"For SmolLM2 ({small['layers']} layers, {small['kv_heads']} KV heads of {d}) in blocks of {block},",
         f"fit in {gib} GiB, and how many requests of {per_requests:,} tokens?",
         f"layout ({llama['layers']} layers, {llama['kv_heads']} KV heads of {big})")
    # where the scales come from, and what the real model loses
    one = inspect.signature(KVScales.uniform).parameters["value"].default
    calibration = run["calibration"]["workload"]
    variants, target = run["variants"], run["target_perplexity_change"]
    kept = "fp8, per token and head (dynamic)"
    assert f"fp8, per layer, {one} (uncalibrated)" in variants
    assert min(variants, key=lambda v: variants[v]["perplexity_change"]) == kept
    inside = {v for v in variants if variants[v]["perplexity_change"] <= target}
    assert inside == {kept, "fp8, per layer and head (calibrated)"}, "the lesson names the two inside the target"
    says_in(path, f"`KVScales.uniform(layers)` for {one})", f"(scale {one} is this case)",
         f"`{calibration}`](../WORKLOADS.md#{calibration}) workload's {workload(calibration)['requests']} prompts",
         f"one of the two inside the {target:.0%} perplexity target",
         f"stays within the {target:.0%} perplexity target without calibration data")
    figure = inspect.signature(fp8_block_dot).parameters
    assert figure["cfg"].default is None, "the figure draws SmolLM2's shape"
    says_in(path, f"one layer of one {figure['block_size'].default}-token block to scale. In fp8 each head row of {d} "
               "one-byte values")
    says("notebooks/06_triton.ipynb", f"its largest value becomes {largest} exactly, the others land within "
         f"1/{2 ** (mantissa + 1)} of themselves",
         f"each head row of {d} one-byte values carries its {fp32}-byte scale")
    assert big == 2 * d, "the lesson says twice as many"
    says_in(path,
            f"SmolLM2 attends with {S['num_kv_heads']} KV heads of {d} over {S['num_layers']} layers: a score is a "
               f"dot product of {d} rounded values (a large model's heads of {big} average",
         f"expect a {_params() / 1e6:.0f}M model")
    # the kernels
    cache = torch.empty(2, 4, 3, 8, dtype=torch.float8_e4m3fn)  # [blocks, block_size, H_kv, D]
    per_token, per_head, per_layer = (scale_layout(cache, torch.empty(shape)) for shape in ((2, 4, 3), (3,), (1,)))
    assert per_token[0] == cache.shape[2], "per token and head, a slot's scales are H_kv apart"
    says_in(path, f"({mantissa} mantissa bits fit in fp16's {round(-math.log2(torch.finfo(torch.float16).eps))}",
         f"strides (H_kv, {per_token[1]}) per token and head, {per_head} per head, {per_layer} per layer — a stride "
         f"of {per_layer[0]} broadcasts")
    kernels_test = (REPO_ROOT / "tests" / "step06" / "test_fp8_kernels.py").read_text()
    quantize = re.search(r'parametrize\("block_size", \[([\d, ]+)\]\)\s*@pytest\.mark\.parametrize\('
                         r'"num_kv_heads,head_dim", \[(.*?)\]\)\s*def test_fp8_store_quantizes', kernels_test, re.S)
    blocks, heads = quantize[1].split(", "), [int(h) for h, _ in re.findall(r"\((\d+), (\d+)\)", quantize[2])]
    assert "] = 0  # a row of zeros" in kernels_test and "] = -1  # a padding row" in kernels_test
    says_in(path, f"each row's amax / {largest} when dynamic ({token_scales(torch.zeros(1, d)).item():g} for a row of "
               f"zeros), else the given static scales — divided, saturated at ±{largest}, rounded",
         f"`quantize`, blocks of {blocks[0]} and {blocks[1]}, {min(heads)}-{max(heads)} heads, a row of zeros, slot −1")
    # Triton's interpreter, as the test that pins its bugs shows them
    triton = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["triton"]
    version = next(p for p in triton if p.startswith("triton==")).removeprefix("triton==")
    wrong = re.search(r'"([\d.]+) -> ([\d.]+) \(no carry\)', kernels_test)
    says_in(path, f"Triton {'.'.join(version.split('.')[:2])}'s interpreter reads e4m3 exactly (every one of its "
               f"{2 ** e4m3.bits} values)", f"to the {mantissa}-bit mantissa",
         f"({wrong[1]} becomes {wrong[2]})", f"turns values beyond {largest} into NaN")
    # the H200
    h200 = json.loads((REPO_ROOT / "step06_triton" / "results" / "h200_fp8.json").read_text())
    goal = next(g["goal"] for g in h200["goals"] if g["goal"].startswith("decode"))
    wanted = re.search(r">= ([\d.]+)x", goal)[1]
    big = h200["decode"]["32/8x128"]
    says_in(path,
            f"decode over the fp8 pool at {big['fp8_token']['tokens_vs_bf16']}x the\nbf16 pool's tokens of context "
               f"per second ({big['fp8_static']['tokens_vs_bf16']}x with the static pool) and",
            f"at {h200['extend']['uniform']['fp8_token']['vs_bf16']}x, far from the {wanted}x\nthat half the bytes "
            "promise")
    assert 1.0 < big["fp8_token"]["tokens_vs_bf16"] < float(wanted), "they gain, but less than the bytes promise"
    # the ablation: each variant's best tile against the bf16 pool
    from benchmarks.step06 import fp8_report
    from benchmarks.step06.kernels import HEADS
    ab = fp8_report.load_ablation()
    ref = ab["variants"]["kernel"]
    ratio = lambda v, pool="fp8_token": fp8_report.best(ab["variants"][v]["decode"]["32/8x128"], pool,  # noqa: E731
                                                         "context_tokens_per_s") / ref["decode"]["32/8x128"]["bf16"][
                                                             "context_tokens_per_s"]
    pre = lambda v: fp8_report.best(ab["variants"][v]["prefill"], "fp8_token", "tflop_s") / fp8_report.best(  # noqa: E731
        ref["prefill"], "bf16", "tflop_s")
    says_in(path, f"the\nfirst version read {ratio('scales_on_v_tile'):.2f}x the bf16 pool's tokens at its best tile",
         f"the kernel reads {ratio('kernel'):.2f}x", f"it would read {ratio('no_scales'):.2f}x",
         f"Prefill pays more ({pre('kernel'):.2f}x, {pre('no_scales'):.2f}x without scales)")
    assert ratio("scales_on_v_tile") < ratio("kernel") < ratio("no_scales"), "the lesson orders the three so"
    shipped = ab["variants"]["scales_on_v_tile"]["decode"]["32/8x128"][
        f"fp8_token {decode_attention.DECODE_TILE_FP8[128][0]}x{decode_attention.DECODE_TILE_FP8[128][1]}"]
    small = lambda v: fp8_report.best(ab["variants"][v]["decode"]["9/3x64"], "fp8_token",  # noqa: E731
                                      "context_tokens_per_s") / ref["decode"]["9/3x64"]["bf16"]["context_tokens_per_s"]
    says_in(path,
            f"({shipped['context_tokens_per_s'] / ref['decode']['32/8x128']['bf16']['context_tokens_per_s']:.2f}x "
               f"on the {decode_attention.DECODE_TILE_FP8[128][0]}-key tile it shipped with)",
         "with SmolLM2's {} / {} × {} they still cost a tenth".format(*HEADS["9/3x64"]),
         f"they still cost a tenth: {small('kernel'):.2f}x against {small('no_scales'):.2f}x",
         f"kernel carries them in fp16 times {decode_attention.VALUE_SCALE.value:,.0f}")
    assert 0.05 < 1 - small("kernel") / small("no_scales") < 0.15, "the lesson says a tenth"
    # the Nsight Compute profile: bf16, fp8 per token, fp8 static, in the order measure/fp8.py --ncu runs them
    ncu = (REPO_ROOT / "step06_triton" / "results" / "h200_ncu_fp8_decode.txt").read_text()
    grab = lambda pattern: [float(x.replace(",", "")) for x in re.findall(pattern, ncu)]  # noqa: E731
    regs = grab(r"Registers Per Thread\s+register/thread\s+([\d,]+)")
    blocks = grab(r"Block Limit Registers\s+block\s+(\d+)")
    issue = grab(r"Warp Cycles Per Issued Instruction\s+cycle\s+([\d.]+)")
    tb_s = grab(r"Memory Throughput\s+Tbyte/s\s+([\d.]+)")
    instructions = grab(r"Executed Instructions\s+inst\s+([\d,]+)")
    says_in(path, f"holds {regs[0]:.0f} registers a thread, so {blocks[0]:.0f} blocks fit an SM",
         f"every {issue[0]:.1f} cycles) while DRAM moves {tb_s[0]:.2f} TB/s", f"holds {regs[1]:.0f}, so "
         f"{blocks[1]:.0f} blocks fit, and executes {instructions[1] / instructions[0] - 1:.0%} more instructions",
         f"a warp issues every {issue[1]:.1f} cycles", f"DRAM moves {tb_s[1]:.2f} TB/s", f"a tile of "
         f"{decode_attention.DECODE_TILE_FP8[128][0]}\nkeys")



# ---------------------------------------------------------------- the notebooks' markdown


def test_step06_flashinfer():
    """The lesson's reading of the FlashInfer anchor: every ratio from results/h200_flashinfer.json."""
    from benchmarks.step06.kernels import HEADS
    path = CHAPTER6
    fi = json.loads((REPO_ROOT / "step06_triton" / "results" / "h200_flashinfer.json").read_text())
    rows = fi["decode"]
    rag = {r["heads"]: r for r in rows.values() if r["ragged"] and r["block_size"] == 16}
    uniform16 = [r["graph_vs_flashinfer"] for r in rows.values() if not r["ragged"] and r["block_size"] == 16]
    long1 = next(r for r in rows.values() if not r["ragged"] and r["block_size"] == 1 and r["context"] == 32768)
    better = {h: max(("tensor_cores", "cuda_cores"), key=lambda k: r[f"flashinfer_{k}_graph_tb_s"])
              for h, r in rag.items()}
    assert better == {"32/8x128": "tensor_cores", "9/3x64": "cuda_cores"}, "the lesson names the better kernels"
    big, small = rag["32/8x128"], rag["9/3x64"]
    says_in(path, f"{big['graph_vs_flashinfer']}x\n  FlashInfer's bandwidth as a graph replay and "
               f"{big['eager_vs_flashinfer']}x eager with 32 / 8 heads, {small['graph_vs_flashinfer']}x and "
               f"{small['eager_vs_flashinfer']}x with 9 / 3", f"({min(uniform16)}x to {max(uniform16)}x with\n  blocks "
               "of 16)", f"({long1['graph_vs_flashinfer']}x at 8 × 32k)",
         "tensor cores for {} / {}\n  heads, CUDA cores for SmolLM2's {} / {}".format(*HEADS[big["heads"]][:2],
                                                                                   *HEADS[small["heads"]][:2]),
         "behind with blocks of 1 at long contexts",
         f"Prefill is behind: {fi['prefill']['uniform']['vs_flashinfer']}x FlashInfer's TFLOP/s at (4, 4,096, 2,048) "
         f"and {fi['prefill']['ragged']['vs_flashinfer']}x on the\n  ragged prefill")
    assert min(r["graph_vs_flashinfer"] for r in rag.values()) > 1 and min(uniform16) < 1 < max(uniform16)


def near(path: str, stated: str, value: float, within: float) -> None:
    """The lesson states an approximate figure (`stated`, with its words): it must lie within `within` of
    `value`, the figure computed from the code or the results, and the lesson must say it."""
    number = float(NUMBER.search(stated)[0].replace(",", ""))
    if abs(number - value) > within:
        MOVED.append(f"  {path} says {stated!r}, but the figure is now {value:g} (more than {within:g} away)")
    says_in(path, stated)


def test_notebooks():
    from statistics import mean

    from benchmarks.step03.bench import BLOCK_SIZE as B
    from course.workloads import _lcp
    from step02_paged.geometry import cdiv

    group = S["num_heads"] // S["num_kv_heads"]
    model = f"{S['num_kv_heads']} KV heads instead of {S['num_heads']}, a {group}× saving"
    says("notebooks/01_kvcache.ipynb", model)
    path = "notebooks/02_paged.ipynb"
    pool, size, seats, budget = 24, 4, 4, 16  # the notebook's EngineConfig, stated in its markdown next to these
    prompts_, new = (3, 9, 14, 22), 6
    says(path, f"`: {pool} blocks of\n{size} token slots each ({pool * size} slots in all), at most {seats} sequences "
               f"running, and at most {budget} tokens per forward")
    need = [cdiv(n + new - 1, size) for n in prompts_]  # the last answer token's K/V is never stored
    says(path, f"they need up to {' + '.join(map(str, need))} = {sum(need)} blocks",
         f"fills the {budget}-token budget with three prefills ({prompts_[0]} + {prompts_[1]} + "
         f"{budget - prompts_[0] - prompts_[1]})", f"the same {figures('step02', 'batch')['requests']} requests.")
    short = prompts("short")
    personas = [_lcp(short[i], short[j]) for i in range(3) for j in range(i + 3, 9, 3)]
    for path in ("notebooks/03_prefix_hash.ipynb", "notebooks/04_radix.ipynb"):
        near(path, "~145 tokens", mean(map(len, short)), 5)
    says("notebooks/03_prefix_hash.ipynb", f"the very first {B}-token block",
         f"the persona's {min(personas) // B} system-prompt blocks ({min(personas) // B * B} tokens)",
         f"skips the {round(workload('long')['tokens_mean'] / 1000)}k-token")
    sizes = figures("step05", "designs")["block_sizes"]
    says("notebooks/05_bridge.ipynb", f"The `short` workload on the real model, {B}-token blocks",
         f"with {B}-token blocks, and", f"at {B}-token blocks the bridge reuses",
         f"at block sizes {', '.join(map(str, sizes[:-1]))} and {sizes[-1]}")
    for path, words in (("notebooks/05_bridge.ipynb", "({}-token blocks, so that block boundaries come often)"),
                        ("notebooks/05_bridge.ipynb", "in {}-token blocks so that drafts cross block boundaries")):
        spec_block = re.search(r"EngineConfig\(num_blocks=\d+, block_size=(\d+)\).*speculative=SpeculativeConfig",
                               _notebook_code(path))[1]  # the speculative section's engine
        says(path, words.format(spec_block))
    says("notebooks/06_triton.ipynb", f"a real GPU has {step06_report.load()['kernels']['machine']['sms']} SMs")


def _notebook_code(path: str) -> str:
    """A notebook's code cells, joined."""
    from course.markdown import notebook

    return notebook(REPO_ROOT / path, path, ("code",)).text


# ---------------------------------------------------------------- the reference pages: the glossary, the workloads


def test_workloads_page():
    """WORKLOADS.md's prose: the `long` workload's shared prefix, and why its bound differs by chapter."""
    from statistics import median

    from benchmarks.step06.engine import workload as gpu_workload
    from course.workloads import TEXTS, shared_prefix_len
    from step02_paged.config import EngineConfig

    path, B = "WORKLOADS.md", EngineConfig.block_size
    long, ours = workload("long"), prompts("long")
    shared = long["shared_prefix"]
    gpu, _ = gpu_workload("long", S["vocab_size"])
    gpu_shared = shared_prefix_len(gpu)
    gpu_own = {len(p) - gpu_shared for p in gpu}
    assert len(gpu_own) == 1, "the GPU `long` gives every request as many tokens of its own"

    def bound(cached: int, requests: list[list[int]]) -> float:  # as benchmarks/runner.py computes it
        return round(median(len(p) / (len(p) - cached) for p in requests[1:]), 1)

    blocks = shared // B * B
    gpu_blocks = gpu_shared // B * B
    token, block = figures("step04", "long")["speedup_bound"], figures("step03", "long")["speedup_bound"]
    gpu_bound = _results("step06", "h200_engine")["smollm2_135m"]["long"]["token_bound"]
    assert (bound(shared, ours), bound(blocks, ours)) == (token, block), "the bounds are not the prefixes' bounds"
    assert figures("step05", "long")["speedup_bound"] == block
    assert round(len(gpu[1]) / (len(gpu[1]) - gpu_blocks), 1) == gpu_bound
    manual = len(_tokenizer().encode((TEXTS / "long_reference.txt").read_text().strip()))
    says(path, f"The write-up's shared prompt was {gpu_shared:,} tokens "
               f"and each question {gpu_own.pop()}", f"Ours is a {manual:,}-token manual",
         f"**{shared:,} tokens that every request starts with**",
         f"| chapter 4 | any token: one token per slot | {shared:,} | {token}x |",
         f"| chapters 3 and 5 | whole {B}-token blocks only: {shared // B} blocks, and the last {shared % B} shared "
         f"tokens sit in a block that holds the question too | {blocks:,} | {block}x |",
         f"| chapter 6 on a GPU | whole {B}-token blocks, on the write-up's shape in random token ids "
         f"({gpu_shared:,} shared + {len(gpu[1]) - gpu_shared} own) | {gpu_blocks:,}, so "
         f"{len(gpu[1]) - gpu_blocks} tokens computed | {gpu_bound}x |",
         f"A number of {gpu_shared:,} in a chapter is that shape; the `long` workload itself shares {shared:,}")


def test_glossary():
    import torch

    from step02_paged.config import EngineConfig

    path = "GLOSSARY.md"
    says(path, f"SmolLM2-135M has {S['num_heads']} query heads and {S['num_kv_heads']} key/value heads",
         f"{EngineConfig.block_size} in chapters 2, 3, 5 and 6",
         f"as {torch.finfo(torch.float8_e4m3fn).bits}-bit floats")


# ---------------------------------------------------------------- the audit: keep it last


# What a number that is not a measurement can be, each with its reason once.
GIVEN = "a question's own givens, or an example's: what it asks about or supposes, not a result"
FIGURE = "the fixed scenario of a picture the chapter's code draws (its sizes, ids and positions)"
SOURCE = "a figure of a source, a paper or another engine, quoted as it wrote it"
COUNT = "a count or an index in a definition (ref 1, a count of 0, O(1), base 2), not a measurement"
NAME = "part of a name (a model's, a version's, a file's, a tool's)"
ROUGH = "an order of magnitude said in words (~40 kernels a layer, 2k-token prompts), not a figure"
CHAPTERS = "a chapter's number without the word 'chapter' (the Sources table's column)"
TESTS = "a parameter of a test the table names, as that test's code sets it"
MODEL = "a constant of a model the course does not run, from its published shape (Llama-3-8B), and its arithmetic"
ONCE = "a record of a one-off run that no results file keeps (the test suite's time, a GPU test run)"
SECTION = "a notebook's own numbered section, referred to in words ('section 1', 'sections 1-3')"

ALLOWED: dict[str, dict[str, tuple[str, ...]]] = {
    "README.md": {
        NAME: ("SmolLM2-135M", "第 13 章"),
        SOURCE: ("a 2,083-token shared prompt against a bound of ~60×", "round 1: 90% of requests hit, round 2: 100%"),
        CHAPTERS: ("| 3, 4, **5**, 6 |", "| **4**, 5 |", "| **2**, **3** |"),
        ROUGH: ("(≈ 20 s, with a progress bar)",),
        COUNT: ("score 0",),
        ONCE: ("printed 1533 passed, 25 skipped (all of them chapter 6's GPU-only tests) in 8 min 11 s of tests, "
               "9 min 24 s with the set-up from the repository alone (2 cores, two pytest-xdist workers)",),
    },
    "step01_kvcache/README.md": {
        NAME: ("SmolLM2-135M", "1-D tensor"),
        GIVEN: ("at position 500 as at position 5", "even for a 50-token chat", "one 8,192-token context",
                "8,192 tokens for every request, but the average request uses 600", "handed out in 16-token"),
        FIGURE: ("positions 0-7 filled, 8-11 reserved", "of a tiny 2-layer model", "a 6-token prompt",
                 "fill positions 0-7", "Positions 8-11"),
        COUNT: ("| 1 token through every matmul", "at temperature 0", "greedy at temperature 0"),
        SOURCE: ("(16 tokens by default)",),
        TESTS: ("(GQA group sizes 1, 2, 3, 8 against HF)", "(prefill + 1, 3, 5 tokens", "position 0 is the identity"),
    },
    "step02_paged/": {
        GIVEN: ("stops after 40 tokens", "three free gaps of 300 tokens cannot hold one request that needs 600",
                "a 2,000-token prompt runs as", "at `block_size` 1, 16", "and 256?", "after sampling 5 tokens",
                "a 2,000-token prompt arrives while 7 sequences are decoding and the budget is 512",
                "took 2 of the 3 blocks", "answers of 10, 20, …, 80 tokens", "And at block size 1?"),
        FIGURE: ("an 8-block pool: seq 0 holds blocks 0, 1, 4 and seq 1 holds 2, 3, 5", "eight 4-token blocks",
                 "Seq 0's", "blocks 2 and 3 were seq 1's", "Every held block has ref 1", "the block tables at step 3"),
        COUNT: ("count to 1", "count reaches 0", "every count is 0 or 1", "its count is 0", "A decode costs 1 token",
                "back to 0", "to 0 and puts it", "in O(1) each, with count 1", "that reached 0",
                "(O(1):", "O(1) counts", "temperature > 0", "replaces steps 4-6 with a verify step"),
        SOURCE: ("The default block size on GPUs is 16 tokens", "(page size 1)", "A page size above 1",
                 "SGLang defaults to 1 and vLLM", "to 16: what"),
        TESTS: ("(block sizes 1, 4, 16",),
    },
    "step05_bridge/04_speculative.md": {
        FIGURE: ('"is 4 . What"', 'chooses "6" where the draft said "4"',
                 'the K/V of "4" until the next step writes "6"'),
        COUNT: ("1 + k", "between 1 and k + 1", "row 0, and moves on to row j + 1", "up to 1 + k tokens",
                "At batch 1 a row"),
        SOURCE: ("min(1, p(x)/q(x)) and otherwise samples from max(0, p − q)", "(2023, github.com/apoorvumang"),
    },
    "step03_prefix_hash/": {
        NAME: ("SHA-256", "RFC #16016"),
        GIVEN: ("the same 2,000-token document", "2,000-token prompt", "by its own 16 tokens only",
                "With 16-token blocks a 32-token repeat recomputes 16 tokens", "recompute only 1",
                "the same new 1,000-token prefix"),
        FIGURE: ("blocks 0 and 1 (ref 2), three branches, and the LRU free queue 8, 9, 3*, 2*", "(4-token blocks)",
                 "seq 1 and seq 2 are the two holders and blocks 0 and 1 have ref 2",
                 "block 4 has ref 1 and ends the walk",
                 "Blocks 0 and 1 hold the system prompt and are shared by seq 1 and seq 2: ref 2.",
                 "Request 0 has finished: its blocks 2 and 3 keep their hashes at ref 0",
                 "the never-used blocks 8 and 9 first (1st and 2nd); block 3", '"evicted 3rd"', "(ref 2)"),
        SOURCE: ("measured 2.56× on average, 3.45× at best", 'The snapshot for "the first 16 tokens"',
                 "The write-up's shared prompt was 2,083 tokens", "(the write-up's 2083/35 ≈ 60×;",
                 "100-200 ns per token", "100–200 ns/token", "reported 62.8% with its own texts",
                 "of 1 token by default"),
        COUNT: ("ref + 1", "drops to 0", "O(1)", "ref 0", "at ref 0", "with ref count 0",
                "with [ref count](../GLOSSARY.md#reference-count) 0",
                "salt on block 0", "near 1)", "count was 0"),
        TESTS: ("(ref 2 on a hit",),
    },
    CHAPTER4: {  # every page of chapter 4: its README, its units, its results page
        GIVEN: ("share their first 20 tokens", "many of the 20 tokens", "With chapter 3's 16-token blocks, how many"),
        FIGURE: ("request 0's 13-token prompt is one edge, lock_ref 1",
                 "an upper node of 11 tokens with lock_ref 2, and two leaves with lock_ref 1",
                 "before and after request 1",
                 "Before: request 0 is decoding, and its 13-token prompt is one edge (slots 0-12, lock_ref 1)",
                 "After: request 1 shares the first 11", "node (slots 0-10) copied lock_ref 1",
                 "request 1's lock raised it to 2", "its own leaf, lock_ref 1",
                 "the request with 16 cached tokens first, then 11, 5 and 1", "Request 0's chat is cached",
                 "seq 3 (request 0's chat continued: 16 tokens cached), seq 2", 'is": 11), seq 4 (5), seq 1'),
        SOURCE: ("sat over separate 16-token blocks",
                 "the 112 tokens it had matched, which lay inside a 144-token edge", "split that edge at 125",
                 "unlocked the 144 tokens", "125-token node and took its count from 0 to −1",
                 "(at most 32 tokens), a request that shares 32 tokens or more", "with 16-token blocks the tail",
                 "stays 16×", "reached only 3.45× at best on a GPU: its cold 2k-token prefill", "~35-token request",
                 "~5 ms of fixed CPU cost"),
        COUNT: ("adds 1 to", "O(1)", "`ref_count` 1 if it has an owner and 0 if it is free", "must be 1",
                "`ref_count` 1", "leaves or reaches 0", "requests 2-4"),
        ROUGH: ("a thousand 2k-token prompts",),
    },
    CHAPTER5: {  # every page of chapter 5: its README, its units, its results page
        NAME: ("SHA-256", "Llama-3-8B"),
        TESTS: ("(block sizes 1, 4, 16",),
        GIVEN: ("A match ending at token 125",
                "A first prompt of 48 tokens is cached in blocks 100, 101, 102; a second prompt of 32 tokens shares "
                "its first 20",
                "own, 200, and block 101", "blocks 101 and 102 stay cached", "is split after 30",
                "matches 125 tokens", "recomputes tokens 112..124", "for 8 requests sharing a 2,000-token prompt",
                "token 20, where the two",
                "Blocks of 16 tokens: a sequence has 46\n    tokens computed and has just sampled its 47th "
                "(position 46), and", "drafts 4 tokens", "rejects all 4 drafts"),
        FIGURE: ("a device pool of 6 blocks over a host tier of 8. Request 0 finished; requests 1 and 2",
                 "holding request 0's last block", "(16 tokens, 4 blocks)", "keeps the first 12 tokens' blocks",
                 "Request 0, coming back, would find all 16 tokens",
                 "the shared node has lock_ref 2 and its blocks 0-1 ref_count 3",
                 "three chats on the bridge (4-token blocks)", "(lock_ref 2), and its blocks 0-1 have ref_count 3",
                 "Request 0 has finished: blocks 2 and 3 are held", "ref_count 1), and its leaf, lock_ref 0,",
                 "Blocks 4 and 6 are each running request's", "(ref 2); 5 and 7,", "(ref 1)"),
        SOURCE: ("hash each full 16-token block", "block tables 16× smaller",
                 "and 16-token blocks suit", "SGLang runs page size 1", "a 96-token edge",
                 "(B = 16) is split after 90", "only 6 of B5's tokens",
                 "A split at 125 leaves a node whose depth is not a multiple of 16",
                 "a match ending there returned 125",
                 "(a 2,083-token shared prompt there", "measured 2.56× on a GPU", "took about 16 ms",
                 "30-40% slower on ~144-token", "(~5 ms)", "30–40% *slower* on 144-token prompts", "~5 ms of CPU"),
        MODEL: ("| a Llama-3-8B layer (8 KV heads × 128) | 4,096 | ≈ 4.4 × 10⁸ | ≈ 106,000 |",),
        COUNT: ("O(1) lookups", "`ref_count` 1", "ref_count` 1", "level-1", "level-2", "(level 1)", "(level 2)",
                "+ 1 for the tree",
                "`ref_cnt` 0", "| 0 means |", "count reaches 0", "a count goes to −1", "verify 1 + k tokens",
                "`locks_after` 0 and `blocks_leaked` 0", "not 0, when", "at block size 1", "same as 2)"),
    },
    CHAPTER6: {  # every page of chapter 6: its README, its units, its results page
        NAME: ("1B shape", "1B-shaped", "FlashAttention-2", "32 bits", "stage 1", "stage 2", "FlashAttention-3",
               "Llama-3-8B", "an 8B model", "Asymmetric 2bit Quantization", "Towards 10 Million Context Length"),
        GIVEN: ("A decode step of 256 sequences behind one 4,096-token system prompt, each with 64 tokens of its own",
                "A head row holds 10.0, 3.0, 0.01 and −7.3 among values no larger", "Why is 10.0 exact?",
                "largest |K| of 16 meets a key value of 24"),
        FIGURE: ("70 tokens in 16-token blocks", "32-token tiles, a grid of 4 split programs",
                 "a tile of 3 rows × 3 query heads", "holds 11 tokens but only its two full blocks (8 tokens)"),
        SOURCE: ("about 5 ms of CPU per step", 'a "3D"', "long enough (256 tokens)", "Since March 2026 it is off",
                 "Since March 2026 vLLM", "as of 2026, is", "segments (16)", ", 2023 (a blog post",
                 "(page size 1)", "1.0 when the checkpoint brings none", "max |K| / 200, max |V| / 100",
                 "in 2-bit integers", "converts e4m3 to 16-bit with packed instructions",
                 "1.0 unless the checkpoint brings calibrated ones"),
        COUNT: ("drop back to 1", "slot −1 returns", "exponent ≤ 0", "base 2", "starts at 0", "a 0 in its row",
                "rather than 0?", "a context of 0 tokens", "step 1", "(step 1)", "(step 2)", "(step 3:", "(step 4)",
                "step 2:", "step 3:"),
        ROUGH: ("~40 small kernels each",),
        ONCE: ("measured 4.1-4.25 for all of them", "a 2-layer 1B-shaped model"),
        TESTS: ("(blocks of 1 and 16, GQA, slot −1)", "4 products per layer instead of 7"),
    },
    "notebooks/01_kvcache.ipynb": {
        NAME: ("SmolLM2-135M",),
        FIGURE: ("(best of 2)",),
    },
    "notebooks/02_paged.ipynb": {
        FIGURE: ("a pool of 24 blocks of 4 tokens", "of 16 tokens per step", "(2 layers, seeded)",
                 "The prompts are 3, 9, 14 and 22 tokens long, and each request generates 6 tokens",
                 "a 1 is a [decode](../GLOSSARY.md#decode) step, or a 1-token", "(steps 2-4)", "- step 1 fills",
                 "seq 2's prompt is cut, and seq 3", "(seq 0 holds blocks 0 and 9)", "only 8 blocks",
                 "With 24 blocks", "With 8 blocks"),
        COUNT: ("back to 0",),
        SECTION: ("in sections 1-3",),
    },
    "notebooks/03_prefix_hash.ipynb": {
        ROUGH: ("a ~115-token system prompt",),
        FIGURE: ("requests 1–3 find nothing", "from request 4 on", "a pool of 8 blocks of 4 tokens",
                 "Three 12-token prompts", "each needs 3 blocks plus one"),
        COUNT: ("ref count 2",),
    },
    "notebooks/04_radix.ipynb": {
        FIGURE: ("request 3 is also drawn", "(4 new tokens)", "Request 3 is drawn twice", "its own 24 tokens",
                 "(requests 0-2)", "all locks are 0", "we ask for 60 slots", "at least 60 slots are free"),
    },
    "notebooks/05_bridge.ipynb": {
        COUNT: ("ref_count 1)", "(`ref_count` 1)", "k − 1 requests", "(ref 2: the tree and request 3)",
                "(ref 2 = the tree +", "1 + k"),
        FIGURE: ("a block holds 4 of them", "(10 letters) comes with 2 blocks", "shares 7 letters",
                 "[0, 7) owns 1 block", "[7, 12) crosses two boundaries and owns\n2 blocks",
                 "matches 9 letters, and the blocks cover 8 of them", "the same 10-token prompt",
                 "its own 3 blocks (2 full, 1 partial)", "request 0). The second", "(4 new tokens)",
                 "Request 3 (the assistant", "the bridge for 20 blocks",
                 "a device pool of 6 blocks: request 0 finishes"),
    },
    "notebooks/06_triton.ipynb": {
        FIGURE: ("A pool of 10 blocks of 4 tokens, 2 KV heads, head_dim 16. Sequence 0 holds 10 tokens",
                 "sequence 1 holds 5 tokens", "4 query heads ([GQA](../GLOSSARY.md#gqa) groups of 2)",
                 "With 2 sequences and 2 KV heads there would be only 4 programs",
                 "one sequence of 70 tokens in 16-token blocks, in a grid of 4 split programs", "tiles of 32",
                 "against 8 tiles of 16 scores", "A sequence of 24 tokens whose first 16 are cached",
                 "runs its last 8", "sequence 0's ten tokens"),
        SECTION: ("of section 1",),
    },
}


@pytest.mark.usefixtures("whole_file_passed")
def test_every_number_in_the_lessons_is_checked():
    """Every number in the lessons' prose was checked by a `says` of this file, is structure, or is in
    `ALLOWED` with its kind: a number typed only in the markdown fails here, with its file and line."""
    missing = {k for k in ALLOWED if not any(p == k or (k.endswith("/") and p.startswith(k)) for p in _documents())}
    assert not missing, f"ALLOWED names no lesson: {missing}"
    unchecked: list[str] = []
    used: set[tuple[str, str]] = set()  # (ALLOWED key, context) that covered a number
    for path, doc in _documents().items():
        lesson = _prose(path)
        allowed: set[int] = set()
        keys = [k for k in ALLOWED if k == path or (k.endswith("/") and path.startswith(k))]
        for key in keys:
            for contexts in ALLOWED[key].values():
                for context in contexts:
                    hit = lesson.covered(context) - CHECKED[path]
                    if hit or path in CUT:
                        used.add((key, context))
                    allowed |= hit
        unchecked += [f"{doc.where(o)}: {n}" for o, n in sorted(lesson.numbers.items())
                      if o not in CHECKED[path] and o not in allowed]
    unused = [f"{key}: {context!r}" for key, kinds in ALLOWED.items() for contexts in kinds.values()
              for context in contexts if (key, context) not in used]
    assert not unchecked, ("numbers typed only in the lessons: check each with `says` (read from the committed "
                           "results or computed from the code), or list it in ALLOWED under its kind:\n"
                           + "\n".join(unchecked))
    assert not unused, "ALLOWED entries that cover no number the checks leave (remove them):\n" + "\n".join(unused)

"""Every command and code name a lesson shows exists.

Commands: each `python -m X ...` (or `python3 -m`) in a lesson's code (inline spans and fenced blocks, the generated
results blocks included, and every notebook's markdown and code cells) names a module of the course, or of Python's
standard library, and the course's module parses its arguments. Parsing runs the module's `main(argv)` with argparse
stopped as soon as `parse_args` has parsed (every command line of the course parses before it does anything), so
nothing is run. A placeholder (`N`, `DIR`, `OUT.zip`, `stepNN`, `…`) stands for any value, `[...]` marks a part that
may be left out (it is given) and `a|b` a choice (each is tried); a command named without its arguments and flags
(`python -m course homework check`) is a name, and only its module and subcommands must exist.

Names: each inline span that looks like the course's code (a CamelCase class, a `call()`, a dotted `module.attr` or
`Class.member`, a `file.py`) is defined in the repository's Python (read with `ast`, nothing imported), is a key path
of a committed results file or a homework task, or is Python's or an installed library's (imported and looked up).
The names of the systems the lessons compare with are listed in FOREIGN, each under its owner.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import functools
import importlib
import importlib.util
import io
import itertools
import json
import posixpath
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from unittest import mock

import pytest

from course.chapters import chapters
from course.markdown import Document, code_parts, documents, notebook
from course.paths import REPO_ROOT

# Names of the systems and sources the lessons compare with, by owner: not the course's, so not looked up here.
FOREIGN = {
    "vLLM": {"AsyncLLM", "BlockPool", "FreeKVCacheBlockQueue", "InputBatch", "KVCacheBlock", "KVEventBatch",
             "QKVParallelLinear", "cuda_graph_runner.py"},
    "SGLang": {"CacheAgnosticPolicy", "MHATokenToKVPool", "RadixAttention", "RadixCache", "RadixKey", "Req",
               "ReqToTokenPool", "SchedulePolicy", "schedule_policy.py", "token_to_kv_pool_allocator"},
    "FlashInfer": {"MultiLevelCascadeAttentionWrapper"},
    "Hugging Face transformers": {"DynamicCache", "StaticCache", "LlamaForCausalLM"},
    "the Pico-vLLM write-up": {"PrefixCache", "inc_ref", "dec_ref"},
    "Unix": {"fork"},
    "PTX (the GPU's instruction set)": {"cvt"},
    "ASGI (an HTTP server's messages)": {"http.disconnect"},
    "notation": {"ceil"},
}
FOREIGN_NAMES = set().union(*FOREIGN.values())
LIBRARIES = {"torch": "torch", "triton": "triton", "tl": "triton.language", "np": "numpy", "numpy": "numpy",
             "os": "os", "sys": "sys", "time": "time", "math": "math", "json": "json", "pytest": "pytest",
             "asyncio": "asyncio", "transformers": "transformers"}  # a dotted name's root -> the module it names

PLACEHOLDER = "\0placeholder:"  # a value that stands for any value: it passes every type and every choice
PLACEHOLDERS = re.compile(r"[A-Z][A-Z0-9_]*(?:\.[a-z]+)?|step[N]+(?:_\w+)?|…|\.\.\.|<[^>]+>")
SHELL = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1"}  # the end of a command on a shell line
COMMAND = re.compile(r"(?:^|(?<=[\s(/!]))python3? +-m +(\S.*)", re.M)

CAMEL = re.compile(r"[A-Z][A-Za-z0-9]*(?:[a-z][A-Z]|[A-Z]{2}[a-z])[A-Za-z0-9]*")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
FILE = re.compile(r"[\w./-]+\.py")
NOT_CODE = re.compile(r".*\.(?:json|ya?ml|toml|sh|md|txt|svg|zip|ipynb|csv|log|gguf|html|whl)$")


# ---- the lessons' code -------------------------------------------------------------------------------------------
def pages() -> list[Document]:
    """What a student reads as text: the root README, each chapter's pages, the glossary, the workloads, the
    instructors' README, every notebook's markdown cells."""
    return documents(REPO_ROOT) + [Document("instructors/README.md", (REPO_ROOT / "instructors/README.md").read_text())]


def code_cells() -> list[Document]:
    """Every notebook's code cells."""
    notebooks = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
    return [notebook(p, str(p.relative_to(REPO_ROOT)), ("code",)) for p in notebooks]


def spans(doc: Document) -> list[tuple[int, str, bool]]:
    """(offset, code, inline) of the document's code: its inline spans and the lines of its fenced blocks."""
    out = []
    for offset, code in code_parts(doc.text):
        if doc.text[offset - 1:offset] == "`":
            out.append((offset, " ".join(code.split()), True))  # a span that wraps is one line
        else:
            out += [(offset + m.start(), m[0], False) for m in re.finditer(r".+", code.replace("\\\n", "  "))]
    return out


def commands(doc: Document, code: bool = False) -> list[tuple[str, str]]:
    """(place, what follows `python -m`) of every command in the document's code (all of it for code cells)."""
    lines = [(m.start(), m[0]) for m in re.finditer(r".+", doc.text)] if code else \
        [(offset, text) for offset, text, _ in spans(doc)]
    return [(doc.where(offset + m.start()), m[1].strip()) for offset, text in lines for m in COMMAND.finditer(text)]


def _tokens(line: str) -> list[str]:
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # an apostrophe in prose after the command
        words = line.split()
    return list(itertools.takewhile(lambda w: w not in SHELL, words))


def invocations(command: str) -> list[tuple[str, list[str]]]:
    """(module, argv) for each way of reading `command` (`[...]` given, each choice of `a|b` tried, a placeholder
    module `stepNN_x` as every chapter), with placeholders marked."""
    words = [w for w in _tokens(command.replace("[", " ").replace("]", " ")) if w]
    module, args = words[0], words[1:]
    modules = chapters() if PLACEHOLDERS.fullmatch(module) else [module]
    choices = [w.split("|") if "|" in w.strip("|") else [w] for w in args]
    out = []
    for mod, chosen in itertools.product(modules, itertools.product(*choices)):
        out.append((mod, [PLACEHOLDER + w if PLACEHOLDERS.fullmatch(w) else w for w in chosen]))
    return out


# ---- parsing a command line without running it -------------------------------------------------------------------
class _Parsed(Exception):
    pass


class _Refused(Exception):
    pass


@contextlib.contextmanager
def _parse_only():
    """argparse that stops once it has parsed (`parse_args` raises _Parsed) or refused (`error` raises _Refused),
    and takes a placeholder for any value."""
    cls = argparse.ArgumentParser
    parse_args, get_value, check_value = cls.parse_args, cls._get_value, cls._check_value

    def stop(self, args=None, namespace=None):
        raise _Parsed(parse_args(self, args, namespace))

    def refuse(self, message):
        raise _Refused(message)

    def value(self, action, string):
        return string if string.startswith(PLACEHOLDER) else get_value(self, action, string)

    def check(self, action, value):
        if not (isinstance(value, str) and value.startswith(PLACEHOLDER)):
            check_value(self, action, value)

    with mock.patch.multiple(cls, parse_args=stop, error=refuse, _get_value=value, _check_value=check):
        yield


def problem(module: str, argv: list[str]) -> str | None:
    """Why `python -m module *argv` would not start, or None: the module must be the course's (or the standard
    library's) and the course's must parse argv."""
    if module.split(".")[0] in sys.stdlib_module_names:
        return None if importlib.util.find_spec(module) else "no such module in Python's standard library"
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    if spec is None or not str(spec.origin or spec.submodule_search_locations).startswith(str(REPO_ROOT)):
        return "no such module in the course"
    target = importlib.import_module(f"{module}.__main__" if spec.submodule_search_locations else module)
    if not callable(getattr(target, "main", None)):
        return "the module has no main(argv) to parse its arguments"
    with _parse_only(), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = target.main(list(argv))
        except _Parsed:
            return None
        except _Refused as e:
            named = not any(a.startswith("-") for a in argv)  # the command's name, not a call of it
            return None if named and str(e).startswith("the following arguments are required") else str(e)
    return None if code == 0 and not argv else f"main returned {code} without parsing its arguments"


# ---- the repository's names --------------------------------------------------------------------------------------
class Index:
    """The names the repository's Python defines, read with `ast`: modules with their top-level names, classes with
    their members (inherited ones too), every def, and the attributes set anywhere."""

    def __init__(self) -> None:
        files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
        self.files = set(files) | {posixpath.basename(f) for f in files}
        self.modules: dict[str, set[str]] = {}  # dotted module -> its top-level names
        self.basenames: dict[str, list[str]] = defaultdict(list)  # `engine` -> every module named so
        self.members: dict[str, set[str]] = defaultdict(set)  # class -> members (of every class so named)
        self.bases: dict[str, set[str]] = defaultdict(set)
        self.defs: set[str] = set()  # every function and class, at any depth
        self.attributes: set[str] = set()  # every attribute assigned (self.x = ...) or declared in a class
        self.parameters: set[str] = set()  # every function's parameters (a callback is called by its name)
        for path in files:
            tree = ast.parse((REPO_ROOT / path).read_text())
            module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            self.modules[module] = {n for node in tree.body for n in _bound(node)}
            self.basenames[module.rsplit(".", 1)[-1]].append(module)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.defs.add(node.name)
                if isinstance(node, ast.ClassDef):
                    self.members[node.name] |= {n for item in node.body for n in _bound(item)}
                    self.members[node.name] |= {t.attr for item in ast.walk(node) for t in _targets(item)
                                                if isinstance(t, ast.Attribute)}
                    self.bases[node.name] |= {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                self.attributes |= {t.attr for t in _targets(node) if isinstance(t, ast.Attribute)}
                if isinstance(node, ast.arg):
                    self.parameters.add(node.arg)
        self.tasks = set(re.findall(r"BEGIN SOLUTION (task\d+\.\w+)", "\n".join(
            (REPO_ROOT / f).read_text() for f in files)))
        self.keys = _key_paths()

    def member(self, cls: str, name: str, seen: frozenset = frozenset()) -> bool:
        return name in self.members[cls] or any(self.member(b, name, seen | {cls}) for b in self.bases[cls] - seen)

    def module_attr(self, module: str, rest: list[str]) -> bool:
        """`rest` read inside `module`: a submodule, a top-level name, then a class's member."""
        if not rest:
            return True
        if f"{module}.{rest[0]}" in self.modules:
            return self.module_attr(f"{module}.{rest[0]}", rest[1:])
        if rest[0] not in self.modules[module]:
            return False
        return len(rest) == 1 or rest[0] not in self.members or self.member(rest[0], rest[1])

    def resolves(self, dotted: str) -> bool:
        parts = dotted.split(".")
        root = parts[0]
        if root in FOREIGN_NAMES or dotted in FOREIGN_NAMES or dotted in self.tasks or dotted in self.keys:
            return True
        for i in range(len(parts), 0, -1):  # the longest module the name starts with
            head = ".".join(parts[:i])
            for module in ([head] if head in self.modules else []) + (self.basenames.get(head, []) if i == 1 else []):
                if self.module_attr(module, parts[i:]):
                    return True
        if root in self.members:  # Class.member
            return len(parts) == 1 or self.member(root, parts[1])
        if root in LIBRARIES:
            return _library_has(LIBRARIES[root], parts[1:])
        if len(parts) == 1:  # a function, a class, a builtin, or a method or callback named alone (`tolist()`)
            return root in self.defs or hasattr(builtins, root) or root in self.parameters or self.attribute(root)
        return self.attribute(parts[-1])  # an object's attribute or method (`policy.order`, `seq_lens.max`)

    def attribute(self, name: str) -> bool:
        """A member of one of the course's classes, or of a tensor or a builtin type."""
        import torch
        return (name in self.attributes or any(name in members for members in self.members.values())
                or any(hasattr(t, name) for t in (torch.Tensor, list, dict, str, set)))


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in ast.walk(target)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def _bound(node: ast.stmt) -> set[str]:
    """The names a statement binds at its level: defs, classes, assignments, imports."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.If, ast.Try)):
        return {n for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt) for n in _bound(child)}
    return {t.id for t in _targets(node) if isinstance(t, ast.Name)}


def _key_paths() -> set[str]:
    """Every dotted path of keys (two or more) inside the committed results files."""
    paths: set[str] = set()

    def walk(node: object, chains: list[str]) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                longer = [f"{c}.{key}" for c in chains] + [str(key)]
                paths.update(c for c in longer if "." in c)
                walk(value, [c for c in longer if c.count(".") < 3])
        elif isinstance(node, list):
            for item in node:
                walk(item, [])

    for path in sorted(REPO_ROOT.glob("step*/results/*.json")):
        walk(json.loads(path.read_text()), [])
    return paths


def _library_has(module: str, rest: list[str]) -> bool:
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return False
    for i, name in enumerate(rest):
        if not hasattr(obj, name):
            try:
                obj = importlib.import_module(".".join([module, *rest[:i + 1]]))
                continue
            except ImportError:
                return False
        obj = getattr(obj, name)
    return True


@functools.cache
def index() -> Index:
    return Index()


def name_of(span: str) -> tuple[str, str] | None:
    """(kind, name) of a span that looks like the course's code, or None."""
    span = span.strip()
    if FILE.fullmatch(span):
        return "file", span
    if CAMEL.fullmatch(span) or (DOTTED.fullmatch(span) and not NOT_CODE.match(span)):
        return "name", span
    if re.fullmatch(r"[A-Za-z_][\w.]*\(.*\)", span, re.S):
        try:
            call = ast.parse(span, mode="eval").body
        except SyntaxError:
            return None  # a formula (`softmax(q · Kᵀ / √d)`), not code
        callee = ast.unparse(call.func) if isinstance(call, ast.Call) else ""
        if DOTTED.fullmatch(callee) or (re.fullmatch(r"[A-Za-z_]\w+", callee)):
            return "name", callee
    return None


def file_exists(doc: Document, name: str) -> bool:
    """A file a lesson names: from the repository's root or the page's folder, or a file's name; a path whose first
    folder is not the repository's is another project's (its name must be in FOREIGN when it has no folder)."""
    folder = posixpath.dirname(doc.path)
    if (REPO_ROOT / name).is_file() or (REPO_ROOT / folder / name).is_file():
        return True
    if "/" not in name:
        return name in index().files or name in FOREIGN_NAMES
    first = name.split("/")[0]
    return not ((REPO_ROOT / first).exists() or (REPO_ROOT / folder / first).exists())


def missing_names(doc: Document) -> list[str]:
    """Each name of an inline span that looks like the course's and is not found, by place (fenced blocks are code
    that the tests which run it read)."""
    out = []
    for offset, code, inline in spans(doc):
        found = name_of(code) if inline else None
        if found is None:
            continue
        kind, name = found
        ok = file_exists(doc, name) if kind == "file" else index().resolves(name)
        if not ok:
            out.append(f"{doc.where(offset)}: `{name}`")
    return out


# ---- the tests ---------------------------------------------------------------------------------------------------
PAGES, CODE = pages(), code_cells()


@pytest.mark.parametrize("doc,code", [(d, False) for d in PAGES] + [(d, True) for d in CODE],
                         ids=lambda x: x.path if isinstance(x, Document) else ("code cells" if x else "text"))
def test_every_command_exists_and_parses(doc: Document, code: bool):
    bad = [f"{place}: python -m {command}: {why}" for place, command in commands(doc, code)
           for module, argv in invocations(command) if (why := problem(module, argv))]
    assert not bad, "commands that would not run as written:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", PAGES, ids=lambda d: d.path)
def test_every_code_name_exists(doc: Document):
    bad = missing_names(doc)
    assert not bad, "names the repository does not define (a foreign one goes in FOREIGN):\n" + "\n".join(bad)


def test_foreign_names_are_used_and_not_the_courses():
    """FOREIGN lets a name through unlooked-up: each must be one a lesson uses and one the course does not define."""
    used = {part for doc in PAGES for _, code, inline in spans(doc) if inline and (found := name_of(code))
            for part in (found[1], found[1].split(".")[0])}
    ours = index().defs | index().files | index().attributes | set(index().basenames) | set().union(
        *index().members.values())
    assert FOREIGN_NAMES <= used, f"FOREIGN names no lesson uses: {FOREIGN_NAMES - used}"
    assert not FOREIGN_NAMES & ours, f"FOREIGN hides names the course defines: {FOREIGN_NAMES & ours}"


def test_the_checks_find_a_bad_command_and_a_bad_name():
    page = Document("step09_x/README.md", "Run `python -m course report --wirte`, `python -m step06_triton.e2e`, "
                    "`python -m course bench stepNN --workload W --save` and `NoAttentionRunner` with `engine.step()`, "
                    "`NullRunner`, `BlockManager.allocate_typo`, `decode_attention.split_bucketz` and `missing.py`.\n")
    found = [problem(m, a) for _, c in commands(page) for m, a in invocations(c)]
    assert found[0] and "--wirte" in found[0] and found[1] == "no such module in the course" and found[2] is None
    assert missing_names(page) == ["step09_x/README.md:1: `NoAttentionRunner`",
                                   "step09_x/README.md:1: `BlockManager.allocate_typo`",
                                   "step09_x/README.md:1: `decode_attention.split_bucketz`",
                                   "step09_x/README.md:1: `missing.py`"]

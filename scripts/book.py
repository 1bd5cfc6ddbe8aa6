"""Build the course as a static website: `make book` (or `python scripts/book.py`).

The repository stays the source of truth. `book.yml` lists the pages in reading order; this script copies them into
a staging tree (build/book/docs) that mirrors the repository's paths, so that the lessons' relative links keep
working, and MkDocs (Material theme, mkdocs-jupyter for the notebooks) renders that tree into build/book/site.
On the way it turns what a site cannot serve into what it can:
- a link to a source file (`engine.py`, a results JSON, a log) becomes a link to a page that shows the file as
  highlighted code; a link to a folder becomes a page listing its files;
- pictures (SVG, PNG) are copied beside the page that shows them;
- links inside notebooks, which MkDocs does not resolve, point at the pages' HTML;
- GitHub's Markdown habits that Python-Markdown reads differently (a list right after a paragraph, a list nested
  by two spaces) are normalised in the copy.
Nothing is fetched at build or view time: no web fonts, a local search index, no CDN scripts.

This file is also the build's MkDocs hook module (`on_post_page` below).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import yaml

ROOT = Path(__file__).resolve().parents[1]
NAV_FILE = "book.yml"
OUT = ROOT / "build" / "book"  # docs/ (the staged sources), site/ (the website), screenshots/ (the browser test's)
CODE_DIR = "code"  # the staged pages that show source files

PICTURES = {".svg", ".png", ".jpg", ".jpeg", ".gif", ".webp"}
LANGUAGES = {".py": "python", ".json": "json", ".toml": "toml", ".yml": "yaml", ".yaml": "yaml", ".sh": "bash",
             ".md": "markdown", ".dot": "dot", ".cfg": "ini", ".ini": "ini", ".txt": "text", ".log": "text"}
# Source pages stay out of the search index: the lessons name the code, and the index stays small enough to load fast.
NOT_SEARCHED = "---\nsearch:\n  exclude: true\n---\n"
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


# ------------------------------------------------------------------------------------------------ the navigation
@dataclass
class Book:
    """The contents of book.yml: the site's name, its navigation and the Markdown files that are not pages."""

    site_name: str
    nav: list
    not_in_book: list[str] = field(default_factory=list)

    @property
    def chapters(self) -> list[tuple[str, list[str]]]:
        """Top-level entries as (title, pages in reading order); a single page is a chapter of one page."""
        return [(title, _flatten(value)) for title, value in map(_entry, self.nav)]

    @property
    def pages(self) -> list[str]:
        return [page for _, pages in self.chapters for page in pages]

    def excluded(self, path: str) -> bool:
        return any(fnmatch.fnmatch(path, pattern) for pattern in self.not_in_book)


def _entry(item) -> tuple[str | None, object]:
    if isinstance(item, str):
        return None, item
    if isinstance(item, dict) and len(item) == 1:
        return next(iter(item.items()))
    raise ValueError(f"{NAV_FILE}: a nav entry is a path, {{title: path}} or {{title: [entries]}}, not {item!r}")


def _flatten(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [page for item in value for page in _flatten(_entry(item)[1])]


def load_book(root: Path = ROOT) -> Book:
    data = yaml.safe_load((root / NAV_FILE).read_text())
    return Book(site_name=data["site_name"], nav=data["nav"], not_in_book=data.get("not_in_book", []))


def repo_files(root: Path = ROOT) -> list[str]:
    """The repository's files, tracked or new, without what git ignores (the virtual environment, builds)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                             check=True, capture_output=True, text=True).stdout
        return sorted(p for p in out.split("\0") if p and (root / p).is_file())
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk it, skipping the usual ignores
        skip = {".venv", "build", "homework", ".git", "node_modules", "__pycache__"}
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                      if p.is_file() and not skip.intersection(p.relative_to(root).parts))


def lesson_files(root: Path = ROOT, book: Book | None = None) -> list[str]:
    """Every file the book must list: the repository's Markdown files and notebooks, less `not_in_book`."""
    book = book or load_book(root)
    return [p for p in repo_files(root) if p.endswith((".md", ".ipynb")) and not book.excluded(p)]


def nav_problems(root: Path = ROOT) -> list[str]:
    """What is wrong between book.yml and the files: unlisted lesson files, listed files that do not exist."""
    book = load_book(root)
    listed = book.pages
    problems = [f"{p} is a lesson file but {NAV_FILE} does not list it" for p in lesson_files(root, book)
                if p not in listed]
    problems += [f"{NAV_FILE} lists {p}, which does not exist" for p in listed if not (root / p).is_file()]
    problems += [f"{NAV_FILE} lists {p} twice" for p in sorted(set(listed)) if listed.count(p) > 1]
    problems += [f"{NAV_FILE} lists {p}, which is neither Markdown nor a notebook" for p in listed
                 if not p.endswith((".md", ".ipynb"))]
    return problems


def page_title(path: Path) -> str:
    """A page's title as a reader sees it: its first level-1 heading (a notebook's: in its first Markdown cells)."""
    text = path.read_text()
    if path.suffix == ".ipynb":
        cells = json.loads(text).get("cells", [])
        text = "\n".join("".join(c["source"]) for c in cells if c.get("cell_type") == "markdown")
    heading = next((line[2:] for line in text.split("\n") if line.startswith("# ")), path.stem)
    return re.sub(r"[`*]", "", heading).strip()


def page_url(path: str) -> str:
    """Where a staged page lands on the site (MkDocs with use_directory_urls off): README.md is its folder's index."""
    stem, _ = posixpath.splitext(path)
    if posixpath.basename(stem) in ("README", "index"):
        stem = posixpath.join(posixpath.dirname(stem), "index")
    return stem + ".html"


# ------------------------------------------------------------------------------------------------ staging
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
LIST_ITEM = re.compile(r"^( *)([-*+]|\d+[.)]) +\S")
MD_LINK = re.compile(r"(\]\(\s*<?)([^)\s>]+)(>?(?:\s+\"[^\"]*\")?\s*\))")
REF_LINK = re.compile(r"^( {0,3}\[[^\]\n]+\]:[ \t]*<?)(\S+?)(>?(?:[ \t].*)?)$", re.M)
HTML_LINK = re.compile(r"(\b(?:src|href)=\")([^\"]+)(\")")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.S)


class Stager:
    """Copies the book's pages into `docs`, rewriting each link so that it works on the site."""

    def __init__(self, root: Path, docs: Path, book: Book):
        self.root, self.docs, self.book = root, docs, book
        self.pages = set(book.pages)
        self.files = set(repo_files(root))
        self.extra_pages: set[str] = set()  # linked Markdown files that book.yml does not list
        self.code: set[str] = set()  # source files shown as code pages
        self.folders: set[str] = set()  # folders shown as lists of files
        self.copied: set[str] = set()  # pictures and other files copied as they are
        self.problems: list[str] = []  # links to nothing

    def run(self) -> Stager:
        if self.docs.exists():
            shutil.rmtree(self.docs)
        self.docs.mkdir(parents=True)
        todo, done = list(self.book.pages), set()
        while todo:  # a linked page that book.yml does not list is staged too, and may link further
            page = todo.pop(0)
            if page in done or not (self.root / page).is_file():
                continue
            done.add(page)
            self._stage_page(page)
            todo += sorted(self.extra_pages - done)
        for folder in sorted(self.folders):
            self._write_folder(folder)
        for path in sorted(self.code):
            self._write_code(path)
        for path in sorted(self.copied):
            self._copy(path)
        return self

    # -- pages
    def _stage_page(self, page: str) -> None:
        text = (self.root / page).read_text()
        if page.endswith(".ipynb"):
            nb = json.loads(text)
            for cell in nb.get("cells", []):
                if cell.get("cell_type") == "markdown":
                    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                    cell["source"] = self._rewrite_markdown(page, source, notebook=True)
            text = json.dumps(nb, indent=1, ensure_ascii=False)
        else:
            text = normalise_markdown(self._rewrite_markdown(page, text, notebook=False))
        dest = self.docs / page
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)

    def _rewrite_markdown(self, page: str, text: str, notebook: bool) -> str:
        fix = lambda m: m.group(1) + self.link(page, m.group(2), notebook) + m.group(3)  # noqa: E731

        def prose(block: str) -> str:  # a paragraph: code spans (which may cross lines) are left as they are
            spans = [m.group(0) for m in CODE_SPAN.finditer(block)]
            pieces = []
            for i, chunk in enumerate(CODE_SPAN.sub("\0", block).split("\0")):
                pieces.append(HTML_LINK.sub(fix, MD_LINK.sub(fix, REF_LINK.sub(fix, chunk))))
                pieces.append(spans[i] if i < len(spans) else "")
            return "".join(pieces)

        out, para, fence = [], [], None
        for line in text.split("\n"):
            m = FENCE.match(line)
            if m and (fence is None or m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)):
                fence = None if fence else m.group(1)
            if fence or m or not line.strip():
                out += prose("\n".join(para)).split("\n") if para else []
                out.append(line)
                para = []
            else:
                para.append(line)
        out += prose("\n".join(para)).split("\n") if para else []
        return "\n".join(out)

    def link(self, page: str, target: str, notebook: bool) -> str:
        """The link to write in the staged copy of `page` for a link to `target` in the repository."""
        if not target or target.startswith(("#", "/")) or SCHEME.match(target):
            return target
        path, hash_, frag = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page), unquote(path)))
        full = self.root / resolved
        if resolved.startswith("..") or not full.exists():
            self.problems.append(f"{page}: link to {target}, which does not exist")
            return target
        if full.is_dir():
            readme = posixpath.join(resolved, "README.md")
            if readme in self.pages:
                dest = readme
            else:
                self.folders.add(resolved)
                dest, hash_, frag = posixpath.join(CODE_DIR, resolved, "index.md"), "", ""
        elif resolved in self.pages or (resolved.endswith(".md") and not self.book.excluded(resolved)):
            if resolved not in self.pages:
                self.extra_pages.add(resolved)
            dest = resolved
        elif posixpath.splitext(resolved)[1].lower() in PICTURES or not _is_text(full):
            self.copied.add(resolved)
            dest = resolved
        else:
            self.code.add(resolved)
            dest, hash_, frag = posixpath.join(CODE_DIR, resolved + ".md"), "", ""
        if notebook and dest.endswith((".md", ".ipynb")):  # MkDocs does not resolve links inside notebooks
            dest = page_url(dest)
        rel = posixpath.relpath(dest, posixpath.dirname(page) or ".")
        return rel + hash_ + frag

    # -- everything else a page links to
    def _write_code(self, path: str) -> None:
        source = (self.root / path).read_text()
        fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", source)), default=0))
        lang = LANGUAGES.get(posixpath.splitext(path)[1], "text")
        self._write(posixpath.join(CODE_DIR, path + ".md"),
                    f"{NOT_SEARCHED}# `{path}`\n\n{fence}{lang}\n{source.rstrip()}\n{fence}\n")

    def _write_folder(self, folder: str) -> None:
        inside = [p for p in sorted(self.files) if p.startswith(folder + "/")]
        lines = [f"{NOT_SEARCHED}# `{folder}/`", ""]
        for path in inside:
            rel = posixpath.relpath(path, folder)
            if _is_text(self.root / path):
                self.code.add(path)
                lines.append(f"- [`{rel}`]({rel}.md)")
            else:
                self.copied.add(path)
                lines.append(f"- [`{rel}`]({posixpath.relpath(path, posixpath.join(CODE_DIR, folder))})")
        self._write(posixpath.join(CODE_DIR, folder, "index.md"), "\n".join(lines) + "\n")

    def _copy(self, path: str) -> None:
        dest = self.docs / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.root / path, dest)

    def _write(self, path: str, text: str) -> None:
        dest = self.docs / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)


def _is_text(path: Path) -> bool:
    try:
        path.read_text()
        return True
    except (UnicodeDecodeError, OSError):
        return False


def normalise_markdown(text: str) -> str:
    """GitHub's Markdown as Python-Markdown reads it: a list or a table may follow a paragraph line without a
    blank line between them, and a list may nest by two spaces (Python-Markdown needs four)."""
    out: list[str] = []
    fence, in_list, prev_blank = None, False, True
    for line in text.split("\n"):
        m = FENCE.match(line)
        if m and (fence is None or m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)):
            fence = None if fence else m.group(1)
        elif not fence:
            blank = not line.strip()
            item = LIST_ITEM.match(line)
            if item:
                indent = len(item.group(1))
                if not in_list and not prev_blank and indent < 4:
                    out.append("")
                if in_list and 0 < indent < 4 and indent % 4:
                    line = " " * (2 * indent) + line[indent:]
                in_list = True
            elif blank:
                pass
            elif prev_blank and not line.startswith(" "):
                in_list = False
            if line.startswith("|") and out and out[-1].strip() and not out[-1].lstrip().startswith("|") \
                    and not in_list:
                out.append("")
            prev_blank = blank
        out.append(line)
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ MkDocs
def mkdocs_config(book: Book, out: Path) -> str:
    """The MkDocs configuration of the staged tree (written to build/book/mkdocs.yml)."""
    config = {
        "site_name": book.site_name,
        "docs_dir": str(out / "docs"),
        "site_dir": str(out / "site"),
        "use_directory_urls": False,  # pages are NAME.html: the site also opens from the file system
        "theme": {
            "name": "material",
            "font": False,  # no web fonts: the system's fonts, nothing fetched
            "features": ["navigation.indexes", "navigation.footer", "navigation.top", "navigation.tracking",
                         "toc.follow", "search.highlight", "search.suggest", "content.code.copy"],
            "palette": {"primary": "indigo", "accent": "indigo"},
        },
        "plugins": [
            "search",  # a local index, searched in the browser
            {"mkdocs-jupyter": {"include": ["*.ipynb"], "execute": False, "include_source": True,
                                "include_requirejs": False, "cache_dir": str(out / "cache")}},
        ],
        "markdown_extensions": [
            "tables", "attr_list", "md_in_html", "admonition", "def_list", "footnotes",
            {"toc": {"permalink": True, "slugify": "SLUGIFY"}},
            {"pymdownx.highlight": {"anchor_linenums": True}},
            "pymdownx.superfences", "pymdownx.details", "pymdownx.inlinehilite",
        ],
        "not_in_nav": f"/{CODE_DIR}/**\n",
        "exclude_docs": f"!/{CODE_DIR}/**\n",  # MkDocs skips dot-folders; a lesson may show .github/'s files
        "validation": {"nav": {"omitted_files": "info"},
                       "links": {"not_found": "warn", "anchors": "warn", "unrecognized_links": "warn"}},
        "hooks": [str(Path(__file__).resolve())],
        "nav": book.nav,
    }
    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    # Headings get GitHub's anchors, so that the lessons' links to sections work on GitHub and on the site alike.
    return text.replace("slugify: SLUGIFY",
                        "slugify: !!python/object/apply:pymdownx.slugs.slugify {kwds: {case: lower}}")


EXTERNAL_SCRIPT = re.compile(r"<script[^>]*\bsrc=\"(?:https?://[^\"]*)?\"[^>]*>\s*</script>\s*")
CDN_MODULE = re.compile(r"<script type=\"module\">(?:(?!</script>).)*?import\(\"https?://.*?</script>\s*", re.S)
MATHJAX_CONFIG = re.compile(r"<script type=\"text/x-mathjax-config\">.*?</script>\s*", re.S)


def on_post_page(output: str, page, config) -> str:
    """MkDocs hook: notebooks come with CDN scripts (MathJax, Mermaid) that no page of the course needs; drop them."""
    for pattern in (EXTERNAL_SCRIPT, CDN_MODULE, MATHJAX_CONFIG):
        output = pattern.sub("", output)
    return output


HEADING = re.compile(r"<h([1-6])\b[^>]*\bid=\"([^\"]+)\"")


def on_page_context(context, page, config, nav):
    """MkDocs hook: a notebook's table of contents is made from its Markdown, where a heading with code in it
    (`The `short` workload`) gets another anchor than the one nbconvert puts on the heading; point each entry of
    the contents at its heading, taken in order at the same level."""
    if not page.file.src_uri.endswith(".ipynb") or not page.content:
        return context
    headings = [(int(level), id_) for level, id_ in HEADING.findall(page.content)]
    ids = {id_ for _, id_ in headings}
    at = 0
    for item in _toc_items(page.toc):
        if item.id in ids:
            at = next((i + 1 for i in range(at, len(headings)) if headings[i][1] == item.id), at)
            continue
        match = next((i for i in range(at, len(headings)) if headings[i][0] == item.level), None)
        if match is not None:
            item.id, at = headings[match][1], match + 1
    return context


def _toc_items(items):
    for item in items:
        yield item
        yield from _toc_items(item.children)


# ------------------------------------------------------------------------------------------------ the link check
RESOURCE_TAGS = {"script": "src", "img": "src", "iframe": "src", "source": "src", "audio": "src", "video": "src",
                 "embed": "src", "link": "href"}


class _Refs(HTMLParser):
    """The ids of a page, its links (<a href>) and the resources it loads (scripts, stylesheets, pictures)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.resources: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(key):
                self.ids.add(attrs[key])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        elif tag in RESOURCE_TAGS and attrs.get(RESOURCE_TAGS[tag]):
            self.resources.append(attrs[RESOURCE_TAGS[tag]])
        if tag in ("img", "source") and attrs.get("srcset"):
            self.resources += [part.split()[0] for part in attrs["srcset"].split(",") if part.strip()]


def check_site(site: Path) -> list[str]:
    """Every internal link, picture, script and stylesheet of the built site resolves (a link's #anchor included),
    and no page loads anything from the network (links to other sites are fine: a reader follows them or not)."""
    pages = {p.relative_to(site).as_posix(): p for p in sorted(site.rglob("*.html"))}
    parsed: dict[str, _Refs] = {}
    for rel, path in pages.items():
        parsed[rel] = _Refs()
        parsed[rel].feed(path.read_text(errors="replace"))
    problems = []
    for rel, refs in parsed.items():
        for url, kind in [(u, "link") for u in refs.links] + [(u, "resource") for u in refs.resources]:
            if url.startswith(("http://", "https://", "//")):
                if kind == "resource":
                    problems.append(f"{rel}: loads {url} from the network")
                continue
            if SCHEME.match(url) or url == "#":  # mailto:, data:, javascript:
                continue
            path, _, frag = unquote(url).partition("#")
            path = path.split("?")[0]
            if not path:
                target = rel
            elif path.startswith("/"):
                target = posixpath.normpath(path.lstrip("/") or ".")
            else:
                target = posixpath.normpath(posixpath.join(posixpath.dirname(rel), path))
            if (site / target).is_dir():
                target = posixpath.join(target, "index.html")
            if target.startswith("..") or not (site / target).is_file():
                problems.append(f"{rel}: {kind} {url} leads nowhere")
            elif frag and target in parsed and frag not in parsed[target].ids:
                problems.append(f"{rel}: link {url}: {target} has no #{frag}")
    return problems


def build(root: Path = ROOT, out: Path = OUT, quiet: bool = False) -> Stager:
    """Stage the book's pages and render them into out/site; raises CalledProcessError if MkDocs fails."""
    book = load_book(root)
    stager = Stager(root, out / "docs", book).run()
    config = out / "mkdocs.yml"
    config.write_text(mkdocs_config(book, out))
    cmd = [sys.executable, "-m", "mkdocs", "build", "--clean", "-f", str(config)] + (["--quiet"] if quiet else [])
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, not ours to print
    subprocess.run(cmd, check=True, cwd=out, env=env)
    return stager


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where docs/ and site/ go (default: build/book)")
    parser.add_argument("--quiet", action="store_true", help="MkDocs prints warnings and errors only")
    parser.add_argument("--check", action="store_true", help="exit 1 when a link or picture leads nowhere")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    for problem in nav_problems():
        print(f"!! {problem}")
    stager = build(out=args.out.resolve(), quiet=args.quiet)
    problems = stager.problems + check_site(args.out.resolve() / "site")
    for problem in problems:
        print(f"!! {problem}")
    site = args.out.resolve() / "site"
    site = site.relative_to(Path.cwd()) if site.is_relative_to(Path.cwd()) else site
    print(f">> the book: {len(load_book().pages)} pages, {len(stager.code)} source files, {len(stager.copied)} "
          f"pictures and files, in {site} ({time.perf_counter() - start:.1f} s)")
    print(f"   read it: python -m http.server -d {site} --bind 127.0.0.1 8000, then open http://127.0.0.1:8000/")
    if problems:
        print(f"!! {len(problems)} broken links or pictures (above)")
    return 1 if problems and args.check else 0


if __name__ == "__main__":
    sys.exit(main())

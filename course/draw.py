"""Drawing helpers: deterministic graphviz DOT source, rendered to SVG when the `dot` binary exists.

Cache structures build DOT text with `Dot` (no graphviz needed, so tests can compare strings); the
notebooks call `show()`, which renders SVG through `dot` or falls back to the DOT text itself. The lesson
figures (`python -m course figures`) run the chapters' structures on token ids of a toy vocabulary, `WORDS`,
so that a picture reads as text without a tokenizer.
"""
from __future__ import annotations

import re
import shutil
import subprocess


def esc(text: object) -> str:
    """A string safe inside a double-quoted DOT label (newlines become left-justified line breaks)."""
    s = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return s.replace("\n", "\\l")


class Dot:
    """A tiny DOT writer: nodes and edges in insertion order, so equal structures give equal text."""

    def __init__(self, name: str, rankdir: str = "TB", **graph_attrs: str) -> None:
        attrs = {"rankdir": rankdir, **graph_attrs}
        self.lines = [f"digraph {name} {{"] + [f'  {k}="{esc(v)}";' for k, v in attrs.items()]
        self.lines.append('  node [fontname="Helvetica", fontsize=10, shape=box, style="rounded,filled", '
                          'fillcolor="white"];')
        self.lines.append('  edge [fontname="Helvetica", fontsize=9];')

    @staticmethod
    def _attrs(attrs: dict[str, object]) -> str:
        return ", ".join(f'{k}="{esc(v)}"' for k, v in attrs.items() if v is not None)

    def node(self, node_id: str, label: str, **attrs: object) -> Dot:
        self.lines.append(f'  "{esc(node_id)}" [{self._attrs({"label": label, **attrs})}];')
        return self

    def edge(self, src: str, dst: str, label: str | None = None, **attrs: object) -> Dot:
        self.lines.append(f'  "{esc(src)}" -> "{esc(dst)}" [{self._attrs({"label": label, **attrs})}];')
        return self

    def raw(self, line: str) -> Dot:
        self.lines.append("  " + line)
        return self

    def source(self) -> str:
        return "\n".join(self.lines + ["}"]) + "\n"


# One token per word: the lesson figures' requests, a chat with a shared system prompt, need no more than this.
WORDS = ("<s>", "system", "user", "You", "are", "a", "helpful", "assistant", ".", "What", "is", "2+2", "3+3",
         "5+5", "?", "It", "4", "6", "10")


def word_ids(text: str) -> list[int]:
    """Token ids of space-separated words of `WORDS` (a figure's prompt, written as text)."""
    unknown = [w for w in text.split() if w not in WORDS]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not in the figures' toy vocabulary WORDS")
    return [WORDS.index(w) for w in text.split()]


def words(token_ids: list[int]) -> str:
    """The text of toy token ids: what the pictures print on edges and blocks."""
    return " ".join(WORDS[t] for t in token_ids)


def has_dot() -> bool:
    return shutil.which("dot") is not None


def render_svg(source: str) -> str | None:
    """SVG text from DOT source, or None when graphviz's `dot` binary is missing. Without graphviz's comments
    (its version banner, one per node and edge): nothing a browser draws, and a committed picture then
    changes less from one graphviz version to the next."""
    if not has_dot():
        return None
    svg = subprocess.run(["dot", "-Tsvg"], input=source, capture_output=True, text=True, check=True).stdout
    return re.sub(r"<!--.*?-->\n?", "", svg, flags=re.S)


def show(source: str):
    """For notebooks: the picture if graphviz is installed, else the DOT text (still readable)."""
    from IPython.display import SVG, Markdown

    svg = render_svg(source)
    if svg is not None:
        return SVG(svg)
    return Markdown("*(graphviz `dot` not installed — DOT source shown)*\n```dot\n" + source + "```")

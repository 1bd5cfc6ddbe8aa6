"""Drawing helpers: deterministic graphviz DOT source, rendered to SVG when the `dot` binary exists.

Cache structures build DOT text with `Dot` (no graphviz needed, so tests can compare strings); the
notebooks call `show()`, which renders SVG through `dot` or falls back to the DOT text itself.
"""
from __future__ import annotations

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


def has_dot() -> bool:
    return shutil.which("dot") is not None


def render_svg(source: str) -> str | None:
    """SVG text from DOT source, or None when graphviz's `dot` binary is missing."""
    if not has_dot():
        return None
    return subprocess.run(["dot", "-Tsvg"], input=source, capture_output=True, text=True, check=True).stdout


def show(source: str):
    """For notebooks: the picture if graphviz is installed, else the DOT text (still readable)."""
    from IPython.display import SVG, Markdown

    svg = render_svg(source)
    if svg is not None:
        return SVG(svg)
    return Markdown("*(graphviz `dot` not installed — DOT source shown)*\n```dot\n" + source + "```")

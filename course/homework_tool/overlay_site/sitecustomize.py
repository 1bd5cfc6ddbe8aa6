"""Put on PYTHONPATH by `python -m course homework run|notebook`: every Python process started under it (the demo,
a notebook's kernel) imports the chapters that KVCOURSE_HOMEWORK names from the student's copies, whatever else is
on sys.path (the repository root comes first under `python -m`, and the venv's .pth file adds it too).

KVCOURSE_HOMEWORK is a JSON object, package -> the folder of its copy. Each package is imported from the copy's
__init__.py with the copy as its only search location, so its submodules come from the copy as well; every other
package is found as usual. Standard library only: this runs before anything else in every such process."""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys


class _Copies(importlib.abc.MetaPathFinder):
    """Finds the student's copy of each package it maps, before any other finder looks."""

    def __init__(self, copies: dict[str, str]) -> None:
        self.copies = copies

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 (the finder protocol)
        folder = self.copies.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, os.path.join(folder, "__init__.py"),
                                                      submodule_search_locations=[folder])


def _install() -> None:
    raw = os.environ.get("KVCOURSE_HOMEWORK")
    if not raw:
        return
    copies = {str(k): str(v) for k, v in json.loads(raw).items()}
    sys.meta_path.insert(0, _Copies(copies))


_install()

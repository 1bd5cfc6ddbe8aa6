"""Measurement, apart from teaching: every bench, report and GPU measure of the course, one subpackage per chapter.

A chapter package holds what its lesson teaches; what measures it lives here and imports it. `python -m course bench`
runs a chapter's bench (`benchmarks/stepNN/bench.py`), `python -m course report --write` redraws the lessons' tables
and plots from the committed results (`benchmarks/stepNN/report.py`). The results themselves, JSON with the machine,
date and command of each run, are committed in each chapter's `results/` folder, beside the lesson that reads them.
"""

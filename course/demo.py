"""Moved to step01_kvcache/demo.py; this re-export goes once chapter 7 imports it from there."""
from step01_kvcache.demo import demo_parser  # noqa: F401

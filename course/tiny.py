"""Moved to step01_kvcache/tiny.py; this re-export goes once chapter 7 imports it from there."""
from step01_kvcache.tiny import tiny_model  # noqa: F401

"""Moved to step01_kvcache/pretrained.py; this re-export goes once chapter 7 imports it from there."""
from step01_kvcache.pretrained import DEFAULT_MODEL, load_model, load_tokenizer, timed_load  # noqa: F401

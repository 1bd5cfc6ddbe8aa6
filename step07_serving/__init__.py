"""Chapter 7: the course's engine behind an OpenAI-compatible HTTP server.

`make_app(engine, tokenizer, name)` serves any engine of chapters 2-5; `python -m step07_serving serve` serves the
real model."""
from .async_engine import AsyncEngine, Delta, EngineDead
from .server import make_app, running

__all__ = ["AsyncEngine", "Delta", "EngineDead", "make_app", "running"]

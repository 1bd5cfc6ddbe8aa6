"""Chapter 7's block for `python -m course report`: what the server answers, endpoint by endpoint."""
from __future__ import annotations

from course.report import Rendered, register, table

ENDPOINTS = [("`POST /v1/completions`", "a text or token ids; JSON, or server-sent events with `stream`"),
             ("`POST /v1/chat/completions`", "messages, through the model's chat template; JSON or events"),
             ("`GET /v1/models`", "the one model served"),
             ("`GET /metrics`", "Prometheus' text format, under vLLM's names: running, waiting, KV usage, prefix hits"),
             ("`GET /health`", "ok while the engine loop runs, 503 otherwise")]


def headline() -> str:
    return ("the course's engine behind an OpenAI-compatible server: `POST /v1/completions`, "
            "`POST /v1/chat/completions`, `GET /v1/models`, `GET /health`")


@register("step07", headline)
def render() -> Rendered:
    lines = ["The server's endpoints, each checked by `tests/step07/` through the `openai` client or `httpx`:", ""]
    return "\n".join(lines + table(["endpoint", "answers"], [list(e) for e in ENDPOINTS])) + "\n", {}

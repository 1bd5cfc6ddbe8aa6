"""Text that grows with a request's tokens, handed out a piece at a time for streaming.

Decoding each new token alone would cut a character whose bytes span two tokens (an emoji, most non-Latin text in a
byte-level BPE) and lose the spaces a tokenizer attaches to the next token. So the whole answer is decoded each time
and only the part past what was sent goes out, holding back a trailing U+FFFD (the replacement character: the bytes
of an unfinished character) until the next token completes it. That costs O(answer) per delta, fine for answers of a
few hundred tokens; vLLM's detokenizer decodes a sliding window (`prefix_offset`, `read_offset`) to stay O(1).
"""
from __future__ import annotations


class IncrementalText:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.sent = 0  # characters handed out

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """The new text after `token_ids` (all of it when `final`)."""
        self.token_ids += token_ids
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        end = len(text) if final else len(text.rstrip("\ufffd"))
        piece = text[self.sent:end]
        self.sent = max(self.sent, end)
        return piece

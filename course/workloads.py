"""The shared workloads every chapter benchmarks, written for this course.

A workload is a list of chats in arrival order. Token ids come from the real tokenizer's chat template, so
the numbers a chapter reports (hit rate, TTFT speed-up) are the ones a student reproduces. Each workload
exists to expose one behaviour of a KV cache:

- `short`: 3 personas x 3 rounds of ~144-token requests; reuse comes only from a persona's system prompt in
  rounds 2 and 3 (ideal token-level hit rate here 55.9%; the Pico-vLLM write-up reported 62.8% with its own texts).
- `long`: one 2,074-token reference text (2,082 shared tokens with the template) + 8 short questions; warm
  TTFT is bounded by total/new tokens.
- `shared_prefix`: 10 requests sharing a long prefix, run twice; round 2 must hit everything.
- `batch`: 8 ragged, unrelated requests (~20 to ~300 tokens) for continuous batching and memory waste.
- `diverge`: 4 requests sharing exactly 16*4 + 7 = 71 tokens: a token radix tree reuses all 71, a cache
  of hashed 16-token blocks only 64.
- `multi_doc`: 4 documents x 3 questions, arriving interleaved (document 1, 2, 3, 4, 1, 2, ...) and all at once:
  in a pool too small for every document, arrival order evicts each document before its next question
  comes, and ordering the queue by cached prefix (chapter 4's scheduling policies) keeps it.
- `edit`: 8 requests that edit or quote a paragraph of the `long` workload's manual (repeat it, fix its typos, put
  each sentence on a line, quote one sentence): answers that copy from their prompt, where speculative decoding
  with prompt lookup (chapter 2) drafts what the model is about to write.

`python -m course workloads` prints their measured token counts (course/workloads_page.py), and WORKLOADS.md holds
them as a table.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean

from .chat import chat, chat_ids

TEXTS = Path(__file__).parent / "workload_texts"
BLOCK = 16  # the block size the chapters page and hash with; `diverge` is built around it
DIVERGE_SHARED_PREFIX = 16 * 4 + 7  # tokens shared by every `diverge` request (checked by the tests)


@dataclass(frozen=True)
class Workload:
    """A named list of chats, one per request, in arrival order; `rounds` says how often it is replayed."""

    name: str
    description: str
    messages: list[list[dict]] = field(repr=False)
    rounds: int = 1

    def prompts(self, tokenizer) -> list[list[int]]:
        """Token ids per request for one round: the chat template with the assistant's generation prompt."""
        return [chat_ids(tokenizer, messages) for messages in self.messages]


def shared_prefix_len(prompts: list[list[int]]) -> int:
    """Length of the longest token prefix common to all prompts (0 for none) - what every request can reuse."""
    if not prompts:
        return 0
    n = min(len(p) for p in prompts)
    first = prompts[0]
    for i in range(n):
        if any(p[i] != first[i] for p in prompts[1:]):
            return i
    return n


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def reusable_tokens(prompts: list[list[int]]) -> list[int]:
    """Per request, the longest prefix it shares with any earlier request: what an ideal token cache reuses."""
    return [max((_lcp(p, q) for q in prompts[:i]), default=0) for i, p in enumerate(prompts)]


# --- short: three personas, three rounds -------------------------------------------------------------------

_PERSONAS = {
    "assistant": (
        "You are Juniper, a friendly general-purpose assistant for a small public library. You help visitors "
        "with everyday questions about books, study skills, travel planning, cooking, and household "
        "tasks. Answer in plain, warm language and keep replies under 150 words unless the visitor asks for "
        "more. When you are not sure of a fact, say so plainly instead of guessing, "
        "and suggest where the visitor might check. Never invent titles, dates, or quotations. If a question "
        "needs a professional, such as a doctor or lawyer, say that gently and offer general background only."
    ),
    "coder": (
        "You are Forge, a careful programming assistant for engineers who write Python and some C. Prefer "
        "short, working examples over long explanations, and show code in fenced blocks with the language "
        "named. Use the standard library first and mention third-party packages only when they clearly help. "
        "Point out edge cases, such as empty inputs, off-by-one errors, and integer overflow, whenever they "
        "matter. When a request is ambiguous, state the assumption you chose in one sentence before the code. "
        "Never claim code was tested unless the user shows output from running it."
    ),
    "analyst": (
        "You are Ledger, a data analyst who helps a small business owner understand numbers. You explain "
        "averages, growth rates, margins, and simple charts without jargon, and you always show the arithmetic "
        "step by step so the owner can check it. When data is missing or looks odd, you say what you would "
        "need to know before drawing a conclusion. Round money to two decimal places and percentages to one. "
        "Separate facts taken from the data from your own interpretation, and label the interpretation "
        "clearly. Keep each answer focused on the decision the owner faces."
    ),
}

_SHORT_QUESTIONS = {
    "assistant": (
        "Can you suggest three novels for a teenager who loved reading mystery stories this summer?",
        "What is a simple way to keep fresh herbs like basil from wilting in the kitchen?",
        "How should I plan a quiet weekend trip by train with two young children?",
    ),
    "coder": (
        "Write a Python function that splits a list into chunks of a given size.",
        "How do I read a large CSV file line by line without loading it all into memory?",
        "Why does my recursive Fibonacci function get so slow for inputs above thirty-five?",
    ),
    "analyst": (
        "Sales were 4,200 in March and 5,040 in April. What was the growth rate?",
        "Our coffee costs 1.10 per cup to make and sells for 3.50. What is the margin?",
        "Should I trust an average order value computed from only twelve orders placed last week, or wait "
        "for more?",
    ),
}


def _short() -> Workload:
    chats = [chat(_SHORT_QUESTIONS[p][r], _PERSONAS[p]) for r in range(3) for p in _PERSONAS]
    return Workload("short", "3 personas (assistant, coder, analyst) x 3 rounds, ~144 tokens each; "
                    "reuse comes only from a persona's system prompt in rounds 2 and 3", chats)


# --- long: one reference manual, eight questions -----------------------------------------------------------

_LONG_QUESTIONS = (
    "According to the manual, what happens to writers when a third immutable memtable would be created, and "
    "which parameter controls how many frozen memtables may wait?",
    "If sync_mode is set to never and the machine loses power, how much acknowledged data can be lost, and is "
    "the vault still consistent afterwards?",
    "Explain how the score of level L0 is computed differently from the scores of the deeper levels during "
    "leveled compaction.",
    "A read-heavy service shows a page cache hit rate of 82 percent. What does the reference suggest, and "
    "which parameter should the operator change?",
    "Why can a snapshot that stays open for a whole hour make the vault grow on disk, even when no new keys "
    "are being written?",
    "What does error T-202 mean, and what does Tessera do with the partial batch at the end of a truncated "
    "log segment when the vault is opened?",
    "With the default settings, at how many L0 slabs are writes first slowed down, and at how many are they "
    "stopped completely?",
    "Describe the prefix compression used inside a slab page, including what a restart point is and how "
    "often one occurs by default.",
)


def _long() -> Workload:
    manual = (TEXTS / "long_reference.txt").read_text(encoding="utf-8").strip()
    chats = [chat(q, manual) for q in _LONG_QUESTIONS]
    return Workload("long", "a 2,074-token reference manual as the system prompt + 8 questions: every request "
                    "starts with the same 2,082 tokens (the manual in the chat template's system turn, and the user "
                    "turn's opening), then 28-41 of its own; warm TTFT is bounded by prompt / computed tokens", chats)


# --- shared_prefix: ten requests behind one long shared prefix, run twice ---------------------------------

_SHARED_PREFIX_SYSTEM = (
    "You are the operations assistant of Harbor Lane Bikes, a bicycle rental shop with two locations near the "
    "waterfront. Staff ask you questions during their shifts. Answer only from the shift notes the user "
    "provides and from the rules below; if the notes do not say, answer that you do not know and name the "
    "person to ask. Keep answers to three sentences or fewer. Use the 24-hour clock for times and euros for "
    "prices. Rentals are charged per started hour, helmets are free, and every bike must be checked for brakes, "
    "tyre pressure and lights before it leaves the shop. Never promise refunds; only the shift lead can "
    "approve them."
)

_SHARED_PREFIX_NOTES = (
    "Shift notes for Saturday, north location.\n"
    "- Opening: Maria opens at 08:30; the shop opens to customers at 09:00 and closes at 19:00.\n"
    "- Shift lead: Tomas until 14:00, then Aisha until closing.\n"
    "- Fleet: 24 city bikes, 8 electric bikes, 5 tandems, 6 child seats. Electric bike 7 has a weak battery "
    "and is out of service until the replacement arrives on Monday.\n"
    "- Prices today: city bike 6 euros per hour, electric bike 11 euros per hour, tandem 10 euros per hour, "
    "day pass for a city bike 30 euros. The school group at 11:00 has a 20 percent discount.\n"
    "- Bookings: school group of 12 at 11:00 (city bikes, teacher Mr. Okafor); family of four at 13:30 "
    "(one tandem, two city bikes, one child seat); tour guide Lena picks up 6 electric bikes at 15:00.\n"
    "- Weather: rain expected after 16:00; offer rain ponchos, 3 euros each.\n"
    "- Deposits: 50 euros per bike, 200 euros per electric bike, card only."
)

_SHARED_PREFIX_QUESTIONS = (
    "How many electric bikes can we rent out today?",
    "Who should I ask about a refund at 15:30?",
    "What will the school group pay per bike per hour?",
    "What do I need to give the family that arrives at 13:30?",
    "Can a customer pay the electric bike deposit in cash?",
    "What time do customers get in today?",
    "What should I offer riders who return late in the afternoon?",
    "Who is the teacher with the school group?",
    "How much is a day pass for a city bike?",
    "What must I check before a tandem leaves the shop?",
)


def _shared_prefix() -> Workload:
    chats = [chat(f"{_SHARED_PREFIX_NOTES}\n\nQuestion: {q}", _SHARED_PREFIX_SYSTEM) for q in _SHARED_PREFIX_QUESTIONS]
    return Workload("shared_prefix", "10 requests sharing a system prompt and shift notes, each with its own short "
                    "question; run twice (round 2 must be all hits, refcounts back to baseline)", chats, rounds=2)


# --- batch: eight unrelated requests of very different lengths ---------------------------------------------

# each a system prompt and a user message; one of them carries a 250-word story
_BATCH = [(r["system"], r["user"]) for r in json.loads((TEXTS / "batch.json").read_text(encoding="utf-8"))]


def _batch() -> Workload:
    chats = [chat(user, system) for system, user in _BATCH]
    return Workload("batch", "8 unrelated requests of very different lengths (~20 to ~300 tokens), each with its "
                    "own system prompt: continuous batching and KV memory waste, no prefix reuse", chats)


# --- diverge: a shared prefix that ends inside a 16-token block --------------------------------------------

_DIVERGE_SYSTEM = ("You are a concise travel assistant for visitors to Portugal. Answer in two sentences and add one "
                  "practical tip about opening hours, prices or transport.")
_DIVERGE_STEM = ("My sister and I are visiting Lisbon for three days in late October. We both enjoy long walks, old "
                 "tiled buildings, small art museums, river ferries and really good")
_DIVERGE_ENDINGS = (
    " seafood. Which neighbourhood should we stay in?",
    " coffee. Where can we find a quiet cafe near the river?",
    " music. Is there somewhere to hear live fado on a weeknight?",
    " views. Which viewpoint is best at sunset?",
)


def _diverge() -> Workload:
    chats = [chat(_DIVERGE_STEM + end, _DIVERGE_SYSTEM) for end in _DIVERGE_ENDINGS]
    return Workload("diverge", f"4 requests sharing {DIVERGE_SHARED_PREFIX} tokens (= {BLOCK}*"
                    f"{DIVERGE_SHARED_PREFIX // BLOCK} + {DIVERGE_SHARED_PREFIX % BLOCK}), diverging inside a "
                    f"{BLOCK}-token block: a token radix tree reuses all of them, block hashing only whole blocks",
                    chats)


# --- multi_turn: conversations that come back ------------------------------------------------------------------

# the assistant's earlier turns, scripted so that every run replays the same conversations
_ANSWERS = json.loads((TEXTS / "multi_turn_answers.json").read_text(encoding="utf-8"))


def _multi_turn() -> Workload:
    chats = []
    for turn in range(3):
        for persona in _PERSONAS:
            messages = [{"role": "system", "content": _PERSONAS[persona]}]
            for t in range(turn):
                messages += [{"role": "user", "content": _SHORT_QUESTIONS[persona][t]},
                             {"role": "assistant", "content": _ANSWERS[persona][t]}]
            chats.append(messages + [{"role": "user", "content": _SHORT_QUESTIONS[persona][turn]}])
    return Workload("multi_turn", "3 conversations (assistant, coder, analyst) x 3 turns, turn by turn: each turn "
                    "is its conversation so far plus a question, so it finds its earlier turns cached - unless "
                    "the pool had to evict them in between", chats)


# --- multi_doc: several documents, each asked several questions, the questions interleaved -------------------

_DOCS = json.loads((TEXTS / "multi_doc.json").read_text(encoding="utf-8"))  # each a document and 3 questions
MULTI_DOC_DOCUMENTS = len(_DOCS)  # request i of `multi_doc` asks about document i % MULTI_DOC_DOCUMENTS


def _multi_doc() -> Workload:
    chats = [chat(d["questions"][r], d["document"]) for r in range(3) for d in _DOCS]
    return Workload("multi_doc", f"{MULTI_DOC_DOCUMENTS} documents (~190 tokens each) x 3 questions, interleaved "
                    "(document 1, 2, 3, 4, 1, 2, ...) and arriving together: in a pool too small for every document, "
                    "arrival order evicts each document before its next question; a cache-aware order keeps it", chats)


# --- edit: answers that copy from the prompt -------------------------------------------------------------------

# (instruction, paragraph of the manual, typos to put in: (word, misspelling)); the paragraphs are the manual's,
# counted from 0 over its blank-line-separated blocks (section titles included)
_EDITS = (
    ("Repeat the following paragraph word for word.", 5, ()),
    ("Fix the spelling mistakes in this paragraph and write the corrected paragraph in full.", 10,
     (("memtable ", "memtabel "), ("writers", "writters"))),
    ("Rewrite this paragraph with every sentence on a new line.", 13, ()),
    ("Quote the sentence of this passage that mentions the bloom filter.", 12, ()),
    ("Fix the spelling mistakes in this paragraph and write the corrected paragraph in full.", 8,
     (("sequence", "sequnce"), ("memtable", "memtible"))),
    ("Repeat the following paragraph word for word.", 18, ()),
    ("Rewrite this paragraph with every sentence on a new line.", 15, ()),
    ("Quote the sentence of this passage that says what error T-202 means.", 23, ()),
)


_EDIT_SYSTEM = "You are a careful copy editor. Do exactly what the user asks with the text they give you."


def _edit() -> Workload:
    paragraphs = (TEXTS / "long_reference.txt").read_text(encoding="utf-8").strip().split("\n\n")
    chats = []
    for instruction, index, typos in _EDITS:
        text = paragraphs[index]
        for word, typo in typos:
            text = text.replace(word, typo, 1)
        chats.append(chat(f"{instruction}\n\n{text}", _EDIT_SYSTEM))
    return Workload("edit", f"{len(chats)} requests that repeat, correct, reflow or quote a paragraph of the `long` "
                    "workload's manual: answers that copy from their prompt (speculative decoding's best case)", chats)


_BUILDERS = {"short": _short, "long": _long, "shared_prefix": _shared_prefix, "batch": _batch, "diverge": _diverge,
             "multi_turn": _multi_turn, "multi_doc": _multi_doc, "edit": _edit}
WORKLOADS: tuple[str, ...] = tuple(_BUILDERS)


def get_workload(name: str) -> Workload:
    """The workload called `name`; a ValueError names the valid ones, so a typo in `--workload` is obvious."""
    try:
        builder = _BUILDERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown workload {name!r}; valid names: {', '.join(WORKLOADS)}") from None
    return builder()


# --- measuring ---------------------------------------------------------------------------------------------

def measure(workload: Workload, tokenizer) -> dict:
    """Token statistics of one workload: sizes, the prefix all requests share, and an ideal cache's hit rate."""
    prompts = workload.prompts(tokenizer)
    lengths = [len(p) for p in prompts]
    shared = shared_prefix_len(prompts)
    new = [n - shared for n in lengths]
    # An ideal token-granular cache over all rounds: round 1 reuses prefixes of earlier requests, later rounds
    # find every prompt whole (a real engine still recomputes the last token to get its logits).
    reused = sum(reusable_tokens(prompts)) + (workload.rounds - 1) * sum(lengths)
    total = workload.rounds * sum(lengths)
    return {
        "requests": len(prompts), "rounds": workload.rounds,
        "tokens_min": min(lengths), "tokens_mean": round(mean(lengths), 1), "tokens_max": max(lengths),
        "shared_prefix": shared, "new_min": min(new), "new_max": max(new),
        "ideal_hit_rate": round(reused / total, 3),
    }

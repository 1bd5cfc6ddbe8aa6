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

`python -m course workloads [NAME ...] [--json]` prints their measured token counts.
"""
from __future__ import annotations

import argparse
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
    return Workload("long", "a 2,074-token reference manual as the system prompt (2,082 tokens shared "
                    "with the chat template, the size of the Pico-vLLM write-up's 2,083) + 8 questions of 28-48 new "
                    "tokens; warm TTFT is bounded by total/new tokens", chats)


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

_BATCH_STORY = (
    "The lighthouse on Corrow Point was automated in the spring, and the keeper, a quiet man named Edvin who "
    "had tended the lamp for twenty-two years, was told he could stay in the cottage until the end of the "
    "summer. He spent the first weeks doing what he had always done: climbing the spiral stairs at dusk, "
    "wiping the great lens, writing the weather in his logbook. The new machine did not need him, and it did "
    "not seem to mind him either. In July a girl from the village began bringing him the post on her bicycle. "
    "She asked about the ships he had seen, the storms, the winter the harbour froze, and he found that the "
    "stories came back to him more easily than he expected. By August she had filled a school notebook with "
    "them. On his last evening he climbed the stairs once more, not to work but to watch the beam sweep "
    "across the water, steady and indifferent, and he was surprised to feel glad that it would go on without "
    "him. He left the logbook on the table for whoever came next, with one final entry: wind from the west, "
    "sea calm, light burning well."
)

_BATCH = (
    ("You are a patient maths tutor.",
     "A rectangle has a perimeter of 36 centimetres and its length is twice its width. Find its area, and "
     "explain each step so that a twelve-year-old could follow the reasoning."),
    ("Reply in one word.", "Capital of Peru?"),
    ("You are a literary editor who gives honest, specific feedback.",
     "Here is a short story I wrote for a competition with a limit of 250 words. Please tell me what works, "
     "what does not, and suggest a better title.\n\n" + _BATCH_STORY),
    ("You translate English into simple Spanish.", "Please translate: The museum opens at ten and is free on "
     "Sundays, but the garden closes early in winter."),
    ("You write polite, concise emails for a busy office manager.",
     "Draft an email to the building's cleaning company. Our office moves from the third floor to the fifth "
     "floor on 14 June. Cleaning should continue on the third floor until 13 June and start on the fifth "
     "floor on 15 June. The fifth floor has two extra meeting rooms and a small kitchen, so please send a new "
     "quote. Also ask whether the Friday evening visit could move to Thursday evening, because we now hold a "
     "team event on Fridays. Keep it friendly and under 150 words."),
    ("Answer briefly.", "Is a tomato a fruit or a vegetable?"),
    ("You are a gardening expert for cold northern climates.",
     "I live where the first frost usually comes in mid-September and the last one in late May. I have a "
     "sunny raised bed of about two square metres with sandy soil. I would like to grow something to eat "
     "besides lettuce, ideally plants that tolerate cool nights and a short season. What would you plant, "
     "when would you sow each crop, and how should I improve the soil before spring?"),
    ("You are a careful code reviewer.",
     "Review this Python snippet:\n\ndef average(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
     "    return total / len(xs)"),
)


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

_ANSWERS = {  # the assistant's earlier turns, scripted so that every run replays the same conversations
    "assistant": (
        "Three good choices: The London Eye Mystery by Siobhan Dowd, a clever puzzle about a boy who vanishes from a "
        "sealed capsule; Holes by Louis Sachar, funny and full of buried clues; and Murder Most Unladylike by Robin "
        "Stevens, a boarding-school case solved by two friends.",
        "Treat basil like cut flowers: trim the stems, stand the bunch in a glass of water on the counter, away from "
        "direct sun, and cover the leaves loosely with a bag. Change the water every two days and keep it out of the "
        "fridge, where the leaves turn black.",
    ),
    "coder": (
        "```python\ndef chunks(items, size):\n    if size < 1:\n        raise ValueError('size must be positive')\n"
        "    return [items[i:i + size] for i in range(0, len(items), size)]\n```\nThe last chunk may be shorter; an "
        "empty list gives an empty result.",
        "Use the csv module on an open file: it reads one row at a time.\n```python\nimport csv\n\nwith open(path, "
        "newline='') as f:\n    for row in csv.reader(f):\n        handle(row)\n```\nMemory stays flat however "
        "large the file is.",
    ),
    "analyst": (
        "Growth = (5,040 - 4,200) / 4,200 = 840 / 4,200 = 0.2, so sales grew by 20.0% from March to April. One "
        "month is a short window: compare with April of last year before reading a trend into it.",
        "Margin per cup = 3.50 - 1.10 = 2.40, and 2.40 / 3.50 = 0.686, so the gross margin is 68.6%. Rent, wages "
        "and waste are not in the 1.10, so the margin left after them will be lower.",
    ),
}


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

_DOCS = (
    ("You answer questions about the Millbrook Museum of Clocks using only this visitor guide.\n"
     "The museum is open Tuesday to Sunday from 10:00 to 17:30 and closed on Mondays except public holidays. "
     "Tickets cost 9 euros for adults, 5 euros for students and visitors over 65, and nothing for children under "
     "12. The ground floor holds the tower clock gallery, where the 1742 Harwell tower movement strikes every "
     "quarter hour. The first floor shows pocket watches and marine chronometers; flash photography is not "
     "allowed there. Guided tours in English start at 11:00 and 15:00 and last 50 minutes. The workshop in the "
     "basement, where restorers repair clocks in front of visitors, is open on Saturdays only. Lockers are free "
     "and take a 1 euro coin that is returned. The cafe closes half an hour before the museum."),
    ("You answer questions about the Fernside community garden using only its rules.\n"
     "Members rent one raised bed each for 40 euros a season, from March to October. Beds must be planted by "
     "the end of April or the committee offers them to the waiting list. Water comes from the two rain tanks "
     "first; the mains tap may be used only between 18:00 and 21:00 in dry spells. Chemical pesticides are "
     "banned, but slug traps and netting are welcome. Tools in the green shed are shared and must be cleaned "
     "and hung back on their hooks. Compost bins are turned on the first Sunday of each month, and every member "
     "helps at least twice a season. Dogs must stay on a lead on the paths. Members who leave a bed untended for "
     "three weeks receive one reminder before the bed is reassigned."),
    ("You answer questions about the Northline regional rail ticket rules using only this summary.\n"
     "A single ticket is valid for three hours from the time it is stamped and allows changes between trains "
     "on the same route. A day pass costs 14 euros and covers all zones until 04:00 the next morning. Children "
     "under six travel free with an adult; children from six to fourteen pay half fare. Bicycles ride for 3 "
     "euros, except on weekday trains leaving between 07:00 and 09:00, when they are not allowed. A ticket "
     "bought on board costs 2 euros more than one from a machine or the app. Passengers without a valid ticket "
     "pay a 60 euro penalty, reduced to 10 euros if they show a season ticket they forgot within seven days. "
     "Delays over 30 minutes give a voucher for a quarter of the fare."),
    ("You answer questions about release 3.2 of the Quill note-taking app using only these release notes.\n"
     "Release 3.2 adds offline mode: notes edited without a connection are kept on the device and synced when "
     "the app is online again; if the same note changed on two devices, both versions are kept and marked as a "
     "conflict. Search now finds words inside attached PDF files, but not inside images. The export menu gains "
     "Markdown and drops the old RTF format. Tags can be nested up to three levels deep. The minimum supported "
     "versions are now Android 10 and iOS 15. A known issue: reminders set for the last day of a month may fire "
     "a day late on iOS; a fix is planned for 3.2.1. Free accounts keep 2 gigabytes of storage; paid accounts "
     "keep 50 gigabytes and the full version history."),
)

_DOC_QUESTIONS = (
    ("Can I visit the museum on a Monday?", "How much do two adults and a ten-year-old pay to get in?",
     "When can I watch the restorers at work?"),
    ("What happens if I have not planted my bed by May?", "May I use the mains tap at noon in a dry spell?",
     "Is netting against birds allowed?"),
    ("Can I take my bicycle on the 08:15 train on a Tuesday?", "How much does a nine-year-old pay?",
     "What do I pay if I forgot my season ticket at home?"),
    ("What happens when I edit the same note on my phone and my laptop while both are offline?",
     "Can search find words in a photo of a whiteboard?", "Which export formats were added or removed?"),
)

MULTI_DOC_DOCUMENTS = len(_DOCS)  # request i of `multi_doc` asks about document i % MULTI_DOC_DOCUMENTS


def _multi_doc() -> Workload:
    chats = [chat(questions[r], doc) for r in range(3) for doc, questions in zip(_DOCS, _DOC_QUESTIONS)]
    return Workload("multi_doc", f"{MULTI_DOC_DOCUMENTS} documents (~190 tokens each) x 3 questions, interleaved "
                    "(document 1, 2, 3, 4, 1, 2, ...) and arriving together: in a pool too small for every document, "
                    "arrival order evicts each document before its next question; a cache-aware order keeps it", chats)


_BUILDERS = {"short": _short, "long": _long, "shared_prefix": _shared_prefix, "batch": _batch, "diverge": _diverge,
             "multi_turn": _multi_turn, "multi_doc": _multi_doc}
WORKLOADS: tuple[str, ...] = tuple(_BUILDERS)


def get_workload(name: str) -> Workload:
    """The workload called `name`; a ValueError names the valid ones, so a typo in `--workload` is obvious."""
    try:
        builder = _BUILDERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown workload {name!r}; valid names: {', '.join(WORKLOADS)}") from None
    return builder()


# --- command line ------------------------------------------------------------------------------------------

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


def main(argv: list[str]) -> int:
    """`python -m course workloads [NAME ...] [--json]`: a table of measured token counts per workload."""
    parser = argparse.ArgumentParser(prog="python -m course workloads", description=main.__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"workloads to measure (default: all of "
                        f"{', '.join(WORKLOADS)})")
    parser.add_argument("--json", action="store_true", help="also print one JSON object on the last line")
    args = parser.parse_args(argv)
    names = args.names or list(WORKLOADS)
    try:
        workloads = [get_workload(n) for n in names]
    except ValueError as e:
        parser.error(str(e))

    from .pretrained import load_tokenizer

    tokenizer = load_tokenizer()
    stats = {w.name: measure(w, tokenizer) for w in workloads}
    header = (f"{'workload':<9} {'requests':>8} {'rounds':>6} {'tok min':>7} {'tok mean':>8} {'tok max':>7} "
              f"{'shared':>6} {'new min':>7} {'new max':>7} {'ideal hit':>9}")
    print(header)
    print("-" * len(header))
    for name, s in stats.items():
        print(f"{name:<9} {s['requests']:>8} {s['rounds']:>6} {s['tokens_min']:>7} {s['tokens_mean']:>8} "
              f"{s['tokens_max']:>7} {s['shared_prefix']:>6} {s['new_min']:>7} {s['new_max']:>7} "
              f"{s['ideal_hit_rate']:>9.1%}")
    print("\ntokens: templated prompt with generation prompt; shared: longest prefix common to all requests; "
          "new: tokens after it;\nideal hit: tokens a perfect token-level prefix cache reuses over all rounds.")
    if args.json:
        print(json.dumps({"workloads": stats}))
    return 0

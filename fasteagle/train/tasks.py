"""Prompts beyond open chat, one kind of request each: translation, summarization, question
answering, math word problems and retrieval-augmented QA, for evaluation and self-distillation.

ShareGPT users rarely ask these (its holdout split has no math word problem and three requests for a
summary), so most are built from the conversations' own text, in the forms users ask them:
- translation: an English paragraph of an assistant reply, "Translate ... into French|Spanish|German";
- summarization: a long assistant reply as the document to summarize;
- retrieval QA: an assistant reply as the document, and the question the user asked next about it;
- question answering: a short stand-alone question that opened a chat;
- math: GSM8K-style word problems from templates, numbers drawn by a seeded generator;
- long (training only): a chat's answers joined into one long document (1500-4000 tokens) to
  summarize or to proofread, the reply restating much of its input.
Evaluation prompts come from holdout conversations (and one seed of the templates), training prompts
from train conversations (another seed), so the two share no text.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fasteagle.train.sharegpt import (
    Conversation,
    Split,
    first_user_prompt,
    in_split,
    iter_conversations,
    looks_english,
)

CATEGORIES = ("translation", "summarization", "qa", "math", "rag")  # the evaluation set's, besides chat
TRAIN_ONLY = ("long",)
SOURCES = CATEGORIES + TRAIN_ONLY + ("chat", "code")  # what a training prompt set draws from
LANGUAGES = ("French", "Spanish", "German")
EVAL_SEED, TRAIN_SEED = 0, 1  # the math templates' number draws

TRANSLATE = "Translate the following text into {lang}:\n\n{text}"
SUMMARIZE = "Summarize the following text in a few sentences:\n\n{text}"
RAG = ("Answer the question using only the document below.\n\nDocument:\n{doc}\n\nQuestion: {question}")
LONG = ("Summarize the following document in a few paragraphs:\n\n{text}",
        "Correct any spelling and grammar mistakes in the following text and return the whole corrected "
        "text:\n\n{text}")

# (template, number ranges) with the answer a formula of the numbers: checkable, GSM8K-like
MATH = [
    ("A bakery sells {a} loaves of bread in the morning and {b} in the afternoon. Each loaf costs ${c}. "
     "How much money does the bakery make that day?", (20, 90), (10, 60), (2, 6)),
    ("Maria reads {a} pages of a book every day. The book has {b} pages. After {c} days, how many pages does "
     "she still have to read?", (10, 30), (300, 600), (3, 9)),
    ("A train travels at {a} kilometers per hour for {b} hours, then at {c} kilometers per hour for 2 hours. "
     "How far does it travel in total?", (60, 120), (2, 5), (40, 90)),
    ("Tom has {a} marbles. He gives {b} to his sister and then buys {c} more. How many marbles does he have "
     "now?", (40, 90), (5, 30), (10, 40)),
    ("A class has {a} boys and {b} girls. Each student needs {c} notebooks for the year. How many notebooks "
     "does the class need?", (8, 20), (8, 20), (3, 8)),
    ("A garden is {a} meters long and {b} meters wide. A fence costs ${c} per meter. How much does it cost "
     "to fence the whole garden?", (5, 25), (4, 20), (3, 12)),
    ("A shop sells pencils in packs of {a}. A school needs {b} pencils. How many packs must it buy, and how "
     "many pencils are left over?", (6, 12), (100, 300), (0, 0)),
    ("Sam saves ${a} each week. He wants to buy a bike that costs ${b}. He already has ${c}. How many weeks "
     "must he save?", (10, 25), (200, 500), (20, 80)),
]


def _order(items: Iterable[tuple[str, Any]]) -> list[Any]:
    """Deterministic order by a hash of each item's key, so a pick does not follow the file's topics."""
    return [v for _, v in sorted(items, key=lambda kv: hashlib.sha256(kv[0].encode()).hexdigest())]


def _prose(text: str) -> bool:
    return "```" not in text and looks_english(text)


def _paragraphs(text: str) -> Iterator[str]:
    for p in text.split("\n\n"):
        p = p.strip()
        if 200 <= len(p) <= 700 and not p.startswith(("-", "*", "#", "1.")) and _prose(p):
            yield p


def _question(text: str) -> bool:
    """A question that stands on its own: English, one line, a few words, not a follow-up."""
    text = text.strip()
    return (15 <= len(text) <= 300 and text.endswith("?") and "\n" not in text and len(text.split()) >= 6
            and not re.match(r"(so|and|but|ok|okay|then|what about|how about)\b", text, re.I) and _prose(text))


def _key(text: str) -> str:
    return hashlib.sha256(" ".join(text.lower().split()).encode()).hexdigest()


def conversation_prompts(split: Split, path: str | Path | None = None) -> dict[str, list[dict]]:
    """Per category, every candidate prompt built from `split`'s conversations (one per conversation
    and category, so that no chat dominates), in a deterministic order. ShareGPT repeats chats under
    other ids, so a holdout prompt whose source text (a question or a reply) also occurs in a train
    conversation is left out."""
    found: dict[str, list[tuple[str, dict]]] = {c: [] for c in CATEGORIES + TRAIN_ONLY if c != "math"}
    seen_in_train: set[str] = set()
    for conv in iter_conversations(path):
        if split == "holdout" and in_split(conv.id, "train"):
            seen_in_train.update(_key(text) for _, text in conv.turns)
        if in_split(conv.id, split):
            for category, prompt, source in _from_conversation(conv):
                found[category].append((conv.id, {"id": f"{category}-{conv.id}", "category": category,
                                                  "turns": [prompt], "source": _key(source)}))
    return {c: [{k: v for k, v in p.items() if k != "source"} for p in _order(items)
                if p["source"] not in seen_in_train] for c, items in found.items()}


def _from_conversation(conv: Conversation) -> Iterator[tuple[str, str, str]]:
    """(category, prompt, the conversation text it was made from) for each kind this chat can give."""
    first = first_user_prompt(conv).strip()
    if not conv.continued and _question(first):
        yield "qa", first, first
    replies = [(i, text) for i, (role, text) in enumerate(conv.turns) if role == "assistant"]
    pick = int(hashlib.sha256(conv.id.encode()).hexdigest(), 16)  # this chat's language and long task
    lang = LANGUAGES[pick % len(LANGUAGES)]
    paragraph = next(((p, text) for _, text in replies for p in _paragraphs(text)), None)
    if paragraph:
        yield "translation", TRANSLATE.format(lang=lang, text=paragraph[0]), paragraph[1]
    doc = next((text for _, text in replies if 1500 <= len(text) <= 8000 and _prose(text)), None)
    if doc:
        yield "summarization", SUMMARIZE.format(text=doc.strip()), doc
    for i, text in replies:
        nxt = conv.turns[i + 1][1] if i + 1 < len(conv.turns) else ""
        if 800 <= len(text) <= 6000 and _prose(text) and "?" in nxt and 15 <= len(nxt) <= 300 and _prose(nxt):
            yield "rag", RAG.format(doc=text.strip(), question=nxt.strip()), text
            break
    long_doc = "\n\n".join(text.strip() for _, text in replies if _prose(text))
    if 6000 <= len(long_doc) <= 16000:
        yield "long", LONG[pick % len(LONG)].format(text=long_doc), long_doc


def math_prompts(n: int, seed: int) -> list[dict]:
    """`n` word problems, cycling through the templates with numbers from `random.Random(seed)`."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        template, *ranges = MATH[i % len(MATH)]
        a, b, c = (rng.randint(lo, hi) for lo, hi in ranges)
        out.append({"id": f"math-{seed}-{i}", "category": "math", "turns": [template.format(a=a, b=b, c=c)]})
    return out


def category_prompts(n: int, split: Split = "holdout", path: str | Path | None = None,
                     categories: tuple[str, ...] = CATEGORIES) -> list[dict]:
    """Up to `n` prompts of each of `categories` from `split` (evaluation: the holdout; training: train)."""
    found = conversation_prompts(split, path)
    math = math_prompts(n, EVAL_SEED if split == "holdout" else TRAIN_SEED)
    return [p for c in categories for p in (math if c == "math" else found[c][:n])]


def write_eval_file(out: str | Path = "assets/prompts/tasks_holdout.jsonl", n: int = 24,
                    path: str | Path | None = None) -> Path:
    """The per-category evaluation set: `n` open-chat prompts (the chat holdout's first) and `n` of each
    category above, as JSON lines of {"id", "category", "turns"}. Deterministic: the committed file is
    regenerated byte for byte."""
    import json

    from fasteagle.files import write_text
    from fasteagle.train.sharegpt import holdout_chat_prompts

    records = holdout_chat_prompts(n, path) + category_prompts(n, "holdout", path)
    write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return Path(out)


def prompt_dataset(tokenizer, counts: dict[str, int], max_prompt_tokens: int = 2048,
                   path: str | Path | None = None) -> dict[str, list]:
    """The prompt-only token dataset a target will answer (self-distillation): the first `counts[source]`
    train prompts of each source, a category above (long included), "chat" (ShareGPT) or "code" (library
    functions); prompts over `max_prompt_tokens` tokens are left out. `path`: another ShareGPT file."""
    from fasteagle.train import data as data_mod

    parts, categories = [], {c: n for c, n in counts.items() if c in CATEGORIES + TRAIN_ONLY}
    if categories:
        found = category_prompts(max(categories.values()), "train", path, categories=tuple(categories))
        records = [{"id": p["id"], "prompt": p["turns"][0]} for c, n in categories.items()
                   for p in [q for q in found if q["category"] == c][:n]]
        parts.append(data_mod.build_text_prompt_dataset(tokenizer, records, max_prompt_tokens))
    if counts.get("chat"):
        chat = data_mod.build_prompt_dataset(tokenizer, "train", max_prompt_tokens)
        parts.append({k: v[: counts["chat"]] for k, v in chat.items()})
    if counts.get("code"):
        code = data_mod.build_text_prompt_dataset(tokenizer, data_mod.library_code_prompts(), max_prompt_tokens)
        parts.append({k: v[: counts["code"]] for k, v in code.items()})
    return data_mod.join_token_datasets(*parts)


def _counts(text: str) -> dict[str, int]:
    """"translation=200,chat=100" -> {"translation": 200, "chat": 100}, every name and number checked."""
    from fasteagle.errors import FastEagleError

    out = {}
    for part in text.split(","):
        name, _, n = part.partition("=")
        if name not in SOURCES or not n.isdigit() or int(n) < 1:
            raise FastEagleError(f"--counts: {part!r} is not SOURCE=N with N >= 1 and SOURCE one of "
                                 f"{', '.join(SOURCES)}")
        out[name] = int(n)
    return out


def parser():
    """The command line (a step recipe checks its steps' arguments with it before anything runs)."""
    from fasteagle.errors import Parser

    parser = Parser(prog="python -m fasteagle.train.tasks",
                    description="Write the per-category evaluation file, or (--prompts-out) a training prompt set.")
    parser.add_argument("--out", default="assets/prompts/tasks_holdout.jsonl", help="the evaluation file")
    parser.add_argument("--prompts-out", default=None, help="write a prompt-only token dataset of train prompts")
    parser.add_argument("--counts", default="translation=100,summarization=100,qa=100,math=100,rag=100",
                        help="with --prompts-out: SOURCE=N,...: categories, long, chat, code")
    parser.add_argument("--max-prompt-tokens", type=int, default=2048)
    return parser


def main(argv: list[str] | None = None) -> int:
    from fasteagle.errors import run_command

    args = parser().parse_args(argv)

    def go() -> int:
        from fasteagle.files import check_writable

        if args.prompts_out is None:
            print(f"wrote {write_eval_file(args.out)}")
            return 0
        counts = _counts(args.counts)
        check_writable(args.prompts_out, "--prompts-out")
        from fasteagle.target import load_target
        from fasteagle.train.data import save_token_dataset

        data = prompt_dataset(load_target(None, device="cpu").tokenizer, counts, args.max_prompt_tokens)
        save_token_dataset(data, args.prompts_out)
        print(f"wrote {len(data['ids'])} prompts to {args.prompts_out}")
        return 0

    return run_command(go)


if __name__ == "__main__":
    raise SystemExit(main())

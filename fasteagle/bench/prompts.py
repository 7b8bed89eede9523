"""Prompt files: JSON lines, one prompt each, and the prompts `--tree auto` tunes on."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from fasteagle.errors import FastEagleError


def load_prompts(path: str | Path, limit: int | None = None, skip: int = 0) -> list[dict]:
    """JSON lines with `turns` (first turn used), `prompt` or `text`; optional `category`. A line
    without a prompt is an error that names it, as is a file without any. `limit` keeps the first
    that many of each category (a file of one category: its first that many), after the first `skip` of
    each (prompts a comparison with that limit never measures: for choosing among drafters)."""
    if limit is not None and limit < 1:
        raise FastEagleError(f"--limit must be at least 1 (got {limit})")
    if skip < 0:
        raise FastEagleError(f"--skip must be at least 0 (got {skip})")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise FastEagleError(f"cannot read the prompt file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise FastEagleError(f"the prompt file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                             "save it as UTF-8") from None
    rows = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FastEagleError(f"{path}:{n}: not JSON ({exc.msg})") from None
        d = d if isinstance(d, dict) else {}
        if "turns" in d:
            text = d["turns"][0] if isinstance(d["turns"], list) and d["turns"] else None
        else:
            text = d.get("prompt") or d.get("text")
        if not isinstance(text, str) or not text.strip():
            raise FastEagleError(f"{path}:{n}: no prompt (a non-empty `turns` list, `prompt` or `text`)")
        rows.append({"id": str(d.get("id", len(rows))), "category": str(d.get("category") or Path(path).stem),
                     "text": text})
    if not rows:
        raise FastEagleError(f"{path} holds no prompts")
    if not limit and not skip:
        return rows
    seen: Counter[str] = Counter()
    kept = []
    for r in rows:
        seen[r["category"]] += 1
        if skip < seen[r["category"]] <= skip + (limit or len(rows)):
            kept.append(r)
    if not kept:
        raise FastEagleError(f"{path}: --skip {skip} leaves no prompts")
    return kept


def tuning_prompts(files: list[str], limit: int | None, n: int = 3) -> list[dict]:
    """Prompts for `--tree auto` to tune on: `n` from past each file's `--limit`, taken in turn from
    the files, so the budget is not picked on the prompts it is then measured on; the first `n`
    measured ones where the files hold no more."""
    spare = [_unmeasured(f, limit) if limit else [] for f in files]
    picked = [p for group in zip(*spare) for p in group] if all(spare) else [p for g in spare for p in g]
    return picked[:n] if len(picked) >= n else [p for f in files for p in load_prompts(f, limit)][:n]


def _unmeasured(path: str, limit: int) -> list[dict]:
    """The prompts of a file that `--limit` leaves out."""
    measured = {p["id"] for p in load_prompts(path, limit)}
    return [p for p in load_prompts(path) if p["id"] not in measured]

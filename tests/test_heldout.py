"""The mixed held-out set (assets/prompts/mix_heldout.jsonl, `fasteagle.bench.heldout`) and the
acceptance diagnosis that reads it (`fasteagle.bench.diagnose`)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import torch

from fasteagle.bench import diagnose, heldout
from fasteagle.train import tasks

ROOT = Path(__file__).resolve().parent.parent
MIX = ROOT / "assets/prompts/mix_heldout.jsonl"


def rows() -> list[dict]:
    return [json.loads(line) for line in MIX.read_text(encoding="utf-8").splitlines()]


def shingles(text: str, n: int = 6) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def test_six_kinds_of_24_at_real_lengths():
    got = rows()
    assert Counter(r["category"] for r in got) == {k: 24 for k in heldout.KINDS}
    assert len({r["id"] for r in got}) == len(got)
    docs = [r for r in got if r["category"] in ("summarization", "rag")]
    assert min(len(r["turns"][0]) for r in docs) > 2000  # ~500+ tokens: a real document, not a snippet
    sources = [r["source"] for r in got if "source" in r]
    assert len(sources) == len(set(sources)) == 72  # every README used once in the whole file


def test_shares_no_template_with_training_prompts():
    """No 6-word run of any training template (translation, summary, retrieval QA, long documents,
    math) appears in a held-out prompt."""
    templates = [tasks.TRANSLATE, tasks.SUMMARIZE, tasks.RAG, *tasks.LONG] + [m[0] for m in tasks.MATH]
    train = set().union(*(shingles(re.sub(r"\{\w+\}", " ", t)) for t in templates))
    for r in rows():
        assert not shingles(r["turns"][0]) & train, r["id"]


def test_prose_keeps_text_and_drops_code_tables_and_badges():
    readme = ("# Tool\n\n[![ci](https://x/badge.svg)](https://x)\n\nTool makes [reports](https://r) from your "
              "data files quickly and with very little set-up at all.\n\n```python\nimport tool\n```\n\n"
              "| a | b |\n|---|---|\n\n    indented code line\n\nA second paragraph explains how the tool reads "
              "its configuration file every time.")
    assert heldout.prose(readme) == [
        "# Tool", "Tool makes reports from your data files quickly and with very little set-up at all.",
        "A second paragraph explains how the tool reads its configuration file every time."]


def test_a_window_mask_is_causal_and_keeps_the_last_w():
    from fasteagle.kvcache import attention_mask, causal_ancestors, limit_to_window

    whole = attention_mask(causal_ancestors(4), 0, torch.float32)
    assert torch.equal(limit_to_window(whole.clone(), torch.arange(4), 0), whole)
    m = limit_to_window(whole, torch.arange(4), 2)[0, 0] == 0
    assert m.tolist() == [[True, False, False, False], [True, True, False, False],
                          [False, True, True, False], [False, False, True, True]]


def test_lookup_replay_marks_copyable_slots():
    seq = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 4]
    reply = [i >= 5 for i in range(len(seq))]  # the reply repeats the prompt
    (tokens, steps), copyable = diagnose.lookup_replay(seq, reply)
    assert copyable[5] and copyable[6]  # root 6 after [..., 5]: lookup proposes 7, and 7 comes
    assert not copyable[8]  # root 9: lookup proposes 5, the reply says 4
    assert steps < tokens  # it accepts runs


def test_replay_equals_a_real_decode(smollm):
    """The replayed greedy decode takes exactly the steps the real one does, with the shipped drafter, its
    attention whole, cut to a window, or reading the prompt's last tokens only (the decode's cache does what
    the replay's one pass does); a window
    run alone with positions renumbered gives the windowed pass's drafts."""
    from fasteagle.methods import Settings, build

    d = build("fasteagle", smollm, Settings(tree_budget=6, draft_int8=False))
    prompts = [{"id": "a", "category": "writing", "text": "List the days of the week, one per line."},
               {"id": "b", "category": "translation", "text": "Translate into Spanish: The cat sleeps on the warm "
                                                              "stones near the river every afternoon."}]
    got = diagnose.diagnose(smollm, d, prompts, 24, ["full", "window8", "tail8"], check=2)
    assert [(c["id"], c["variant"], c["identical"]) for c in got["check"]] == [
        (p, v, True) for p in "ab" for v in ("full", "window8", "tail8")]
    assert all(c["decoded_steps"] == c["replayed_steps"] for c in got["check"]), got["check"]
    assert got["renumbered_max_gap"] < 1e-4
    assert got["tau"]["writing"]["fasteagle6"]["full"] > 1.2  # the drafter accepts here: the steps test means something


def test_several_drafters_replay_on_the_same_replies(smollm):
    """Two cascades replayed in one run score as each does alone, and the report names both."""
    from fasteagle.bench.reports import markdown_table
    from fasteagle.methods import Settings, build

    a = build("fasteagle", smollm, Settings(tree_budget=6, draft_int8=False))
    b = build("fasteagle-equal", smollm, Settings(tree_budget=6, draft_int8=False))
    prompts = [{"id": "a", "category": "writing", "text": "Name three colours of the rainbow."}]
    alone = {k: diagnose.diagnose(smollm, d, prompts, 16, ["full", "tail4"], check=1) for k, d in (("a", a), ("b", b))}
    both = diagnose.diagnose(smollm, {"a": a, "b": b}, prompts, 16, ["full", "tail4"], check=1)
    for k in "ab":
        for v in ("full", "tail4"):
            assert both["tau"]["writing"]["fasteagle6"][f"{k}:{v}"] == alone[k]["tau"]["writing"]["fasteagle6"][v]
            assert both["rates"]["writing"][f"{k}:{v}"] == alone[k]["rates"]["writing"][v]
    assert all(c["identical"] for c in both["check"]) and len(both["check"]) == 4
    doc = both | {"kind": "diagnose", "device": "cpu", "threads": 1, "target": "t", "prompts_desc": "1 prompt,",
                  "max_new_tokens": 16, "variants": ["a:full", "a:tail4", "b:full", "b:tail4"],
                  "drafters": {"a": "A", "b": "B"}}
    text = markdown_table(doc)
    assert "drafters a `A`, b `B`" in text and "b, prompt's last 4" in text

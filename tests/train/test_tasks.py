"""fasteagle.train.tasks: prompts of five kinds beyond chat, built from holdout conversations for
evaluation and from train ones for training, never sharing text."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from fasteagle.errors import FastEagleError
from fasteagle.train import tasks
from fasteagle.train.sharegpt import is_holdout

ROOT = Path(__file__).resolve().parent.parent.parent
PARAGRAPH = ("The committee reviewed the proposal in detail and agreed that the new library should open on "
             "weekdays from nine in the morning until eight in the evening, with shorter hours on weekends. "
             "Volunteers will run the reading room, and the city will pay for heating and light.")
DOC = ("Storage rooms keep fruit fresh by lowering oxygen and raising carbon dioxide, which slows the "
       "fruit's respiration. " * 20).strip()


def ids(holdout: bool, n: int) -> list[str]:
    """Conversation ids that fall on the asked side of the split."""
    out, i = [], 0
    while len(out) < n:
        if is_holdout(f"conv{i}") == holdout:
            out.append(f"conv{i}")
        i += 1
    return out


def chat(cid: str, *turns: str) -> dict:
    return {"id": cid, "conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": t}
                                         for i, t in enumerate(turns)]}


@pytest.fixture
def sharegpt(tmp_path) -> Path:
    (h1, h2, h3), (t1,) = ids(True, 3), ids(False, 1)
    records = [
        chat(h1, "What is the best way to keep apples fresh in winter?", DOC,
             "How does the respiration change during storage?", "It slows down."),
        chat(h2, "Tell me about the library plan.", PARAGRAPH + "\n\nThat is all."),
        chat(h3, "Why do leaves change colour in the autumn months?", "Chlorophyll breaks down."),
        chat(t1, "Why do leaves change colour in the autumn months?", "Chlorophyll breaks down."),  # a twin
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(records))
    return path


def test_holdout_prompts_are_built_from_holdout_text_only(sharegpt):
    found = tasks.conversation_prompts("holdout", sharegpt)
    assert [p["turns"][0] for p in found["qa"]] == ["What is the best way to keep apples fresh in winter?"]
    assert len(found["translation"]) == 1 and PARAGRAPH in found["translation"][0]["turns"][0]
    assert found["translation"][0]["turns"][0].startswith("Translate the following text into ")
    assert [p["id"] for p in found["summarization"]] == [f"summarization-{ids(True, 1)[0]}"]
    (rag,) = found["rag"]
    assert DOC in rag["turns"][0] and rag["turns"][0].endswith("Question: How does the respiration change during "
                                                                "storage?")
    assert all(set(p) == {"id", "category", "turns"} for c in found.values() for p in c)


def test_a_holdout_chat_that_a_train_chat_repeats_is_left_out(sharegpt):
    """h3's question also opens a train chat: evaluating on it would measure what training saw."""
    questions = [p["turns"][0] for p in tasks.conversation_prompts("holdout", sharegpt)["qa"]]
    assert "Why do leaves change colour in the autumn months?" not in questions
    assert [p["turns"][0] for p in tasks.conversation_prompts("train", sharegpt)["qa"]] == [
        "Why do leaves change colour in the autumn months?"]


def test_math_problems_are_deterministic_and_differ_between_evaluation_and_training():
    a, b = tasks.math_prompts(16, tasks.EVAL_SEED), tasks.math_prompts(16, tasks.EVAL_SEED)
    assert a == b and len({p["turns"][0] for p in a}) == 16
    train = {p["turns"][0] for p in tasks.math_prompts(16, tasks.TRAIN_SEED)}
    assert not train & {p["turns"][0] for p in a}
    assert all("{" not in p["turns"][0] for p in a)


def test_the_bundled_evaluation_set_has_twenty_of_each_kind():
    rows = [json.loads(line) for line in (ROOT / "assets/prompts/tasks_holdout.jsonl").read_text().splitlines()]
    counts = Counter(r["category"] for r in rows)
    assert set(counts) == {"chat", *tasks.CATEGORIES} and min(counts.values()) >= 20
    assert len({r["id"] for r in rows}) == len(rows)


@pytest.mark.integration
def test_the_bundled_evaluation_set_regenerates_byte_for_byte(tmp_path):
    out = tasks.write_eval_file(tmp_path / "tasks.jsonl")
    assert out.read_bytes() == (ROOT / "assets/prompts/tasks_holdout.jsonl").read_bytes()


def test_long_documents_are_training_prompts_only(tmp_path):
    """A chat whose answers join into a long document gives a "long" prompt (summarize or proofread it
    whole); the evaluation set's categories leave it out."""
    (t1,) = ids(False, 1)
    answers = [(f"Part {i}. " + DOC) for i in range(4)]  # ~1800 characters each
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([chat(t1, "Tell me about storage.", answers[0], "More?", answers[1], "More?",
                                     answers[2], "And?", answers[3])]))
    (long,) = tasks.conversation_prompts("train", path)["long"]
    assert long["category"] == "long" and all(a in long["turns"][0] for a in answers)
    assert long["turns"][0].startswith(("Summarize the following document", "Correct any spelling"))
    assert 6000 <= len(long["turns"][0]) <= 16200
    assert not [p for p in tasks.category_prompts(5, "train", path) if p["category"] == "long"]
    assert [p["id"] for p in tasks.category_prompts(5, "train", path, categories=("long",))] == [long["id"]]


def test_a_training_prompt_set_takes_the_first_train_prompts_of_each_kind(sharegpt):
    from tests.conftest import tiny_tokenizer

    tok = tiny_tokenizer()
    data = tasks.prompt_dataset(tok, {"qa": 5, "math": 3}, path=sharegpt)
    assert data["ids"] == [p["id"] for p in tasks.category_prompts(5, "train", sharegpt, categories=("qa",))] + [
        f"math-{tasks.TRAIN_SEED}-{i}" for i in range(3)]
    short = tasks.prompt_dataset(tok, {"math": 3}, max_prompt_tokens=5, path=sharegpt)
    assert short["ids"] == [], "prompts over the limit are left out"


def test_counts_name_a_source_and_a_positive_number():
    assert tasks._counts("translation=200,long=4,chat=1") == {"translation": 200, "long": 4, "chat": 1}
    for bad in ("poetry=3", "math=0", "math", "math=-1", "qa=x"):
        with pytest.raises(FastEagleError, match="--counts"):
            tasks._counts(bad)

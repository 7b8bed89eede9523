"""Tests for fasteagle.train.teacher: the feature shards on disk, with the tiny target."""

from __future__ import annotations

import pytest
import torch

from fasteagle.errors import FastEagleError
from fasteagle.train.teacher import cache_features, distill_features
from tests.conftest import TINY_VOCAB


def _seqs(seed: int, lengths=(6, 9, 7, 5)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, TINY_VOCAB, (n,), generator=g).tolist() for n in lengths]


def _stamps(d) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(d.glob("shard-*.pt"))}


def test_cached_features_of_other_data_or_settings_are_refused(tiny, tmp_path):
    """Shards on disk are skipped on a rerun: the same data resumes, other data must not reuse them."""
    seqs = _seqs(0)
    data = {"input_ids": seqs, "loss_mask": [[0, 0] + [1] * (len(s) - 2) for s in seqs]}
    d = tmp_path / "f"
    cache_features(tiny.model, data, d, [1, 2], batch_tokens=20, topk=4)
    before = _stamps(d)
    assert len(before) > 1
    cache_features(tiny.model, data, d, [1, 2], batch_tokens=20, topk=4)  # a resumed run: nothing redone
    assert _stamps(d) == before
    for other in ({"data": {**data, "input_ids": [s[::-1] for s in seqs]}},
                  {"data": {**data, "loss_mask": [[1] * len(s) for s in seqs]}}, {"topk": 8}, {"batch_tokens": 40}):
        kw = {"data": data, "batch_tokens": 20, "topk": 4} | other
        with pytest.raises(FastEagleError, match="other data or settings"):
            cache_features(tiny.model, kw.pop("data"), d, [1, 2], **kw)
    assert _stamps(d) == before


def test_distilled_features_of_other_prompts_or_settings_are_refused(tiny, tmp_path):
    """A distillation resumed with more time goes on; one over other prompts or another seed is refused."""
    prompts, d = _seqs(1), tmp_path / "f"
    kw = dict(max_new_tokens=6, batch_size=2, sample_every=0, topk=4, keep_prompt=4, seed=0)
    distill_features(tiny.model, tiny.tokenizer, prompts, d, [1, 2], time_budget_s=1e-9, **kw)
    assert len(_stamps(d)) <= 1  # out of time after at most one batch
    distill_features(tiny.model, tiny.tokenizer, prompts, d, [1, 2], **kw)
    before = _stamps(d)
    assert len(before) == 2
    with pytest.raises(FastEagleError, match="other data or settings"):
        distill_features(tiny.model, tiny.tokenizer, _seqs(2), d, [1, 2], **kw)
    with pytest.raises(FastEagleError, match="other data or settings"):
        distill_features(tiny.model, tiny.tokenizer, prompts, d, [1, 2], **(kw | {"seed": 1}))
    assert _stamps(d) == before


def test_a_batch_cap_makes_again_exactly_what_a_time_cap_made(tiny, tmp_path):
    """`max_batches` (distill_batches): the first B batches in distill order, whatever the clock, so a
    time-capped run's data can be made again byte for byte; the replies of self_distill and the shards of
    distill_features take the same prompts."""
    from fasteagle.train.teacher import self_distill

    prompts = _seqs(3, lengths=(6, 9, 7, 5, 8, 4))
    kw = dict(max_new_tokens=5, batch_size=2, sample_every=2, seed=0)
    whole = self_distill(tiny.model, tiny.tokenizer, prompts, **kw)
    two = self_distill(tiny.model, tiny.tokenizer, prompts, max_batches=2, **kw)
    assert len(whole["input_ids"]) == 6 and len(two["input_ids"]) == 4
    assert two == self_distill(tiny.model, tiny.tokenizer, prompts, max_batches=2, **kw)  # seeded, sampled too
    assert sorted(map(tuple, two["prompt_ids"])) == sorted(map(tuple, whole["prompt_ids"][:4]))
    distill_features(tiny.model, tiny.tokenizer, prompts, tmp_path / "f", [1, 2], topk=4, keep_prompt=4,
                     max_batches=2, **kw)
    assert len(_stamps(tmp_path / "f")) == 2


def test_a_prompt_window_keeps_the_whole_pass_features_over_fewer_tokens(tiny, tmp_path):
    """keep_prompt: each row keeps its last k tokens before its first counted one, and the rest; the target
    still reads the whole row, so the window's features and teacher equal the whole-row shard's there."""
    seqs = _seqs(4, lengths=(12, 9, 15))
    first = (7, 2, 10)  # each row's first counted position
    data = {"input_ids": seqs, "loss_mask": [[0] * f + [1] * (len(s) - f) for s, f in zip(seqs, first)]}
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    cache_features(tiny.model, data, whole, [1, 2], batch_tokens=100, topk=4)
    cache_features(tiny.model, data, cut, [1, 2], batch_tokens=100, topk=4, keep_prompt=3)
    a, b = (torch.load(next(d.glob("shard-*.pt")), weights_only=True) for d in (whole, cut))
    assert b["input_ids"].shape[1] == 9 < a["input_ids"].shape[1] == 15  # the 9-token row is kept whole
    for r in range(3):
        n = int((a["input_ids"][r] != 0).sum())
        f = int(a["loss_mask"][r].nonzero()[0])
        start, w = max(0, f - 3), n - max(0, f - 3)
        assert torch.equal(b["input_ids"][r, :w], a["input_ids"][r, start:n])
        assert torch.equal(b["loss_mask"][r, :w], a["loss_mask"][r, start:n]) and not b["loss_mask"][r, w:].any()
        torch.testing.assert_close(b["feats"][r, :w], a["feats"][r, start:n])
        torch.testing.assert_close(b["teacher_probs"][r, :w], a["teacher_probs"][r, start:n], atol=2e-3, rtol=0)
        assert torch.equal(b["teacher_ids"][r, :w, 0], a["teacher_ids"][r, start:n, 0])
    with pytest.raises(FastEagleError, match="other data or settings"):  # another window is other data
        cache_features(tiny.model, data, cut, [1, 2], batch_tokens=100, topk=4, keep_prompt=4)

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

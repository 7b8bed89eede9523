"""fasteagle.train.vocab: a drafter's compact vocab from reply token counts."""

from __future__ import annotations

import json

import pytest
import torch

from fasteagle.drafter import CascadedDrafter, DrafterConfig
from fasteagle.errors import FastEagleError
from fasteagle.train import vocab
from fasteagle.train.data import save_token_dataset
from tests.conftest import TINY_VOCAB


def make(target, **kw) -> CascadedDrafter:
    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(target.model, target.name, num_layers=2, intermediate=64, **kw)
    return CascadedDrafter(cfg).attach(target.model).eval()


def test_the_current_compact_tokens_stay_and_the_most_frequent_join(tiny):
    d = make(tiny)  # drafts over the whole vocabulary
    d.compact_vocab = torch.tensor([300, 5, 7])
    counts = torch.zeros(TINY_VOCAB)
    counts[10:20] = torch.arange(10, 0, -1.0)  # 10 the most frequent, then 11, 12, ...
    counts[7] = 100.0  # already in: counted once
    assert d.set_compact_vocab(6, counts).compact_vocab.tolist() == [5, 7, 10, 11, 12, 300]
    assert d.set_compact_vocab(2, counts).compact_vocab.tolist() == [7, 10]  # smaller: the most frequent only
    assert d.vocab_ids.numel() == TINY_VOCAB  # what it drafts over now is unchanged


def test_the_compact_vocab_lies_inside_the_draft_vocab(tiny):
    d = make(tiny, draft_vocab=16)
    d.set_vocab(torch.arange(TINY_VOCAB, dtype=torch.float))  # drafts over the 16 last tokens
    counts = torch.zeros(TINY_VOCAB)
    counts[:8] = 50.0  # frequent, but not draftable
    counts[TINY_VOCAB - 3] = 1.0
    assert TINY_VOCAB - 3 in d.set_compact_vocab(4, counts).compact_vocab.tolist()
    assert set(d.compact_vocab.tolist()) <= set(d.vocab_ids.tolist())
    with pytest.raises(FastEagleError, match="does not fit"):
        d.set_compact_vocab(32, counts)


def test_command_rewrites_only_the_compact_vocab(tiny, tmp_path, capsys):
    d = make(tiny)
    d.compact_vocab = torch.tensor([1, 2])
    d.info = {"training": {"steps": 3}}
    d.save(tmp_path / "d", extra=d.info)
    replies = {"ids": ["a", "b"], "prompt_ids": [[1], [2]],
               "input_ids": [[1, 9, 9, 8], [2, 9, 7, 7]], "loss_mask": [[0, 1, 1, 1], [0, 1, 1, 1]]}
    save_token_dataset(replies, tmp_path / "r.pt")
    before = CascadedDrafter.load(tmp_path / "d").state_dict()
    assert vocab.reply_counts([tmp_path / "r.pt"], TINY_VOCAB)[[7, 8, 9]].tolist() == [2.0, 1.0, 3.0]
    assert vocab.main([str(tmp_path / "d"), "--size", "4", "--data", str(tmp_path / "r.pt")]) == 0
    assert "covering 83.3% of 6 reply tokens (was 0.0%)" in capsys.readouterr().out
    e = CascadedDrafter.load(tmp_path / "d")
    assert e.compact_vocab.tolist() == [1, 2, 7, 9]
    assert all(torch.equal(a, b) for a, b in zip(e.state_dict().values(), before.values()))
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["training"] == {"steps": 3} and cfg["compact_vocab"]["size"] == 4
    assert cfg["compact_vocab"]["data"] == ["r.pt"] and cfg["compact_vocab"]["reply_tokens"] == 6


def test_a_folder_of_feature_shards_counts_as_its_replies(tiny, tmp_path):
    """A `--features cache` run keeps no token dataset, only shards: their replies count the same."""
    from fasteagle.train.teacher import cache_features

    replies = {"ids": ["a", "b", "c"], "prompt_ids": [[1], [2], [3]],
               "input_ids": [[1, 9, 9, 8], [2, 9, 7, 7, 7, 5], [3, 4]], "loss_mask": [[0, 1, 1, 1], [0, 0, 1, 1, 1, 1],
                                                                             [0, 1]]}
    save_token_dataset(replies, tmp_path / "r.pt")
    cache_features(tiny.model, replies, tmp_path / "features", [0, 1, 2], batch_tokens=8)
    assert len(list((tmp_path / "features").glob("shard-*.pt"))) > 1
    from_shards = vocab.reply_counts([tmp_path / "features"], TINY_VOCAB)
    assert torch.equal(from_shards, vocab.reply_counts([tmp_path / "r.pt"], TINY_VOCAB))
    with pytest.raises(FastEagleError, match="without feature shards"):
        vocab.reply_counts([tmp_path], TINY_VOCAB)


def test_command_errors_are_one_line(tiny, tmp_path, capsys):
    """A missing drafter, a size over the draft vocab, or another tokenizer's data: exit 2 and an
    `error:` line, not a traceback."""
    make(tiny).save(tmp_path / "d")
    ok = {"ids": ["a"], "prompt_ids": [[1]], "input_ids": [[1, 9]], "loss_mask": [[0, 1]]}
    save_token_dataset(ok, tmp_path / "r.pt")
    save_token_dataset(ok | {"input_ids": [[1, 4000]]}, tmp_path / "other.pt")
    for argv in ([str(tmp_path / "missing"), "--size", "4", "--data", str(tmp_path / "r.pt")],
                 [str(tmp_path / "d"), "--size", str(TINY_VOCAB + 1), "--data", str(tmp_path / "r.pt")],
                 [str(tmp_path / "d"), "--size", "4", "--data", str(tmp_path / "other.pt")]):
        assert vocab.main(argv) == 2
        assert capsys.readouterr().err.startswith("error: ")
    with pytest.raises(SystemExit):
        vocab.main([str(tmp_path / "d"), "--size", "0", "--data", str(tmp_path / "r.pt")])


@pytest.mark.parametrize("cut", ["while writing", "while renaming", "after the weights"])
def test_an_interrupted_rewrite_keeps_the_drafter_loadable(tiny, tmp_path, monkeypatch, cut):
    """A Ctrl-C while the command rewrites a drafter in place leaves it loadable (old weights, or
    new weights under the old config) and no temporary files; before, the weights were unlinked first."""
    import os

    import safetensors.torch

    from fasteagle import draftbase

    d = make(tiny)
    d.compact_vocab = torch.tensor([1, 2])
    d.save(tmp_path / "d")
    ok = {"ids": ["a"], "prompt_ids": [[1]], "input_ids": [[1, 9, 8, 7]], "loss_mask": [[0, 1, 1, 1]]}
    save_token_dataset(ok, tmp_path / "r.pt")
    before = CascadedDrafter.load(tmp_path / "d").state_dict()

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if cut == "while writing":  # half the file is on disk when the interrupt comes
        real = safetensors.torch.save_file

        def half(tensors, filename, *args, **kwargs):
            real(tensors, filename, *args, **kwargs)
            with open(filename, "r+b") as f:
                f.truncate(os.path.getsize(filename) // 2)
            raise KeyboardInterrupt

        monkeypatch.setattr(safetensors.torch, "save_file", half)
    elif cut == "while renaming":
        monkeypatch.setattr(os, "replace", interrupt)
    else:
        monkeypatch.setattr(draftbase, "write_text", interrupt)
    assert vocab.main([str(tmp_path / "d"), "--size", "4", "--data", str(tmp_path / "r.pt")]) == 130
    monkeypatch.undo()
    e = CascadedDrafter.load(tmp_path / "d")
    assert all(torch.equal(a, b) for a, b in zip(e.state_dict().values(), before.values()))
    assert e.compact_vocab.tolist() == ([1, 2] if cut != "after the weights" else [1, 2, 7, 8])
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["config.json", "model.safetensors"]


def test_a_resave_with_other_shards_leaves_only_the_new_files(tiny, tmp_path):
    d = make(tiny)
    d.save(tmp_path, shard_mb=0.05)
    d.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    d.save(tmp_path, shard_mb=0.05)
    assert "model.safetensors" not in {p.name for p in tmp_path.iterdir()}
    torch.testing.assert_close(CascadedDrafter.load(tmp_path).fc.weight, d.fc.weight.half().float())

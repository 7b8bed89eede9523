"""What the drafters that draft a block in one forward share (DFlash, parallel EAGLE): a block reads only what
came before its anchor, the loss runs blocks only where a token counts and trains the mask row, greedy decoding
stays lossless, and each saves, loads and decodes as a method of its kind (and under a label)."""

from __future__ import annotations

import pytest
import torch

from fasteagle.generate import run
from fasteagle.methods import Settings, build, drafter_kind, load_drafter
from tests.conftest import TINY_VOCAB
from tests.drafters import check_block_loss, check_blocks_read_only_before_their_anchor, check_lossless, features
from tests.test_dflash import make as make_dflash
from tests.test_peagle import make as make_peagle

MAKERS = {"dflash": (make_dflash, "mask_embedding"), "peagle": (make_peagle, "mask_hidden")}
KINDS = list(MAKERS)


@pytest.mark.parametrize("kind", KINDS)
def test_a_block_reads_only_what_came_before_its_anchor(tiny, kind):
    check_blocks_read_only_before_their_anchor(tiny, MAKERS[kind][0](tiny), TINY_VOCAB)


@pytest.mark.parametrize("kind", KINDS)
def test_the_loss_runs_blocks_only_where_a_token_counts_and_trains_the_mask_row(tiny, kind):
    make, param = MAKERS[kind]
    d = make(tiny)
    ids = torch.randint(4, TINY_VOCAB, (2, 24))
    check_block_loss(d, features(tiny, ids, d.cfg.feature_layers), ids, getattr(d, param))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k,budget", [(1, 4), (3, 12)])
def test_block_decoding_is_lossless(tiny, kind, k, budget):
    """Untrained, its drafts are rejected; steered to the reply (its layers, cache and tree still its own),
    deep paths are accepted: both give vanilla's output."""
    d = MAKERS[kind][0](tiny)
    d.tree_k, d.tree_budget = k, budget
    traces = check_lossless(tiny, d, TINY_VOCAB)
    assert max(len(t.tree["tokens"]) for t in traces[1:]) <= budget


@pytest.mark.parametrize("kind", KINDS)
def test_it_saves_loads_and_decodes_as_a_method(tiny, tmp_path, kind):
    d = MAKERS[kind][0](tiny)
    d.save(tmp_path / kind)
    assert drafter_kind(tmp_path / kind) == kind
    back = load_drafter(tmp_path / kind, tiny.model)
    for (name, a), b in zip(d.state_dict().items(), back.state_dict().values()):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-3, rtol=1e-3, msg=name)
    m = build(kind, tiny, Settings(tree_budget=5).with_drafter(kind, tmp_path / kind))
    assert type(m) is type(d) and m.tree_budget == 5
    ids = torch.randint(4, TINY_VOCAB, (10,))
    assert run(tiny, ids, drafter=m, max_new_tokens=12)[0] == run(tiny, ids, max_new_tokens=12)[0]
    assert type(build("mine", tiny, Settings(named=(("mine", tmp_path / kind),)))) is type(d)

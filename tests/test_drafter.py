"""The cascaded drafter: shapes, causal structure, the loss's shift and mask, incremental (cached)
inference equal to a full forward, save/load, refusing another target's drafter, losslessness."""

from __future__ import annotations

import json

import pytest
import torch

from fasteagle.drafter import CascadedDrafter, DrafterConfig
from fasteagle.errors import FastEagleError
from fasteagle.generate import run
from fasteagle.methods import load_drafter
from tests.conftest import TINY_VOCAB, tiny_target
from tests.drafters import check_lossless, features, steer

N = 4


def make(target, **kw) -> CascadedDrafter:
    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(target.model, target.name, num_layers=N, intermediate=96, **kw)
    return CascadedDrafter(cfg).attach(target.model).eval()


def test_config_reads_the_target(tiny):
    d = make(tiny)
    assert d.cfg.feature_layers == [2, 1, 1]  # low / mid / high, clamped for a 2-layer model
    assert d.cfg.target_hidden == 64 and d.cfg.vocab_size == TINY_VOCAB
    assert len(d.cfg.fingerprint) == 16


def test_one_forward_gives_every_depth(tiny):
    d = make(tiny)
    ids = torch.randint(4, TINY_VOCAB, (2, 12))
    f = features(tiny, ids, d.cfg.feature_layers)
    outs = d.hidden(f[:, :-1], ids[:, 1:], torch.arange(11)[None].expand(2, -1))
    assert len(outs) == N and all(o.shape == (2, 11, d.cfg.width) for o in outs)
    assert d.head(outs[2], 3).shape == (2, 11, TINY_VOCAB)


def test_cascade_is_causal(tiny):
    """Layer i at position t sees nothing after t: changing later inputs leaves it unchanged."""
    d = make(tiny)
    ids = torch.randint(4, TINY_VOCAB, (1, 16))
    f = features(tiny, ids, d.cfg.feature_layers)
    pos = torch.arange(15)[None]
    with torch.no_grad():
        a = d.hidden(f[:, :-1], ids[:, 1:], pos)
        f2, ids2 = f.clone(), ids.clone()
        f2[:, 9:] += torch.randn_like(f2[:, 9:])
        ids2[:, 10:] = torch.randint(4, TINY_VOCAB, (1, 6))
        b = d.hidden(f2[:, :-1], ids2[:, 1:], pos)
    for x, y in zip(a, b):
        torch.testing.assert_close(x[:, :9], y[:, :9])
        assert not torch.allclose(x[:, 9:], y[:, 9:])


def test_loss_uses_the_one_position_shift_and_the_mask(tiny):
    """Layer i at position t is scored against the teacher at t+i, only where loss_mask[t+1+i]."""
    d = make(tiny)
    B, L, K = 1, 10, 2
    ids = torch.randint(4, TINY_VOCAB, (B, L))
    f = features(tiny, ids, d.cfg.feature_layers)
    t_ids = torch.randint(4, TINY_VOCAB, (B, L, K))
    t_p = torch.tensor([0.75, 0.25]).expand(B, L, K).clone()
    mask = torch.zeros(B, L)
    mask[0, 6] = 1  # only token 6 counts
    with torch.no_grad():
        loss, stats = d.loss(f, ids, mask, t_ids, t_p)
        outs = d.hidden(f[:, :-1], ids[:, 1:], torch.arange(L - 1)[None])
    want = 0.0
    for i in range(1, N + 1):
        t = 6 - 1 - i  # layer i at t predicts token t+1+i = 6, from the teacher at t+i = 5
        logp = torch.log_softmax(d.head(outs[i - 1][0, t], i), -1)
        ce = -(0.75 * logp[t_ids[0, 5, 0]] + 0.25 * logp[t_ids[0, 5, 1]])
        want += d.cfg.loss_decay ** (i - 1) * ce
        assert stats[f"loss{i}"] == pytest.approx(float(ce.detach()), rel=1e-4)
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-4)
    # the teacher at an unmasked position does not matter
    t_ids2 = t_ids.clone()
    t_ids2[0, 3] = torch.randint(4, TINY_VOCAB, (K,))
    with torch.no_grad():
        loss2, _ = d.loss(f, ids, mask, t_ids2, t_p)
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6)


def test_hard_targets_score_the_teachers_top_token_alone(tiny):
    """loss_targets "hard": each depth's cross-entropy against the teacher's top-1 token, the rest ignored."""
    d = make(tiny)
    d.cfg.loss_targets = "hard"
    B, L, K = 1, 10, 2
    ids = torch.randint(4, TINY_VOCAB, (B, L))
    f = features(tiny, ids, d.cfg.feature_layers)
    t_ids = torch.randint(4, TINY_VOCAB, (B, L, K))
    t_p = torch.tensor([0.75, 0.25]).expand(B, L, K).clone()
    mask = torch.zeros(B, L)
    mask[0, 6] = 1
    with torch.no_grad():
        loss, stats = d.loss(f, ids, mask, t_ids, t_p)
        outs = d.hidden(f[:, :-1], ids[:, 1:], torch.arange(L - 1)[None])
    want = 0.0
    for i in range(1, N + 1):
        ce = -torch.log_softmax(d.head(outs[i - 1][0, 6 - 1 - i], i), -1)[t_ids[0, 5, 0]]
        want += d.cfg.loss_decay ** (i - 1) * ce
        assert stats[f"loss{i}"] == pytest.approx(float(ce), rel=1e-4)
    assert float(loss) == pytest.approx(float(want), rel=1e-4)


def test_until_fail_and_dpace_weigh_each_chain_by_what_it_would_accept(tiny):
    """`loss_weights`: "until-fail" counts depth i at t only while depths 1..i-1 there drafted the teacher's top-1
    (a depth not counted there does not stop the chain); "dpace" weighs depth i by sum_{k>=i} prod_{j<=k} q_j
    (q the floored probability of the teacher's top-1; 1 where a depth is not counted), scaled to a mean of 1.
    Both recomputed here by hand from each depth's own outputs."""
    d = make(tiny)
    B, L, K = 2, 14, 2
    ids = torch.randint(4, TINY_VOCAB, (B, L))
    f = features(tiny, ids, d.cfg.feature_layers)
    mask = torch.ones(B, L)
    mask[:, :4] = 0
    mask[1, 9] = 0  # a hole: depth i at t = 8 - i is not counted in row 1
    with torch.no_grad():
        outs = d.hidden(f[:, :-1], ids[:, 1:], torch.arange(L - 1)[None].expand(B, -1))
        logp = [torch.log_softmax(d.head(o, i), -1) for i, o in enumerate(outs, start=1)]
    t_ids = torch.randint(4, TINY_VOCAB, (B, L, K))
    for i in (1, 2):  # the teacher agrees with depths 1 and 2's argmax at about half the positions
        agree = torch.rand(B, L - 1 - i) < 0.5
        top = d.vocab_ids[logp[i - 1][:, :L - 1 - i].argmax(-1)]
        t_ids[:, i:L - 1, 0] = torch.where(agree, top, t_ids[:, i:L - 1, 0])
    t_p = torch.tensor([0.75, 0.25]).expand(B, L, K).clone()
    grid = (B, L - 2)  # every position t of depth 1

    def padded(x, fill):
        return torch.cat([x, torch.full((B, grid[1] - x.shape[1]), fill, dtype=x.dtype)], 1)

    ce, hit, q, counted = [], [], [], []
    for i in range(1, N + 1):
        n = L - 1 - i
        lp, tgt = logp[i - 1][:, :n], d.to_draft_ids(t_ids[:, i:i + n])
        ce.append(padded(-(0.75 * lp.gather(-1, tgt[..., :1]) + 0.25 * lp.gather(-1, tgt[..., 1:]))[..., 0], 0.0))
        hit.append(padded(lp.argmax(-1) == tgt[..., 0], False))
        q.append(padded(lp.gather(-1, tgt[..., :1])[..., 0].exp().clamp_min(d.DPACE_FLOOR), 1.0))
        counted.append(padded(mask[:, i + 1:i + 1 + n].bool(), False))
    alive, until_fail = torch.ones(grid, dtype=torch.bool), 0.0
    for c, h, m in zip(ce, hit, counted):
        until_fail += (alive[m].float() * c[m]).mean()
        alive &= h | ~m
    q = [torch.where(m, x, torch.ones(())) for x, m in zip(q, counted)]
    prefix = [torch.stack(q[:k + 1]).prod(0) for k in range(N)]
    w = [sum(prefix[i:]) for i in range(N)]
    scale = torch.cat([x[m] for x, m in zip(w, counted)]).mean()
    dpace = sum((x[m] / scale * c[m]).mean() for x, c, m in zip(w, ce, counted))
    got = {}
    with torch.no_grad():
        for scheme in ("decay", "until-fail", "dpace"):
            d.cfg.loss_weights = scheme
            got[scheme] = float(d.loss(f, ids, mask, t_ids, t_p)[0])
    assert got["until-fail"] == pytest.approx(float(until_fail), rel=1e-4)
    assert got["dpace"] == pytest.approx(float(dpace), rel=1e-4)
    assert not bool(alive.all())  # some chains broke, so their deeper depths weighed nothing:
    assert got["until-fail"] < sum(float(c[m].mean()) for c, m in zip(ce, counted))


def test_recomputed_loss_gives_the_same_loss_and_gradients(tiny):
    """A big head's loss recomputes each depth's logits in the backward (memory, not math): same
    loss, same stats, same gradients as keeping them."""
    d = make(tiny, draft_vocab=200).train()
    counts = torch.arange(TINY_VOCAB)
    d.set_vocab(counts)  # the 200 highest ids: some teacher tokens fall outside and count as misses
    ids = torch.randint(4, TINY_VOCAB, (2, 12))
    f = features(tiny, ids, d.cfg.feature_layers)
    t_ids = torch.randint(4, TINY_VOCAB, (2, 12, 3))
    t_p = torch.softmax(torch.randn(2, 12, 3), -1)
    mask = (torch.rand(2, 12) > 0.3).float()
    results = []
    for lean in (False, True):
        d.zero_grad()
        d.LEAN_LOSS_ELEMENTS = 0 if lean else 1 << 40
        loss, stats = d.loss(f, ids, mask, t_ids, t_p)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}
        results.append((float(loss.detach()), stats, grads))
    (l0, s0, g0), (l1, s1, g1) = results
    assert l0 == pytest.approx(l1, rel=1e-6) and s0 == pytest.approx(s1, rel=1e-6)
    assert g0.keys() == g1.keys() and len(g0) > 10
    for n in g0:
        torch.testing.assert_close(g0[n], g1[n], rtol=1e-5, atol=1e-7)


def test_loss_vocab_is_a_softmax_over_frequent_rows_and_the_batch_teachers(tiny):
    """With `loss_vocab`, each depth's cross-entropy is the one over those draft rows plus every
    teacher token of the batch: all rows give the plain loss exactly; fewer rows a smaller one (the
    missing rows' mass leaves the normaliser), with gradients still reaching the drafter."""
    d = make(tiny, draft_vocab=200).train()
    d.set_vocab(torch.arange(TINY_VOCAB))
    ids = torch.randint(4, TINY_VOCAB, (2, 12))
    f = features(tiny, ids, d.cfg.feature_layers)
    t_ids = torch.randint(4, TINY_VOCAB, (2, 12, 3))
    t_p = torch.softmax(torch.randn(2, 12, 3), -1)
    mask = (torch.rand(2, 12) > 0.3).float()
    with torch.no_grad():
        plain, plain_stats = d.loss(f, ids, mask, t_ids, t_p)
        d.loss_vocab = torch.arange(200)
        whole, whole_stats = d.loss(f, ids, mask, t_ids, t_p)
    assert float(whole) == pytest.approx(float(plain), rel=1e-6) and whole_stats == pytest.approx(plain_stats)
    d.loss_vocab = torch.tensor([0, 5, 17])
    rows, to_row = d._loss_rows(t_ids)
    in_vocab = d.to_draft_ids(t_ids.reshape(-1))
    assert set(rows.tolist()) == {0, 5, 17} | set(in_vocab[in_vocab >= 0].tolist())
    assert (rows[to_row[rows]] == rows).all() and int((to_row >= 0).sum()) == rows.numel()
    d.zero_grad()
    few, few_stats = d.loss(f, ids, mask, t_ids, t_p)
    few.backward()
    assert float(few.detach()) < float(plain)
    assert all(few_stats[f"loss{i}"] < plain_stats[f"loss{i}"] for i in range(1, N + 1) if f"loss{i}" in few_stats)
    assert d.fc.weight.grad is not None and float(d.fc.weight.grad.abs().sum()) > 0


def test_draft_vocab_maps_back_to_target_ids(tiny):
    d = make(tiny, draft_vocab=64)
    counts = torch.zeros(TINY_VOCAB, dtype=torch.long)
    counts[200:264] = 5
    d.set_vocab(counts)
    assert d.vocab_ids.tolist() == list(range(200, 264))
    assert d.to_draft_ids(torch.tensor([200, 263, 5])).tolist() == [0, 63, -1]
    d.reset(64)
    ids = torch.randint(4, TINY_VOCAB, (8,))
    d.extend(ids, features(tiny, ids[None], d.cfg.feature_layers)[0], 7)
    tree = d.draft(7)
    assert set(tree.tokens[1:].tolist()) <= set(range(200, 264))


@pytest.mark.parametrize("norms", [{}, {"fc_norm": True, "norm_output": True}, {"kv_inject": True},
                                   {"kv_inject": True, "attention_window": 6}])
def test_incremental_extend_equals_a_full_forward(tiny, norms):
    """Feeding the prefix in chunks through the per-layer KV caches gives the same last outputs
    as one causal forward over everything (with EAGLE 3.1's norms too, and with every layer's keys and values
    from the fused input, where a decode step runs the layers on its last row alone, within a window too)."""
    d = make(tiny, **norms)
    if "fc_norm" in norms:  # not the identity: each feature's norm and each passed output's norm act
        assert len(d.fc_norm) == len(d.cfg.feature_layers)
        for n in [*d.fc_norm, *d.norms]:
            torch.nn.init.uniform_(n.weight, 0.5, 2.0)
    ids = torch.randint(4, TINY_VOCAB, (20,))
    f = features(tiny, ids[None], d.cfg.feature_layers)[0]
    nxt = 9
    with torch.no_grad():
        full = d.hidden(f[None], torch.cat([ids[1:], torch.tensor([nxt])])[None], torch.arange(20)[None])
    d.reset(64)
    d.extend(ids[:7], f[:7], int(ids[7]))
    d.extend(ids[7:15], f[7:15], int(ids[15]))
    d.extend(ids[15:], f[15:], nxt)
    torch.testing.assert_close(d.last, torch.stack([o[0, -1] for o in full]), atol=1e-5, rtol=1e-4)


def test_eagle31_norms_change_the_cascade_and_it_stays_lossless(tiny):
    """`fc_norm` and `norm_output` change what every depth reads (not the same function as the plain cascade
    from one seed), and greedy decoding with it, in both step modes, is vanilla's."""
    plain, normed = make(tiny), make(tiny, fc_norm=True, norm_output=True)
    ids = torch.randint(4, TINY_VOCAB, (1, 12))
    f = features(tiny, ids, plain.cfg.feature_layers)
    with torch.no_grad():
        a, b = (d.hidden(f[:, :-1], ids[:, 1:], torch.arange(11)[None]) for d in (plain, normed))
    assert all(not torch.allclose(x, y) for x, y in zip(a, b))
    for mode in ("dynamic", "static"):
        normed.step_mode, normed.tree_k, normed.tree_budget = mode, 3, 10
        check_lossless(tiny, normed, TINY_VOCAB)


def test_injected_keys_and_values_change_the_cascade_and_it_stays_lossless(tiny):
    """`kv_inject`: every layer's keys and values from the fused input, so each depth reads another function of
    the context than the plain cascade's (the same weights): layer 1, whose keys were the fused input already,
    agrees, and every deeper one differs. Greedy decoding with it is vanilla's, in both step modes."""
    plain, injected = make(tiny), make(tiny, kv_inject=True)
    injected.load_state_dict(plain.state_dict())
    ids = torch.randint(4, TINY_VOCAB, (1, 12))
    f = features(tiny, ids, plain.cfg.feature_layers)
    with torch.no_grad():
        a, b = (d.hidden(f[:, :-1], ids[:, 1:], torch.arange(11)[None]) for d in (plain, injected))
    torch.testing.assert_close(a[0], b[0], atol=1e-5, rtol=1e-4)
    assert all(not torch.allclose(x, y, atol=1e-3) for x, y in zip(a[1:], b[1:]))
    for mode in ("dynamic", "static"):
        injected.step_mode, injected.tree_k, injected.tree_budget = mode, 3, 10
        check_lossless(tiny, injected, TINY_VOCAB)


@pytest.mark.parametrize("budget", [2, 3, 4])
def test_a_small_tree_runs_only_the_layers_it_can_reach(tiny, budget):
    """A tree of B nodes reaches depth B-1 at most: the deeper layers are skipped (their caches
    stay empty) and the tree is exactly the one all N layers would have given."""
    ids = torch.randint(4, TINY_VOCAB, (12,))
    f = features(tiny, ids[None], make(tiny).cfg.feature_layers)[0]
    trees = []
    for skip in (True, False):
        d = make(tiny)
        d.tree_k, d.tree_budget = [3, 2, 2, 2], budget
        d.state.all_layers = not skip  # the switch `fasteagle-all-layers` sets, to time the saving
        d.reset(64)
        d.extend(ids[:8], f[:8], int(ids[8]))
        d.extend(ids[8:], f[8:], 5)
        trees.append(d.draft(5))
        ran = [layer.length for layer in d.state.cache.layers]
        assert ran == ([12] * (budget - 1) + [0] * (N - budget + 1) if skip else [12] * N)
    assert trees[0].size == budget
    for name in ("tokens", "parents", "depths", "sources"):
        assert torch.equal(getattr(trees[0], name), getattr(trees[1], name)), name
    torch.testing.assert_close(trees[0].draft_probs, trees[1].draft_probs)  # a head product of fewer rows


def test_a_token_conditioned_cascade_starts_as_the_plain_one_and_reads_each_depths_top_token(tiny, tmp_path):
    """token_conditioned: layer i+1 reads h_i + T_i(embed(top-1 of depth i)); T_i starts at zero (the plain
    cascade's function), and once trained the next layer's output follows depth i's drafted token."""
    ids = torch.randint(4, TINY_VOCAB, (1, 14))
    plain, cond = make(tiny), make(tiny, token_conditioned=True)
    f = features(tiny, ids, plain.cfg.feature_layers)
    pos = torch.arange(13)[None]
    with torch.no_grad():
        for a, b in zip(plain.hidden(f[:, :-1], ids[:, 1:], pos), cond.hidden(f[:, :-1], ids[:, 1:], pos)):
            torch.testing.assert_close(a, b)
        for lin in cond.tok_fc:
            lin.weight.normal_(0, 0.5)
        outs = cond.hidden(f[:, :-1], ids[:, 1:], pos)
        x = outs[0] + cond.tok_fc[0](cond.embed(cond.vocab_ids[cond.head(outs[0], 1).argmax(-1)]))
        y = cond.layers[1](x, position_ids=pos, position_embeddings=cond.rotary(x, pos))
        torch.testing.assert_close(outs[1], y[0] if isinstance(y, tuple) else y, atol=1e-5, rtol=1e-4)
    cond.train()
    loss, _ = cond.loss(f, ids, torch.ones(1, 14), torch.randint(4, TINY_VOCAB, (1, 14, 2)),
                        torch.tensor([0.75, 0.25]).expand(1, 14, 2).clone())
    loss.backward()
    assert all(lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0 for lin in cond.tok_fc)
    cond.eval().save(tmp_path / "cond")
    back = load_drafter(tmp_path / "cond", tiny.model)
    assert back.cfg.token_conditioned and torch.allclose(back.tok_fc[0].weight, cond.tok_fc[0].weight, atol=1e-2)


@pytest.mark.parametrize("k,budget", [(1, 5), (4, 20)])
def test_a_token_conditioned_cascade_is_lossless(tiny, k, budget):
    d = make(tiny, token_conditioned=True)
    for lin in d.tok_fc:
        torch.nn.init.normal_(lin.weight, 0, 0.5)
    d.tree_k, d.tree_budget = k, budget
    check_lossless(tiny, d, TINY_VOCAB)


def test_a_current_token_cascade_grows_from_a_plain_one_and_reads_each_rows_token(tiny, tmp_path):
    """current_token: `cur_fc` adds embed(x_t) at row t. Grown from a plain cascade it is zero (the same
    function); once it is not, a row's output follows its own token, the loss trains them, and
    save/load keeps them. vLLM's draft rows do not carry that token: export refuses in one line."""
    from fasteagle.eagle3_format import export_cascade

    ids = torch.randint(4, TINY_VOCAB, (1, 14))
    plain = make(tiny)
    f = features(tiny, ids, plain.cfg.feature_layers)
    pos = torch.arange(13)[None]
    plain.save(tmp_path / "plain")
    grown = load_drafter(tmp_path / "plain", tiny.model)
    with torch.no_grad():
        before = grown.hidden(f[:, :-1], ids[:, 1:], pos)
    grown.add_current_token()
    with torch.no_grad():
        for a, b in zip(before, grown.hidden(f[:, :-1], ids[:, 1:], pos, cur_ids=ids[:, :-1])):
            torch.testing.assert_close(a, b)
        grown.cur_fc.weight.normal_(0, 0.5)
        other = ids[:, :-1].clone()
        other[0, 5] = (other[0, 5] + 1) % TINY_VOCAB
        a, b = (grown.hidden(f[:, :-1], ids[:, 1:], pos, cur_ids=c)[0] for c in (ids[:, :-1], other))
    assert torch.equal(a[0, :5], b[0, :5]) and not torch.allclose(a[0, 5], b[0, 5])  # causal, and read
    with pytest.raises(ValueError, match="cur_ids"):
        grown.hidden(f[:, :-1], ids[:, 1:], pos)
    grown.train()
    loss, _ = grown.loss(f, ids, torch.ones(1, 14), torch.randint(4, TINY_VOCAB, (1, 14, 2)),
                         torch.tensor([0.75, 0.25]).expand(1, 14, 2).clone())
    loss.backward()
    assert grown.cur_fc.weight.grad.abs().sum() > 0
    grown.eval().save(tmp_path / "grown")
    back = load_drafter(tmp_path / "grown", tiny.model)
    assert back.cfg.current_token and torch.allclose(back.cur_fc.weight, grown.cur_fc.weight, atol=1e-2)
    with pytest.raises(FastEagleError, match="our engine only"):
        export_cascade(back, tmp_path / "vllm")


def test_a_current_token_cascade_extends_as_its_full_forward_and_is_lossless(tiny):
    """Fed in chunks through its caches it gives the full forward's last outputs (each chunk's rows read
    their own tokens), and greedy decoding with it is vanilla's, token for token."""
    d = make(tiny, current_token=True)
    torch.nn.init.normal_(d.cur_fc.weight, 0, 0.1)
    ids = torch.randint(4, TINY_VOCAB, (20,))
    f = features(tiny, ids[None], d.cfg.feature_layers)[0]
    with torch.no_grad():
        full = d.hidden(f[None], torch.cat([ids[1:], torch.tensor([9])])[None], torch.arange(20)[None],
                        cur_ids=ids[None])
    d.reset(64)
    d.extend(ids[:7], f[:7], int(ids[7]))
    d.extend(ids[7:], f[7:], 9)
    torch.testing.assert_close(d.last, torch.stack([o[0, -1] for o in full]), atol=1e-5, rtol=1e-4)
    d.tree_k, d.tree_budget = 4, 20
    prompt = ids[:10]
    want, _ = run(tiny, prompt, max_new_tokens=30)
    assert run(tiny, prompt, drafter=d, max_new_tokens=30)[0] == want
    got, traces = run(tiny, prompt, drafter=steer(d, want), max_new_tokens=30)
    assert got == want and traces[-1].tau > 2.0

def test_save_load_round_trip(tiny, tmp_path):
    d = make(tiny, draft_vocab=100)
    counts = torch.arange(TINY_VOCAB)
    d.set_vocab(counts)
    d.save(tmp_path, dtype=torch.float32, extra={"note": "x"})
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "config.json").exists()
    e = CascadedDrafter.load(tmp_path, tiny.model)
    assert torch.equal(e.vocab_ids, d.vocab_ids)
    for (k, a), (_, b) in zip(d.state_dict().items(), e.state_dict().items()):
        assert torch.equal(a, b), k
    assert e.info["note"] == "x"


def last_hidden(tiny, d) -> torch.Tensor:
    """The drafter's per-depth outputs after extending it over 8 random tokens (for head-only checks)."""
    ids = torch.randint(4, TINY_VOCAB, (8,))
    d.reset(64)
    d.extend(ids, features(tiny, ids[None], d.cfg.feature_layers)[0], 7)
    return d.last.clone()


def test_grow_vocab_adds_tokens_to_draft_and_saves_them(tiny, tmp_path):
    """A drafter trained on a subset drafts over more of the vocabulary: the old tokens plus the most
    frequent others, or everything; its layers are untouched, only the head's rows grow."""
    d = make(tiny, draft_vocab=64)
    counts = torch.arange(TINY_VOCAB, dtype=torch.float)  # token t seen t times: the last 64 kept
    d.set_vocab(counts)
    old = d.vocab_ids.clone()
    last = last_hidden(tiny, d)
    counts2 = torch.zeros(TINY_VOCAB)
    counts2[:40] = torch.arange(40, 0, -1.0)  # now tokens 0..39 are frequent, the first the most: 0..31 join
    d.grow_vocab(96, counts2)
    assert d.cfg.draft_vocab == 96 and set(old.tolist()) <= set(d.vocab_ids.tolist())
    assert set(d.vocab_ids.tolist()) - set(old.tolist()) == set(range(32))
    assert d.depth_probs(last).shape == (N, 96) and d.head_weight().shape[0] == 96
    with pytest.raises(FastEagleError, match="only grow"):
        d.grow_vocab(80, counts2)
    with pytest.raises(FastEagleError, match="token counts"):
        d.grow_vocab(100)
    d.grow_vocab(TINY_VOCAB)  # everything
    assert d.cfg.draft_vocab == 0 and torch.equal(d.vocab_ids, torch.arange(TINY_VOCAB))
    probs = d.depth_probs(last)  # depth 1 over the whole vocabulary is the target's own head on layer 1
    with torch.no_grad():
        want = torch.softmax(tiny.model.lm_head(d.norms[0](last[0])), -1)
    assert probs.shape == (N, TINY_VOCAB)
    torch.testing.assert_close(probs[0], want, atol=1e-6, rtol=1e-4)
    d.save(tmp_path)
    e = CascadedDrafter.load(tmp_path, tiny.model)
    assert e.cfg.draft_vocab == 0 and e.vocab_ids.numel() == TINY_VOCAB
    assert torch.equal(e.compact_vocab, old)  # the first vocab it grew from stays, for CPUs


def test_shrink_vocab_drafts_over_a_subset_with_the_same_ranking(tiny, tmp_path):
    """A whole-vocabulary drafter restricted to its compact vocab gives each kept token the same
    logit, so the softmax over the subset is the whole one renormalised; tokens outside are refused."""
    d = make(tiny)
    last = last_hidden(tiny, d)
    whole = d.depth_probs(last)
    keep = torch.randperm(TINY_VOCAB)[:40]
    d.compact_vocab = keep
    d.save(tmp_path)
    e = CascadedDrafter.load(tmp_path, tiny.model)
    assert e.vocab_ids.numel() == TINY_VOCAB and torch.equal(e.compact_vocab, keep)
    e.shrink_vocab()  # its compact vocab
    assert e.cfg.draft_vocab == 40 and torch.equal(e.vocab_ids, keep.sort().values)
    part = e.depth_probs(last)
    sub = whole[:, e.vocab_ids]
    torch.testing.assert_close(part, sub / sub.sum(-1, keepdim=True), atol=1e-6, rtol=1e-4)
    with pytest.raises(FastEagleError, match="not in the drafter's draft vocab"):
        make(tiny, draft_vocab=16).shrink_vocab(torch.arange(TINY_VOCAB))
    whole_already = make(tiny).grow_vocab(TINY_VOCAB)  # nothing grew: no compact vocab to fall back on
    assert whole_already.compact_vocab is None
    with pytest.raises(FastEagleError, match="no compact vocab"):
        whole_already.shrink_vocab()


def test_grow_mlp_keeps_the_function_and_adds_trainable_channels(tiny, tmp_path):
    """Widening the MLP changes no output (new channels' down columns are zero), takes the target's
    next MLP channels for the new gate/up rows, trains the new channels, and saves/loads widened."""
    d = make(tiny)
    ids = torch.randint(4, TINY_VOCAB, (2, 12))
    f = features(tiny, ids, d.cfg.feature_layers)
    pos = torch.arange(11)[None].expand(2, -1)
    with torch.no_grad():
        before = d.hidden(f[:, :-1], ids[:, 1:], pos)
    d.grow_mlp(128, tiny.model)  # the tiny target's own MLP width: rows 96..127 come from it
    assert d.cfg.intermediate == 128
    top = tiny.model.model.layers[0].mlp  # drafter layer i pairs with target layer i of the last N (2 here)
    mlp = d.layers[0].mlp
    assert mlp.gate_proj.weight.shape == (128, 64) and mlp.down_proj.weight.shape == (64, 128)
    assert torch.equal(mlp.up_proj.weight[96:], top.up_proj.weight[96:128])
    assert torch.count_nonzero(mlp.down_proj.weight[:, 96:]) == 0
    with torch.no_grad():
        after = d.hidden(f[:, :-1], ids[:, 1:], pos)
    for x, y in zip(before, after):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
    sum(o.pow(2).mean() for o in d.hidden(f[:, :-1], ids[:, 1:], pos)).backward()
    assert d.layers[0].mlp.down_proj.weight.grad[:, 96:].abs().sum() > 0
    d.grow_mlp(160)  # beyond the target's width: random gate/up rows, still the same function
    assert d.layers[0].mlp.gate_proj.weight[128:].abs().sum() > 0
    d.save(tmp_path, dtype=torch.float32)
    e = CascadedDrafter.load(tmp_path, tiny.model)
    assert e.cfg.intermediate == 160
    with torch.no_grad():
        again = e.hidden(f[:, :-1], ids[:, 1:], pos)
    for x, y in zip(before, again):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)
    with pytest.raises(FastEagleError, match="cannot shrink"):
        e.grow_mlp(64)


def test_sharded_save_loads_back(tiny, tmp_path):
    d = make(tiny)
    d.save(tmp_path, shard_mb=0.05)
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    e = CascadedDrafter.load(tmp_path, tiny.model)
    torch.testing.assert_close(e.fc.weight, d.fc.weight.half().float())


def test_a_drafter_for_another_target_is_refused(tiny, tmp_path):
    make(tiny).save(tmp_path)
    other = tiny_target(seed=1)
    with pytest.raises(FastEagleError, match="trained for"):
        CascadedDrafter.load(tmp_path, other.model)


def test_missing_drafter_is_a_clear_error(tmp_path, tiny):
    with pytest.raises(FastEagleError, match="no drafter"):
        CascadedDrafter.load(tmp_path / "nothing", tiny.model)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_a_corrupt_drafter_config_is_a_clear_error(tiny, tmp_path, text):
    """A config.json that is not a JSON object: one FastEagleError whichever loader reads it."""
    make(tiny).save(tmp_path)
    (tmp_path / "config.json").write_text(text)
    for load in (load_drafter, CascadedDrafter.load):
        with pytest.raises(FastEagleError, match="the drafter config .*(not|must)|cannot read the drafter config"):
            load(tmp_path, tiny.model)


def test_weights_that_do_not_match_the_config_are_a_clear_error(tiny, tmp_path):
    make(tiny).save(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"intermediate": 64}))
    with pytest.raises(FastEagleError, match="do not match its config.json"):
        CascadedDrafter.load(tmp_path, tiny.model)


def test_a_packed_drafter_keeps_the_targets_head_out_of_its_own_weights(tmp_path):
    """The packed head copy wraps the target's frozen head: drafting adds nothing to the drafter's
    parameters or saved file (which loads back), and moving the drafter leaves the target's head alone."""
    t = tiny_target()
    d = make(t).pack_for_cpu(False)
    if d.packing is None:
        pytest.skip("this PyTorch build cannot prepack linear layers")
    names = set(d.state_dict())
    d.depth_probs(last_hidden(t, d))  # makes the head's packed copy
    assert d._head_packed is not None and set(d.state_dict()) == names
    assert all(p is not t.model.lm_head.weight for p in d.parameters())
    d.save(tmp_path, dtype=torch.float32)
    e = CascadedDrafter.load(tmp_path, t.model)
    for k, v in d.state_dict().items():
        assert torch.equal(e.state_dict()[k], v), k
    d.to(torch.float64)
    assert t.model.lm_head.weight.dtype == torch.float32


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_a_drafter_moved_to_another_dtype_between_sequences_still_drafts(mode):
    """`reset` starts the next sequence in the drafter's current dtype: a KV cache made for the old
    one is made again, not written into with silent casts (attention then refuses mixed dtypes)."""
    t = tiny_target()
    d = make(t)
    d.tree_k, d.tree_budget, d.step_mode = 4, 8, mode
    prompt = torch.tensor([5, 7, 9, 11, 7, 9])
    assert run(t, prompt, drafter=d, max_new_tokens=6)[0] == run(t, prompt, max_new_tokens=6)[0]
    t.model.to(torch.float64)
    d.to(torch.float64)
    assert run(t, prompt, drafter=d, max_new_tokens=6)[0] == run(t, prompt, max_new_tokens=6)[0]


def test_cli_methods_pick_the_tree_shape(tiny, tmp_path):
    from types import SimpleNamespace

    from fasteagle.cli import make_drafter

    make(tiny).save(tmp_path)
    args = SimpleNamespace(tree_k="4,2", tree_budget=9, drafter=str(tmp_path))
    assert make_drafter("fasteagle", tiny, args).tree_shape == "product"  # the default
    paper = SimpleNamespace(**vars(args), tree_shape="backbone")
    assert make_drafter("fasteagle", tiny, paper).tree_shape == "backbone"
    d = make_drafter("fasteagle-backbone", tiny, SimpleNamespace(**vars(args), tree_shape="product"))
    assert d.tree_shape == "backbone" and d.tree_k == [4, 2] and d.tree_budget == 9
    ids = torch.randint(4, TINY_VOCAB, (8,))
    d.reset(64)
    d.extend(ids, features(tiny, ids[None], d.feature_layers)[0], 5)
    tree = d.draft(5)  # the paper's tree: only the spine has children
    spine = {int((tree.depths == k).nonzero()[0]) for k in range(int(tree.depths.max()) + 1)}
    assert set(tree.parents[1:].tolist()) <= spine
    eager = make_drafter("fasteagle-eager", tiny, args)  # the graph-free step, for a side-by-side on a GPU
    assert eager.step_mode == "dynamic" and eager.state.mode() == "dynamic" and eager.tree_shape == "product"
    assert make_drafter("fasteagle", tiny, args).step_mode is None  # the device decides
    host = make_drafter("fasteagle-host-tree", tiny, args)  # the graph's tree built on the host instead
    assert host.tree_on_device is False and host.step_mode is None
    make(tiny, draft_vocab=64).save(tmp_path / "small")
    small = SimpleNamespace(**(vars(args) | {"drafter": str(tmp_path / "small")}))
    assert make_drafter("fasteagle", tiny, small).vocab_ids.numel() == 64  # the trained draft vocab
    wide = make_drafter("fasteagle", tiny, SimpleNamespace(**vars(small), full_vocab=True))
    assert wide.vocab_ids.numel() == TINY_VOCAB and wide.tree_k == [4, 2]
    assert len(run(tiny, ids, drafter=wide, max_new_tokens=8)[0]) == 8
    from fasteagle.methods import Settings  # default: the whole vocabulary on a GPU only
    assert Settings().wants_full_vocab(torch.device("cuda")) and not Settings().wants_full_vocab(torch.device("cpu"))
    off = SimpleNamespace(**vars(small), full_vocab=False)
    assert not Settings(full_vocab=False).wants_full_vocab(torch.device("cuda"))
    assert make_drafter("fasteagle", tiny, off).vocab_ids.numel() == 64
    grown = make(tiny, draft_vocab=64).grow_vocab(TINY_VOCAB)  # a whole-vocabulary drafter that grew from 64
    grown.save(tmp_path / "grown")
    g_args = SimpleNamespace(**(vars(args) | {"drafter": str(tmp_path / "grown")}))
    assert make_drafter("fasteagle", tiny, g_args).vocab_ids.numel() == 64  # a CPU drafts over the compact vocab
    on = SimpleNamespace(**vars(g_args), full_vocab=True)
    assert make_drafter("fasteagle", tiny, on).vocab_ids.numel() == TINY_VOCAB


@pytest.mark.parametrize("shape", ["product", "backbone"])
@pytest.mark.parametrize("k,budget", [(1, 5), (4, 20), (10, 60)])
def test_untrained_cascade_is_lossless(tiny, k, budget, shape):
    """Untrained, the cascade's drafts are all rejected; steered towards the reply (its layers, caches
    and trees still its own) they are accepted, deep paths included: both give vanilla's output."""
    d = make(tiny)
    d.tree_k, d.tree_budget, d.tree_shape = k, budget, shape
    ids = torch.randint(4, TINY_VOCAB, (10,))
    want, _ = run(tiny, ids, max_new_tokens=30)
    got, traces = run(tiny, ids, drafter=d, max_new_tokens=30)
    assert got == want
    assert max(len(t.tree["tokens"]) for t in traces[1:]) <= budget
    got, traces = run(tiny, ids, drafter=steer(d, want), max_new_tokens=30)
    assert got == want
    assert max(len(t.tree["tokens"]) for t in traces[1:]) <= budget
    assert traces[-1].tau > 2.0 and max(len(t.path) for t in traces[1:]) > min(N, budget - 1, 4), \
        "the steered drafts must be accepted, deep paths included"


SHIPPED_PROMPTS = ["Explain what a hash table is to a beginner.",
                   "Write a Python function that checks whether a string is a palindrome.",
                   "Give me three tips for learning a new language."]


@pytest.mark.integration
def test_shipped_drafter_is_lossless_and_accepts_on_the_default_model(smollm):
    """The trained drafter in assets/ (and joined with lookup) on the real target: greedy fp32
    output equals vanilla token for token, and training shows (an untrained cascade accepts ~nothing)."""
    from types import SimpleNamespace

    from fasteagle.cli import make_drafter
    from fasteagle.generate import chat_prompt_ids

    args = SimpleNamespace(tree_k="10", tree_budget=6, drafter=None, eagle3_drafter=None)
    drafters = {m: make_drafter(m, smollm, args) for m in ("fasteagle", "fasteagle+lookup")}
    drafters["fasteagle backbone 60"] = make_drafter(
        "fasteagle", smollm, SimpleNamespace(tree_k="10", tree_budget=60, drafter=None, tree_shape="backbone"))
    big = SimpleNamespace(**vars(args) | {"tree_budget": 60})
    drafters["fasteagle product 60"] = make_drafter("fasteagle", smollm, big)
    assert drafters["fasteagle product 60"].tree_shape == "product"  # the default
    taus = {m: [] for m in drafters}
    for prompt in SHIPPED_PROMPTS:
        ids = chat_prompt_ids(smollm, prompt)
        want, _ = run(smollm, ids, max_new_tokens=40)
        for m, d in drafters.items():
            got, traces = run(smollm, ids, drafter=d, max_new_tokens=40)
            assert got == want, f"{m} differs from vanilla on {prompt!r}"
            taus[m].append(traces[-1].tau)
    mean = {m: sum(v) / len(v) for m, v in taus.items()}
    assert all(v > 1.3 for v in mean.values()), mean


def test_a_cascade_trained_on_true_tokens_reads_them_in_training_and_its_own_when_drafting(tiny):
    """token_source "true": in the loss, layer i+1 at slot t reads the sequence's token t+1+i (the one the
    deeper targets are conditioned on), not depth i's top-1 draft of it; drafting, which has no sequence ahead,
    reads its own, exactly as the "draft" cascade of the same weights does."""
    own, true = make(tiny, token_conditioned=True), make(tiny, token_conditioned=True, token_source="true")
    for lin in own.tok_fc:
        torch.nn.init.normal_(lin.weight, 0, 0.5)
    true.load_state_dict(own.state_dict())
    ids = torch.randint(4, TINY_VOCAB, (1, 14))
    f = features(tiny, ids, own.cfg.feature_layers)
    with torch.no_grad():
        outs = true.depth_outputs(f[:, :-1], ids[:, 1:], true_tokens=True)
        depth1 = torch.cat([ids[:, 2:], ids.new_zeros(1, 1)], 1)  # slot t: token t+2, padded past the end
        x = outs[0] + true.tok_fc[0](true.embed(depth1))
        pos = torch.arange(13)[None]
        y = true.layers[1](x, position_ids=pos, position_embeddings=true.rotary(x, pos))
        torch.testing.assert_close(outs[1], y[0] if isinstance(y, tuple) else y, atol=1e-5, rtol=1e-4)
        for a, b in zip(own.depth_outputs(f[:, :-1], ids[:, 1:]), true.depth_outputs(f[:, :-1], ids[:, 1:])):
            torch.testing.assert_close(a, b)
    probs = torch.tensor([0.75, 0.25]).expand(1, 14, 2).clone()
    top = torch.randint(4, TINY_VOCAB, (1, 14, 2))
    loss_own = own.train().loss(f, ids, torch.ones(1, 14), top, probs)[0]
    loss_true = true.train().loss(f, ids, torch.ones(1, 14), top, probs)[0]
    assert not torch.isclose(loss_own, loss_true)  # the sequence's tokens, not its drafts, reached the layers
    loss_true.backward()
    assert all(lin.weight.grad.abs().sum() > 0 for lin in true.tok_fc)

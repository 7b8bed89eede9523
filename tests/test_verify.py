"""fasteagle.verify: the greedy and the stochastic acceptance rules.

The distribution tests draw >= 20,000 speculative steps on the tiny target and compare the joint
distribution of the first three tokens after the root with the target's exact distribution
(computed by brute force with cache-free forwards), by a chi-square test over hierarchical bins.
The same statistic must reject deliberately broken acceptance rules.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch
from scipy.stats import chi2

from fasteagle import verify as V
from fasteagle.errors import FastEagleError
from fasteagle.kvcache import KVCache
from fasteagle.tree import make_tree, path_tree, root_only
from fasteagle.verify import (
    ACCEPTED,
    NEVER_REACHED,
    REJECTED,
    SamplingParams,
    target_probs,
    tree_forward,
    verify,
    verify_greedy,
    verify_sampling,
)
from tests.drafters import one_thread
from tests.test_tree import random_parents

_one_thread = pytest.fixture(autouse=True, scope="module")(one_thread)

VOCAB = 320


# -- the target's sampling distribution ----------------------------------------------------------

def ref_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Independent reference: softmax(logits / T), then the smallest top set with mass >= top_p."""
    p = torch.softmax(logits.double() / temperature, -1)
    if top_p < 1.0:
        sp, order = p.sort(-1, descending=True)
        k = (sp.cumsum(-1) < top_p).sum(-1, keepdim=True)  # index of the first token reaching top_p
        keep = torch.arange(p.shape[-1]) <= k
        p = torch.zeros_like(p).scatter(-1, order, sp * keep)
        p = p / p.sum(-1, keepdim=True)
    return p


@pytest.mark.parametrize("temperature,top_p", [(-0.1, 1.0), (float("nan"), 1.0), (float("inf"), 1.0), (0.7, 0.0),
                                               (0.7, -1.0), (0.7, 1.5), (0.7, float("nan"))])
def test_bad_sampling_settings_are_one_line_errors(temperature, top_p):
    with pytest.raises(FastEagleError, match="temperature|top-p"):
        SamplingParams(temperature, top_p)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.5, 1.0), (1.3, 0.9), (0.7, 0.5), (1.0, 0.01)])
def test_target_probs(temperature, top_p):
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(0)) * 4
    p = target_probs(logits, SamplingParams(temperature, top_p))
    ref = ref_probs(logits, temperature, top_p)
    assert torch.allclose(p.double(), ref, atol=1e-6)
    assert torch.allclose(p.sum(-1), torch.ones(6), atol=1e-5)
    kept = (p > 0).sum(-1)
    if top_p == 0.01:
        assert (kept == 1).all() and torch.equal(p.argmax(-1), logits.argmax(-1))
    if top_p < 1.0:  # the kept set is the smallest prefix of the sorted distribution with mass >= top_p
        full = torch.softmax(logits / temperature, -1).sort(-1, descending=True).values
        for row in range(6):
            k = int(kept[row])
            assert full[row, :k].sum() >= top_p - 1e-6
            assert full[row, :k - 1].sum() < top_p


def test_greedy_params():
    assert SamplingParams().greedy and SamplingParams(0.0, 0.9).greedy and not SamplingParams(0.1).greedy


# -- greedy ---------------------------------------------------------------------------------------

def brute_greedy(logits: torch.Tensor, parents: list[int], tokens: list[int]):
    children = {i: [c for c in range(len(parents)) if parents[c] == i] for i in range(len(parents))}
    status = [NEVER_REACHED] * len(parents)
    node, path = 0, [0]
    status[0] = ACCEPTED
    while True:
        best = int(logits[node].argmax())
        for c in children[node]:
            status[c] = REJECTED
        nxt = [c for c in children[node] if tokens[c] == best]
        if not nxt:
            return path, best, status
        node = nxt[0]
        status[node] = ACCEPTED
        path.append(node)


def test_verify_greedy_hand_made():
    #   0 -> 1 -> 3 -> 5        the target agrees with 1, 3 (not 5): path 0,1,3, bonus argmax at 3
    #     \> 2    \> 4 (leaf)
    tokens = torch.tensor([9, 10, 11, 12, 13, 14])
    parents = torch.tensor([-1, 0, 0, 1, 1, 3])
    tree = make_tree(tokens, parents)
    logits = torch.zeros(6, VOCAB)
    logits[0, 10] = 5  # root predicts node 1's token
    logits[1, 12] = 5  # node 1 predicts node 3's token
    logits[3, 77] = 5  # node 3 predicts 77, not node 5's 14
    logits[2, 11] = logits[4, 13] = 9  # unreachable nodes' predictions must not matter
    v = verify_greedy(logits, tree)
    assert v.path.tolist() == [0, 1, 3] and v.bonus == 77
    assert v.status.tolist() == [ACCEPTED, ACCEPTED, REJECTED, ACCEPTED, REJECTED, REJECTED]
    probs = torch.softmax(logits, -1)
    assert torch.allclose(v.target_probs, torch.stack([torch.tensor(1.0), probs[0, 10], probs[0, 11],
                                                        probs[1, 12], probs[1, 13], probs[3, 14]]))
    # a side leaf accepted: the path stops there and the bonus is the leaf's own argmax
    logits[1, 13] = 7
    logits[4, 55] = 12
    v = verify_greedy(logits, tree)
    assert v.path.tolist() == [0, 1, 4] and v.bonus == 55
    assert v.status.tolist() == [ACCEPTED, ACCEPTED, REJECTED, REJECTED, ACCEPTED, NEVER_REACHED]
    # nothing accepted: the bonus is the root's argmax
    logits[0, 200] = 50
    v = verify_greedy(logits, tree)
    assert v.path.tolist() == [0] and v.bonus == 200
    assert v.status.tolist() == [ACCEPTED, REJECTED, REJECTED, NEVER_REACHED, NEVER_REACHED, NEVER_REACHED]


@pytest.mark.parametrize("seed", range(30))
def test_verify_greedy_matches_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 50, (), generator=gen))
    parents = random_parents(n, gen, float(torch.rand((), generator=gen)))
    # distinct tokens under each parent (a drafter never repeats a sibling): all distinct here
    tokens = torch.randperm(VOCAB, generator=gen)[:n]
    logits = torch.randn(n, VOCAB, generator=gen)
    for i in range(1, n):  # make the target agree with many drafted nodes
        if float(torch.rand((), generator=gen)) < 0.5:
            logits[parents[i], tokens[i]] = 10 + float(torch.rand((), generator=gen))
    tree = make_tree(tokens, parents)
    v = verify_greedy(logits, tree)
    path, bonus, status = brute_greedy(logits, parents.tolist(), tokens.tolist())
    assert v.path.tolist() == path and v.bonus == bonus and v.status.tolist() == status
    assert verify(logits, tree, SamplingParams(0.0)).path.tolist() == path


# -- stochastic: basic properties -----------------------------------------------------------------

def test_sampling_certain_and_impossible_candidates():
    tree = make_tree(torch.tensor([1, 10, 11, 12, 13]), torch.tensor([-1, 0, 0, 1, 3]))
    logits = torch.full((5, VOCAB), -1e4)
    logits[0, 10] = logits[0, 11] = 0.0  # root: 10 or 11, 50/50
    logits[1, 12] = 0.0  # after 10: 12 for sure
    logits[3, 99] = 0.0  # after 12: 99 for sure (13 impossible)
    gen = torch.Generator().manual_seed(0)
    seen = Counter()
    for _ in range(400):
        v = verify_sampling(logits, tree, SamplingParams(1.0), gen)
        out = tuple(tree.tokens[v.path[1:]].tolist()) + (v.bonus,)
        seen[out] += 1
        if 1 in v.path.tolist():
            assert v.path.tolist() == [0, 1, 3] and v.bonus == 99
            # a reached node's untried siblings count as rejected too
            assert v.status.tolist() == [ACCEPTED, ACCEPTED, REJECTED, ACCEPTED, REJECTED]
        else:  # 10 rejected: the residual is all on 11, so sibling 11 is accepted with probability 1
            assert v.path.tolist() == [0, 2]
    assert all(k == (10, 12, 99) or (len(k) == 2 and k[0] == 11) for k in seen), seen
    assert 150 < seen[(10, 12, 99)] < 250


def test_sampling_bonus_never_a_rejected_sibling():
    """After children are rejected, the bonus comes from the residual: never one of them."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.zeros(1 + 3, VOCAB)
    logits[0, :3] = 3.0  # the root's mass is concentrated on tokens 0, 1, 2 = its three children
    tree = make_tree(torch.tensor([5, 0, 1, 2]), torch.tensor([-1, 0, 0, 0]))
    for _ in range(300):
        v = verify_sampling(logits, tree, SamplingParams(1.0), gen)
        if v.path.tolist() == [0]:
            assert v.bonus not in (0, 1, 2)
            assert v.status.tolist() == [ACCEPTED, REJECTED, REJECTED, REJECTED]


def test_sampling_is_reproducible_and_uses_only_the_given_generator():
    gen_tree = torch.Generator().manual_seed(2)
    tree = make_tree(torch.randperm(VOCAB, generator=gen_tree)[:12], random_parents(12, gen_tree))
    logits = torch.randn(12, VOCAB, generator=gen_tree)
    runs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(7)
        torch.manual_seed(int(torch.randint(0, 1000, ())))  # the global RNG must not matter
        runs.append([(verify_sampling(logits, tree, SamplingParams(0.8, 0.9), gen).path.tolist())
                     for _ in range(50)])
    assert runs[0] == runs[1]


# -- stochastic: the distribution of the first three tokens ---------------------------------------

PREFIX = torch.tensor([1, 5, 17, 99, 200, 3, 1, 6, 64, 130])
ROOT = 42
N_SAMPLES = 20_000
MIN_EXPECTED = 10
ALPHA = 1e-3


class Exact:
    """The target's exact next-token distributions after PREFIX + ROOT (+ one or two tokens)."""

    def __init__(self, model, temperature: float, top_p: float):
        self.model, self.t, self.top_p = model, temperature, top_p
        ctx = torch.cat([PREFIX, torch.tensor([ROOT])])
        self.ctx = ctx
        self.p1 = self._next([[]])[0]
        self.p2 = self._next([[a] for a in range(VOCAB)])  # (V, V): row a = p(x2 | x1 = a)
        self.p3: dict[tuple[int, int], torch.Tensor] = {}

    def _next(self, conts: list[list[int]]) -> torch.Tensor:
        seqs = torch.stack([torch.cat([self.ctx, torch.tensor(c, dtype=torch.long)]) for c in conts])
        with torch.inference_mode():
            logits = self.model(input_ids=seqs).logits[:, -1].double()
        return ref_probs(logits, self.t, self.top_p)

    def need_p3(self, pairs) -> None:
        todo = sorted({p for p in pairs if p not in self.p3})
        for i in range(0, len(todo), 512):
            chunk = todo[i:i + 512]
            for pair, row in zip(chunk, self._next([list(p) for p in chunk])):
                self.p3[pair] = row


class Bins:
    """Hierarchical bins: a triple if expected >= MIN_EXPECTED, else its pair, else x1, else 'rest'."""

    def __init__(self, exact: Exact, n: int):
        m = MIN_EXPECTED / n
        p1, p2 = exact.p1, exact.p2
        joint2 = p1[:, None] * p2
        self.singles = {a for a in range(VOCAB) if p1[a] >= m}
        self.pairs = {(a, b) for a, b in (joint2 >= m).nonzero().tolist() if a in self.singles}
        exact.need_p3(self.pairs)
        self.triples = set()
        prob: dict = {}
        for (a, b) in self.pairs:
            row = joint2[a, b] * exact.p3[(a, b)]
            for c in (row >= m).nonzero().squeeze(1).tolist():
                self.triples.add((a, b, c))
                prob[(a, b, c)] = float(row[c])
        for (a, b) in self.pairs:
            prob[(a, b)] = float(joint2[a, b]) - sum(float(joint2[a, b] * exact.p3[(a, b)][c])
                                                     for c in range(VOCAB) if (a, b, c) in self.triples)
        for a in self.singles:
            prob[(a,)] = float(p1[a]) - sum(float(joint2[a, b]) for b in range(VOCAB) if (a, b) in self.pairs)
        prob[()] = 1.0 - sum(float(p1[a]) for a in self.singles)
        self.prob = {k: max(v, 0.0) for k, v in prob.items()}

    def key(self, a: int, b: int, c: int | None):
        if (a, b) in self.pairs:
            return (a, b, c) if (a, b, c) in self.triples else (a, b)
        return (a,) if a in self.singles else ()

    def chi_square(self, counts: Counter, n: int) -> tuple[float, float, int]:
        """(statistic, critical value at ALPHA, dof); bins whose expectation is tiny merge into 'rest'."""
        keys = [k for k in self.prob if self.prob[k] * n >= MIN_EXPECTED]
        small = [k for k in self.prob if k not in keys]
        exp = [self.prob[k] * n for k in keys] + [sum(self.prob[k] for k in small) * n]
        obs = [counts.get(k, 0) for k in keys] + [sum(counts.get(k, 0) for k in small)]
        if exp[-1] < 1e-9:
            exp, obs = exp[:-1], obs[:-1]
        assert sum(obs) == n
        stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
        dof = len(exp) - 1
        return stat, float(chi2.isf(ALPHA, dof)), dof


def sampling_tree(exact: Exact, top_p: float):
    """A tree whose candidates are the target's likely tokens in a scrambled order plus unlikely ones:
    depth-1 side branches, a deep backbone (depth 3) and a branch under a non-first child."""
    a = exact.p1.argsort(descending=True).tolist()
    b = exact.p2[a[0]].argsort(descending=True).tolist()
    b1 = exact.p2[a[1]].argsort(descending=True).tolist()
    exact.need_p3([(a[0], b[0])])
    c = exact.p3[(a[0], b[0])].argsort(descending=True).tolist()
    unlikely = a[-1]  # outside the nucleus when top_p < 1
    tokens = [ROOT, unlikely, a[1], a[0], a[3], b1[0], b[2], b[0], a[-2], c[0], c[1]]
    parents = [-1, 0, 0, 0, 0, 2, 3, 3, 3, 7, 7]
    if top_p < 1.0:
        assert exact.p1[unlikely] == 0
    return make_tree(torch.tensor(tokens), torch.tensor(parents))


class _AlwaysAccept:
    """Stands in for `torch` inside fasteagle.verify: every uniform draw is 0."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def rand(*args, **kwargs):
        return torch.zeros(())


@contextlib.contextmanager
def broken(rule: str | None, monkeypatch):
    """Inject a broken acceptance rule into fasteagle.verify.verify_sampling."""
    if rule is None:
        yield
        return
    with monkeypatch.context() as mp:
        if rule == "always_accept":  # every draw u = 0 < p(x): any possible candidate is accepted
            mp.setattr(V, "torch", _AlwaysAccept())
        elif rule == "no_renormalisation":  # p.sum() -> 1: after a rejection p(x) is not renormalised
            mp.setattr(torch.Tensor, "sum", lambda self, *a, **k: torch.ones((), dtype=self.dtype))
        elif rule == "no_residual":  # p[x] = 0 is skipped: the bonus / next tries ignore rejections
            mp.setattr(torch.Tensor, "__setitem__", lambda self, idx, value: None)
        else:
            raise ValueError(rule)
        yield


def speculative_first_three(model, exact: Exact, tree, params: SamplingParams, n: int, rule, monkeypatch):
    cache = KVCache.for_model(model, 64)
    with torch.inference_mode():
        tree_forward(model, cache, path_tree(PREFIX))
        cache.keep(torch.arange(PREFIX.numel()))
        logits, _ = tree_forward(model, cache, tree)
    gen = torch.Generator().manual_seed(1234)
    tokens = tree.tokens.tolist()
    emitted = []
    with broken(rule, monkeypatch):
        for _ in range(n):
            v = verify_sampling(logits, tree, params, gen)
            emitted.append([tokens[i] for i in v.path.tolist()[1:]] + [v.bonus])
    return emitted


def complete_and_count(emitted, exact: Exact, bins: Bins) -> Counter:
    """Tokens 2 and 3, when the step emitted fewer, come from the target's exact distribution
    (as the next target forward would give them); only the bins' resolution is sampled."""
    gen = torch.Generator().manual_seed(99)
    counts = Counter()
    for out in emitted:
        a = out[0]
        b = out[1] if len(out) > 1 else int(torch.multinomial(exact.p2[a].float(), 1, generator=gen))
        c = None
        if (a, b) in bins.pairs:
            c = out[2] if len(out) > 2 else int(torch.multinomial(exact.p3[(a, b)].float(), 1, generator=gen))
        counts[bins.key(a, b, c)] += 1
    return counts


SETTINGS = {"t0.5": (0.5, 1.0), "t0.8_top_p0.7": (0.8, 0.7)}


@pytest.fixture(scope="module")
def setups(tiny):
    out = {}
    for name, (t, top_p) in SETTINGS.items():
        exact = Exact(tiny.model, t, top_p)
        out[name] = (exact, Bins(exact, N_SAMPLES), sampling_tree(exact, top_p), SamplingParams(t, top_p))
    return out


def chi_square_of(tiny, setups, name, rule, monkeypatch):
    exact, bins, tree, params = setups[name]
    emitted = speculative_first_three(tiny.model, exact, tree, params, N_SAMPLES, rule, monkeypatch)
    counts = complete_and_count(emitted, exact, bins)
    stat, crit, dof = bins.chi_square(counts, N_SAMPLES)
    depth_hist = Counter(min(len(e) - 1, 3) for e in emitted)
    return stat, crit, dof, depth_hist


@pytest.mark.parametrize("name", list(SETTINGS))
def test_speculative_sampling_matches_target_distribution(tiny, setups, name, monkeypatch):
    stat, crit, dof, depth_hist = chi_square_of(tiny, setups, name, None, monkeypatch)
    assert dof >= 100, "the bins must resolve the distribution finely"
    # the tree really exercises acceptance: first-level, second-level and third-level accepts
    assert depth_hist[1] > 1000 and depth_hist[2] > 200 and depth_hist[3] > 20, depth_hist
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f} (dof {dof}): not the target's distribution"


@pytest.mark.parametrize("rule", ["always_accept", "no_renormalisation", "no_residual"])
def test_broken_acceptance_rules_fail_the_same_test(tiny, setups, rule, monkeypatch):
    stat, crit, dof, _ = chi_square_of(tiny, setups, "t0.5", rule, monkeypatch)
    assert stat > crit, f"a broken rule ({rule}) passed: chi-square {stat:.1f} < {crit:.1f} (dof {dof})"


def test_root_only_sampling_is_the_target_distribution(tiny, setups):
    """Plain decoding (a one-node tree) samples the bonus straight from the target distribution."""
    exact, _, _, params = setups["t0.8_top_p0.7"]
    cache = KVCache.for_model(tiny.model, 64)
    with torch.inference_mode():
        tree_forward(tiny.model, cache, path_tree(PREFIX))
        cache.keep(torch.arange(PREFIX.numel()))
        logits, _ = tree_forward(tiny.model, cache, root_only(ROOT))
    gen = torch.Generator().manual_seed(5)
    n = 5000
    counts = Counter(verify(logits, root_only(ROOT), params, gen).bonus for _ in range(n))
    support = (exact.p1 > 0).nonzero().squeeze(1).tolist()
    assert set(counts) <= set(support)
    exp = exact.p1[support] * n
    obs = torch.tensor([counts.get(a, 0) for a in support], dtype=torch.double)
    stat = float(((obs - exp) ** 2 / exp).sum())
    assert stat < chi2.isf(ALPHA, len(support) - 1)

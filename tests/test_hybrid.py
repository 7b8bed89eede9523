"""fasteagle.hybrid: a drafter's tree joined with prompt lookup's, verified as one tree."""

from __future__ import annotations

import pytest
import torch

from fasteagle.generate import run
from fasteagle.hybrid import LOOKUP_SOURCE, WithLookup
from fasteagle.lookup import LookupDrafter
from fasteagle.tree import select
from tests.conftest import TINY_VOCAB
from tests.drafters import OracleDrafter, RandomDrafter, one_thread
from tests.test_generate import targets, tiny_prompt, vanilla  # noqa: F401  (fixture)

_one_thread = pytest.fixture(autouse=True, scope="module")(one_thread)


def lookup_accepts(traces) -> int:
    """Accepted nodes that only lookup proposed."""
    return sum(tr.tree["sources"][i] == LOOKUP_SOURCE for tr in traces[1:] for i in tr.path[1:])


@pytest.mark.parametrize("shape,depth,k,budget", [("backbone", 4, 3, 8), ("chain", 3, 1, 64), ("dynamic", 4, 3, 12)])
def test_greedy_lossless_with_lookup(targets, shape, depth, k, budget):  # noqa: F811
    from_lookup = 0
    for name, target in targets.items():
        for seed in range(3):
            ids = tiny_prompt(20 + seed)
            ref = vanilla(target, ids, 64)
            for inner in (RandomDrafter(TINY_VOCAB, shape, depth, k, budget, seed=seed),
                          OracleDrafter(ref, TINY_VOCAB, shape, depth, k, budget, seed=seed, corrupt=0.5)):
                out, traces = run(target, ids, drafter=WithLookup(inner), max_new_tokens=64)
                assert out == ref, f"{type(inner).__name__} + lookup differs from vanilla ({name}, seed {seed})"
                from_lookup += lookup_accepts(traces)
                for before, tr in zip(traces, traces[1:]):  # every tree holds the inner drafter's tree
                    drafted = inner.trees[tr.step - 1]  # to the depth of the tokens left
                    drafted = select(drafted, drafted.depths <= 64 - before.generated - 1)
                    assert tr.tree["tokens"][:drafted.size] == drafted.tokens.tolist()
    assert from_lookup > 0  # the tiny random model repeats itself: lookup's own branches get accepted


def test_the_wrapper_passes_the_tree_settings_through_and_nothing_else():
    inner = RandomDrafter(TINY_VOCAB, "backbone", 4, 3, 8)
    inner.tree_budget, inner.tree_k = 8, 3
    d = WithLookup(inner, LookupDrafter(max_ngram=2))
    d.tree_budget, d.tree_k = 5, [3, 2]
    assert (inner.tree_budget, inner.tree_k) == (d.tree_budget, d.tree_k) == (5, [3, 2])
    assert d.lookup.max_ngram == 2 and d.feature_layers == ()
    d.budget = 6  # not a setting of the wrapper's: it stays on the wrapper, the wrapped drafter keeps its own
    assert inner.budget == 8 and not hasattr(d, "shape") and not hasattr(d, "info")
    with pytest.raises(AttributeError):
        d.info = {}


def test_lookup_nodes_extend_the_inner_tree():
    inner = RandomDrafter(TINY_VOCAB, "chain", 2, 1, 64, seed=3)
    d = WithLookup(inner)
    d.reset(100)
    d.extend(torch.tensor([5, 6, 7, 8, 5, 6]), None, 7)
    tree = d.draft(7)
    n = inner.trees[-1].size
    assert tree.tokens[:n].tolist() == inner.trees[-1].tokens.tolist()
    # lookup's chain 7 -> 8 -> 5 -> 6 -> 7 hangs off the root unless the random chain shares its start
    assert set(tree.sources[n:].tolist()) <= {LOOKUP_SOURCE} and tree.size > n


def test_rewind_rewinds_lookup_too():
    """A rewind reaches both drafters: before, `__getattr__` handed it to the wrapped one alone, and
    lookup went on drafting from positions the cache had dropped."""
    class Rewinding(RandomDrafter):
        def rewind(self, length):
            self.history = self.history[:length]

    inner = Rewinding(TINY_VOCAB, "chain", 2, 1, 64)
    d = WithLookup(inner)
    d.reset(100)
    d.extend(torch.tensor([5, 6, 7, 8, 5, 6, 9, 5, 6]), None, 7)
    d.rewind(5)
    assert inner.history == [5, 6, 7, 8, 5] and d.lookup.history == [5, 6, 7, 8, 5]

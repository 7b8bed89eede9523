"""fasteagle.lookup: the prompt-lookup (n-gram) drafter."""

from __future__ import annotations

import pytest
import torch

from fasteagle.errors import FastEagleError
from fasteagle.generate import run
from fasteagle.lookup import LookupDrafter
from tests.conftest import TINY_VOCAB
from tests.drafters import one_thread

_one_thread = pytest.fixture(autouse=True, scope="module")(one_thread)


def drafted(history: list[int], root: int, **kw):
    d = LookupDrafter(**kw)
    d.reset(100)
    d.extend(torch.tensor(history), None, root)
    tree = d.draft(root)
    return tree.tokens.tolist(), tree.parents.tolist()


def branches(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """Root-to-leaf token lists (root excluded)."""
    leaves = [i for i in range(len(tokens)) if i not in parents]
    out = []
    for leaf in leaves:
        path, j = [], leaf
        while parents[j] >= 0:
            path.append(tokens[j])
            j = parents[j]
        out.append(path[::-1])
    return out


def test_no_match_gives_the_root_alone():
    assert drafted([5, 6, 7], 8) == ([8], [-1])
    assert drafted([], 8) == ([8], [-1])


def test_repeats_the_continuation_of_an_earlier_occurrence():
    toks, parents = drafted([5, 6, 7, 8, 5, 6], 7)
    assert toks == [7, 8, 5, 6, 7] and parents == [-1, 0, 1, 2, 3]  # a chain: root -> 8 -> 5 -> 6 -> 7


def test_longest_suffix_wins():
    # [1, 2, 3] occurred before (then 9); the 1-gram [3] occurred more recently (then 4)
    toks, _ = drafted([1, 2, 3, 9, 7, 3, 4, 1, 2], 3)
    assert toks[1] == 9
    toks, _ = drafted([1, 2, 3, 9, 7, 3, 4, 1, 2], 3, max_ngram=1, max_match=1)
    assert toks[1] == 4  # with unigrams only, the newest occurrence wins
    toks, _ = drafted([1, 2, 3, 9, 7, 3, 4, 1, 2], 3, max_ngram=1)
    assert toks[1] == 9  # unless an older one matches further back: [1, 2, 3] against [3] alone


def test_a_long_match_earns_a_long_copy():
    """A passage being restated matches far back: its draft grows to `depth`, where the 3-gram index
    alone would stop at 2**3 tokens."""
    passage = list(range(10, 40))
    toks, parents = drafted(passage + [5, 6] + passage[:9], passage[9], depth=16)
    assert toks[1:] == passage[10:26] and parents == [-1, *range(16)]
    toks, _ = drafted(passage + [5, 6] + passage[:9], passage[9], depth=16, max_match=3)
    assert toks[1:] == passage[10:18]


def test_branches_newest_first_with_distinct_first_tokens():
    toks, parents = drafted([4, 10, 4, 11], 4)
    assert toks == [4, 11, 4, 10, 4] and parents == [-1, 0, 1, 0, 3]  # one-token match: 2 tokens a branch
    # an older occurrence whose continuation starts like a newer one adds no branch
    toks, parents = drafted([4, 10, 5, 4, 10, 6], 4)
    assert branches(toks, parents) == [[10, 6]]


def test_depth_and_branch_limits():
    history = [4, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 4, 30, 31, 4, 40, 41, 4, 50]
    toks, parents = drafted(history, 4, depth=8, branches=10)  # a one-token match drafts 2 tokens a branch
    assert branches(toks, parents) == [[50, 4], [40, 41], [30, 31], [20, 21]]
    assert branches(*drafted(history, 4, depth=8, branches=2)) == [[50, 4], [40, 41]]
    assert max(len(b) for b in branches(*drafted(history, 4, depth=1, branches=10))) == 1


def test_longer_matches_draft_further():
    """After an n-token match at most 2**n tokens (up to `depth`); `min_ngram` drops short matches."""
    base = [1, 2, 3] + list(range(20, 40))
    assert branches(*drafted(base + [1, 2], 3, depth=16)) == [list(range(20, 28))]  # 3-token match: 8
    assert branches(*drafted(base + [1, 2], 3, depth=5)) == [list(range(20, 25))]
    assert branches(*drafted(base + [5, 2], 3, depth=16)) == [[20, 21, 22, 23]]  # 2-token match: 4
    assert branches(*drafted(base + [5, 6], 3, depth=16)) == [[20, 21]]  # 1-token match: 2
    assert drafted(base + [5, 6], 3, min_ngram=2) == ([3], [-1])
    assert branches(*drafted(base + [5, 2], 3, min_ngram=2)) == [[20, 21, 22, 23]]


def test_reset_and_extend():
    d = LookupDrafter()
    d.extend(torch.tensor([5, 6, 7, 8, 5, 6]), None, 7)
    d.extend(torch.tensor([7, 9]), None, 5)
    assert d.history == [5, 6, 7, 8, 5, 6, 7, 9]
    assert d.draft(5).tokens.tolist()[:2] == [5, 6]
    d.reset(10)
    assert d.history == [] and d.draft(5).size == 1


def test_in_the_loop_drafts_come_from_the_history(tiny):
    """Every drafted branch is the continuation of an earlier occurrence of the root in the text so
    far, and the output stays the vanilla output."""
    ids = torch.tensor([9, 10, 11, 12, 9, 10, 11, 12, 9, 10])

    class Recording(LookupDrafter):
        def draft(self, root):
            tree = super().draft(root)
            self.seen.append((list(self.history), root, tree))
            return tree

    d = Recording()
    d.seen = []
    out, traces = run(tiny, ids, drafter=d, max_new_tokens=40)
    assert out == run(tiny, ids, max_new_tokens=40)[0]
    assert len(d.seen) == traces[-1].forwards
    n_drafted = 0
    for history, root, tree in d.seen:
        seq = history + [root]
        toks, parents = tree.tokens.tolist(), tree.parents.tolist()
        assert toks[0] == root
        if len(toks) == 1:
            continue  # nothing found: the root alone
        for branch in branches(toks, parents):
            n_drafted += 1
            assert any(seq[s] == root and seq[s + 1: s + 1 + len(branch)] == branch for s in range(len(seq) - 1))
    assert n_drafted > 0
    assert sum(len(tr.tokens) - 1 for tr in traces[1:]) > 0, "the repetitive tiny model must accept drafts"
    assert all(0 <= t < TINY_VOCAB for t in out)


def scanned(seq: list[int], max_ngram: int, depth: int, branches: int, min_ngram: int,
            max_match: int) -> list[list[int]]:
    """The definition the drafter's n-gram index implements, as a plain scan of history + [root]: the
    longest suffix with earlier occurrences; those ranked by how far back they match (newest first
    among equals); each copies 2**match tokens, up to `depth`."""
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        ranked = []
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start:start + n] == seq[-n:]:
                m = n
                while m < max(max_match, max_ngram) and start - (m - n) - 1 >= 0 and \
                        seq[start - (m - n) - 1] == seq[-m - 1]:
                    m += 1
                ranked.append((m, start))
        found: list[list[int]] = []
        for m, start in sorted(ranked, reverse=True):
            cont = seq[start + n:start + n + min(depth, 2 ** m)]
            if all(c[0] != cont[0] for c in found):
                found.append(cont)
                if len(found) == branches:
                    break
        if found:
            return found
    return []


@pytest.mark.parametrize("kw", [{}, {"min_ngram": 2}, {"max_ngram": 4, "depth": 5, "branches": 3},
                                {"max_match": 3}, {"max_ngram": 2, "max_match": 12, "depth": 64}])
def test_the_index_drafts_what_a_scan_of_the_history_finds(kw):
    """Random small-alphabet text fed in uneven chunks: every step's tree is the scan's continuations."""
    gen = torch.Generator().manual_seed(0)
    d = LookupDrafter(**kw)
    spec = {"max_ngram": 3, "depth": 16, "branches": 2, "min_ngram": 1, "max_match": 8} | kw
    for _ in range(3):
        d.reset(0)
        text = torch.randint(0, 5, (300,), generator=gen).tolist()
        at = 0
        while at < len(text) - 1:
            n = int(torch.randint(1, 5, (1,), generator=gen))
            d.extend(torch.tensor(text[at:at + n]), None, text[min(at + n, len(text) - 1)])
            at += n
            root = text[min(at, len(text) - 1)]
            tree = d.draft(root)
            tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
            assert (branches(tokens, parents) if len(tokens) > 1 else []) == scanned(d.history + [root], **spec)


def test_rewind_forgets_the_positions_after_it():
    """`rewind(n)` leaves the drafter as if only the first n tokens had come (index included), so a
    repeated step drafts from what the cache holds, not from positions it dropped."""
    text = [5, 6, 7, 8, 5, 6, 9, 5, 6]
    d, fresh = LookupDrafter(), LookupDrafter()
    d.extend(torch.tensor(text), None, 7)
    d.rewind(5)
    fresh.extend(torch.tensor(text[:5]), None, 6)
    assert d.history == fresh.history and d.starts == fresh.starts
    assert d.draft(6).tokens.tolist() == [6, 7, 8, 5, 6]


@pytest.mark.parametrize("kw", [dict(min_ngram=0), dict(min_ngram=4, max_ngram=3), dict(depth=0), dict(branches=0)])
def test_settings_that_cannot_draft_are_refused(kw):
    """A 0-gram would match everywhere and a depth of 0 drafts nothing: said at once, not as an IndexError later."""
    with pytest.raises(FastEagleError, match="lookup needs"):
        LookupDrafter(**kw)

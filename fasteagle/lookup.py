"""Prompt-lookup (n-gram) drafting: a training-free drafter through the same protocol.

It proposes the tokens that followed the most recent earlier occurrence of the current suffix.
With several earlier occurrences that continue differently it drafts a small tree: one branch per
distinct continuation. Repetitive text (code, quoting the prompt) gets real acceptances.

How far it drafts follows the evidence: after an n-token match at most 2**n tokens (a one-token
match is a weak guess, and every drafted node costs verify time), up to `depth`. The index holds
n-grams up to `max_ngram`, but a match is measured further back (up to `max_match` tokens): text
being copied (a document restated, a quoted passage) matches far back, and earns a long draft.
Among earlier occurrences the longest match comes first, the newest among equals.

The n-grams of the history are indexed as they arrive, so a draft costs the same at any context
length (a scan of the history grew with every token; docs/design.md, "Lookup keeps an index").
"""

from __future__ import annotations

import torch

from fasteagle.errors import FastEagleError
from fasteagle.trace import LOOKUP_SOURCE
from fasteagle.tree import DraftTree, make_tree, root_only


class LookupDrafter:
    feature_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram: int = 3, depth: int = 16, branches: int = 2, min_ngram: int = 1,
                 max_match: int = 8):
        if not (1 <= min_ngram <= max_ngram and depth >= 1 and branches >= 1):
            raise FastEagleError(f"lookup needs 1 <= min_ngram <= max_ngram, depth >= 1 and branches >= 1 (got "
                                 f"min_ngram={min_ngram}, max_ngram={max_ngram}, depth={depth}, branches={branches})")
        self.max_ngram, self.depth, self.branches, self.min_ngram = max_ngram, depth, branches, min_ngram
        self.max_match = max(max_match, max_ngram)
        self.device = torch.device("cpu")
        self.reset()

    def reset(self, capacity: int = 0) -> None:
        self.history: list[int] = []
        self.starts: dict[tuple[int, ...], list[int]] = {}  # n-gram -> where it starts in history, oldest first

    def extend(self, tokens: torch.Tensor, features, next_token: int) -> None:
        self.device = tokens.device
        h, sizes = self.history, range(self.min_ngram, self.max_ngram + 1)
        for tok in tokens.tolist():
            h.append(tok)
            for n in sizes:
                if len(h) >= n:
                    self.starts.setdefault(tuple(h[-n:]), []).append(len(h) - n)

    def rewind(self, length: int) -> None:
        """Forget every position from `length` on, from the index too (a benchmark repeating one step,
        as the trained drafters' `rewind`). Newest first: each position's entry is last in its list."""
        h = self.history
        while len(h) > length:
            for n in range(self.min_ngram, min(self.max_ngram, len(h)) + 1):
                key = tuple(h[-n:])
                self.starts[key].pop()
                if not self.starts[key]:
                    del self.starts[key]
            h.pop()

    def _continuations(self, root: int) -> list[list[int]]:
        """Distinct continuations after earlier matches of the longest matching suffix of history +
        [root], longest match first. A match lies wholly in the history; its continuation may end with
        the root."""
        h = self.history
        for n in range(min(self.max_ngram, len(h)), self.min_ngram - 1, -1):
            starts = self.starts.get((*h[len(h) - n + 1:], root), ())
            ranked = sorted(((self._match(start, n), start) for start in starts), reverse=True)
            found: list[list[int]] = []
            for m, start in ranked:
                length = min(self.depth, 2 ** m)
                cont = h[start + n:start + n + length]
                if len(cont) < length:  # reaches the end of the history: the root comes next
                    cont.append(root)
                if all(c[0] != cont[0] for c in found):
                    found.append(cont)
                    if len(found) == self.branches:
                        break
            if found:
                return found
        return []

    def _match(self, start: int, n: int) -> int:
        """How many tokens the occurrence of the current n-gram at `start` matches, counting back past
        the n-gram up to `max_match` (the current suffix is history[-(n-1):] + [root])."""
        h, m = self.history, n
        while m < self.max_match and start - (m - n) - 1 >= 0 and len(h) - m >= 0 \
                and h[start - (m - n) - 1] == h[len(h) - m]:
            m += 1
        return m

    def tree(self, root: int, device: torch.device | str) -> DraftTree:
        """The draft tree from `root` on `device` (the host for a caller that edits it further)."""
        conts = self._continuations(root)
        if not conts:
            return root_only(root, device)
        tokens, parents = [root], [-1]
        for cont in conts:  # each continuation is a branch from the root (first tokens differ)
            prev = 0
            for tok in cont:
                tokens.append(tok)
                parents.append(prev)
                prev = len(tokens) - 1
        sources = [0] + [LOOKUP_SOURCE] * (len(tokens) - 1)  # not a drafter layer's: the picture marks them
        return make_tree(torch.tensor(tokens, device=device), torch.tensor(parents, device=device),
                         sources=torch.tensor(sources, device=device))

    def draft(self, root: int) -> DraftTree:
        return self.tree(root, self.device)

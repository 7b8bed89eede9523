"""A trained drafter's tree joined with prompt lookup's: each step verifies the union.

The two guess differently: the cascade predicts from the target's features, lookup copies what
followed the same words earlier in the context. A small model that repeats itself (and any model
quoting its prompt or writing code) gives lookup long runs that no small drafter tree reaches,
while the cascade covers fresh text. The union costs the lookup nodes only when lookup has a
match, and greedy or sampling verification of any tree stays lossless.
"""

from __future__ import annotations

import torch

from fasteagle.lookup import LookupDrafter
from fasteagle.trace import LOOKUP_SOURCE  # the `sources` value of nodes only lookup proposed
from fasteagle.tree import DraftTree, merge

_OWN = ("drafter", "lookup", "feature_layers", "last_lookup")  # attributes of the wrapper itself


class WithLookup:
    """Wraps a drafter (the cascade or the EAGLE-3-style one) and adds prompt lookup's branches."""

    def __init__(self, drafter, lookup: LookupDrafter | None = None):
        self.drafter = drafter
        # the cascade covers the weak guesses a one-token match would give: lookup drafts after 2+ tokens
        self.lookup = lookup or LookupDrafter(min_ngram=2)
        self.feature_layers = tuple(drafter.feature_layers)
        self.last_lookup: DraftTree | None = None

    def __getattr__(self, name):  # tree_budget, tree_k, cfg, info, path...: the wrapped drafter's
        if name in _OWN:  # not set yet (during __init__)
            raise AttributeError(name)
        return getattr(self.drafter, name)

    def __setattr__(self, name, value):
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.drafter, name, value)

    def reset(self, capacity: int) -> None:
        self.drafter.reset(capacity)
        self.lookup.reset(capacity)

    def rewind(self, length: int) -> None:
        """Both drafters forget the positions from `length` on (`__getattr__` would reach the wrapped one only)."""
        self.drafter.rewind(length)
        self.lookup.rewind(length)

    def extend(self, tokens: torch.Tensor, features: torch.Tensor | None, next_token: int) -> None:
        self.drafter.extend(tokens, features, next_token)
        self.lookup.extend(tokens, None, next_token)

    def draft(self, root: int) -> DraftTree:
        # on the host: `merge` reads it there (kept for the bench's replays: auto tree, budget curve)
        self.last_lookup = self.lookup.tree(root, "cpu")
        return merge(self.drafter.draft(root), self.last_lookup, LOOKUP_SOURCE)

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


def _wrapped(name: str, settable: bool = True) -> property:
    """The wrapped drafter's attribute `name`, read (and, if `settable`, set) through the wrapper."""
    def get(self):
        return getattr(self.drafter, name)

    def put(self, value) -> None:
        setattr(self.drafter, name, value)

    return property(get, put if settable else None, doc=f"The wrapped drafter's `{name}`.")


class WithLookup:
    """Wraps a drafter (the cascade or the EAGLE-3-style one) and adds prompt lookup's branches.

    Only the attributes below reach the wrapped drafter (`.drafter` holds it): the tree settings
    the bench and the app set, and what a result records of a trained drafter."""

    tree_budget = _wrapped("tree_budget")
    tree_k = _wrapped("tree_k")
    tree_shape = _wrapped("tree_shape")
    info = _wrapped("info", settable=False)
    path = _wrapped("path", settable=False)
    packing = _wrapped("packing", settable=False)
    vocab_ids = _wrapped("vocab_ids", settable=False)
    inner_passes = _wrapped("inner_passes", settable=False)
    layer_top = _wrapped("layer_top", settable=False)

    def __init__(self, drafter, lookup: LookupDrafter | None = None):
        self.drafter = drafter
        # the cascade covers the weak guesses a one-token match would give: lookup drafts after 2+ tokens
        self.lookup = lookup or LookupDrafter(min_ngram=2)
        self.feature_layers = tuple(drafter.feature_layers)
        self.last_lookup: DraftTree | None = None

    def reset(self, capacity: int) -> None:
        self.drafter.reset(capacity)
        self.lookup.reset(capacity)

    def rewind(self, length: int) -> None:
        """Both drafters forget the positions from `length` on."""
        self.drafter.rewind(length)
        self.lookup.rewind(length)

    def extend(self, tokens: torch.Tensor, features: torch.Tensor | None, next_token: int) -> None:
        self.drafter.extend(tokens, features, next_token)
        self.lookup.extend(tokens, None, next_token)

    def draft(self, root: int) -> DraftTree:
        # on the host: `merge` reads it there (kept for the bench's replays: auto tree, budget curve)
        self.last_lookup = self.lookup.tree(root, "cpu")
        return merge(self.drafter.draft(root), self.last_lookup, LOOKUP_SOURCE)

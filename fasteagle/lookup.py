"""Prompt-lookup (n-gram) drafting: a training-free drafter through the same protocol.

It proposes the tokens that followed the most recent earlier occurrence of the current suffix.
With several earlier occurrences that continue differently it drafts a small tree: one branch per
distinct continuation. Repetitive text (code, quoting the prompt) gets real acceptances.

How far it drafts follows the evidence: after an n-token match at most 2**n tokens (a one-token
match is a weak guess, and every drafted node costs verify time), up to `depth`.
"""

from __future__ import annotations

import torch

from fasteagle.tree import DraftTree, make_tree, root_only


class LookupDrafter:
    feature_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram: int = 3, depth: int = 8, branches: int = 2, min_ngram: int = 1):
        self.max_ngram, self.depth, self.branches, self.min_ngram = max_ngram, depth, branches, min_ngram
        self.history: list[int] = []
        self.device = torch.device("cpu")

    def reset(self, capacity: int = 0) -> None:
        self.history = []

    def extend(self, tokens: torch.Tensor, features, next_token: int) -> None:
        self.device = tokens.device
        self.history.extend(tokens.tolist())

    def _continuations(self, seq: list[int]) -> list[list[int]]:
        """Distinct continuations after earlier matches of the longest matching suffix, newest first."""
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            suffix = seq[-n:]
            length = min(self.depth, 2 ** n)
            found: list[list[int]] = []
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start:start + n] == suffix:
                    cont = seq[start + n:start + n + length]
                    if cont and all(c[0] != cont[0] for c in found):
                        found.append(cont)
                        if len(found) == self.branches:
                            break
            if found:
                return found
        return []

    def draft(self, root: int) -> DraftTree:
        conts = self._continuations(self.history + [root])
        if not conts:
            return root_only(root, self.device)
        tokens, parents = [root], [-1]
        for cont in conts:  # each continuation is a branch from the root (first tokens differ)
            prev = 0
            for tok in cont:
                tokens.append(tok)
                parents.append(prev)
                prev = len(tokens) - 1
        dev = self.device
        return make_tree(torch.tensor(tokens, device=dev), torch.tensor(parents, device=dev))

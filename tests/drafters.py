"""Test-only drafters implementing the `fasteagle.generate.Drafter` protocol.

`RandomDrafter` drafts seeded random trees (almost nothing gets accepted: exercises rejection).
`OracleDrafter` is handed the vanilla output in advance and drafts the true continuation with
some positions corrupted or moved to side leaves (much gets accepted: deep paths, side leaves).
Shapes: "chain" (`tree.chain`), "backbone" (`tree.backbone`), "product" (`tree.product`: the
same per-depth candidates, side branches continuing) and "dynamic" (an EAGLE-2-style
expansion of the k best frontier nodes per depth, reranked by `tree.dynamic`).
Both check that the loop calls them as the protocol says (the root of each tree is the token
passed as `next_token`, and each `extend` starts with that root).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from fasteagle.tree import TREE_BUILDERS, DraftTree, chain, dynamic


def one_thread() -> Iterator[None]:
    """Body of a module-scoped autouse fixture: run torch with one intra-op thread, then restore.

    These tests run many small ops; with two threads on a 2-core machine shared with another job,
    every op waits at a barrier for a starved thread (a 2 s module took 80 s). One thread is as fast
    when the machine is idle and keeps the run time predictable when it is not."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class _ProtocolDrafter:
    feature_layers: tuple[int, ...] = ()

    def __init__(self, vocab: int, shape: str = "chain", depth: int = 4, k: int | list[int] = 1,
                 budget: int = 64, seed: int = 0):
        if shape not in ("chain", "backbone", "product", "dynamic"):
            raise ValueError(shape)
        self.vocab, self.shape, self.depth, self.k, self.budget, self.seed = vocab, shape, depth, k, budget, seed
        self.reset(0)

    def reset(self, capacity: int) -> None:
        self.gen = torch.Generator().manual_seed(self.seed)
        self.history: list[int] = []
        self.next_token: int | None = None
        self.prompt_len: int | None = None
        self.trees: list[DraftTree] = []

    def extend(self, tokens: torch.Tensor, features, next_token: int) -> None:
        assert features is None, "no feature layers were asked for"
        toks = tokens.tolist()
        if self.prompt_len is None:
            self.prompt_len = len(toks)
        else:  # after a verification: the root entered the cache first, then the accepted path
            assert toks[0] == self.next_token, (toks, self.next_token)
        self.history.extend(toks)
        self.next_token = int(next_token)

    @property
    def kmax(self) -> int:
        return self.k if isinstance(self.k, int) else max(self.k)

    def _distinct(self, n: int, exclude: int | None = None) -> torch.Tensor:
        """n distinct random token ids (never `exclude`)."""
        perm = torch.randperm(self.vocab, generator=self.gen)
        if exclude is not None:
            perm = perm[perm != exclude]
        return perm[:n]

    def _sorted_probs(self, n_rows: int) -> torch.Tensor:
        p = torch.softmax(torch.randn(n_rows, self.vocab, generator=self.gen) * 3, -1)
        return p.sort(-1, descending=True).values[:, : self.kmax]

    def _expand(self, root: int, truth: list[int] | None = None, corrupt: float = 0.0) -> DraftTree:
        """EAGLE-2-style candidates: k children under each of the k best frontier nodes per depth,
        with random log-probabilities; with `truth`, the node on the true path gets the true next
        token as a child (at a random rank) unless corrupted."""
        k = self.kmax
        tokens, parents, scores, depths = [], [], [], []
        frontier, on_path = [(-1, 0.0)], -1  # (candidate index, score); the root is -1
        for d in range(1, self.depth + 1):
            new = []
            for node, score in frontier:
                t = truth[d - 1] if truth is not None and node == on_path else None
                toks = self._distinct(k, exclude=t)
                logp = self._sorted_probs(1)[0].log().tolist()
                if t is not None and float(torch.rand((), generator=self.gen)) >= corrupt:
                    toks[int(torch.randint(0, min(k, 2), (), generator=self.gen))] = t
                for tok, lp in zip(toks.tolist(), logp):
                    if t is not None and tok == t:
                        on_path = len(tokens)
                    tokens.append(tok)
                    parents.append(node)
                    scores.append(score + lp - 1e-6)  # strictly below the parent
                    depths.append(d)
                    new.append((len(tokens) - 1, scores[-1]))
            frontier = sorted(new, key=lambda x: -x[1])[:k]
        sc = torch.tensor(scores)
        par = torch.tensor(parents)
        probs = torch.exp(sc - torch.where(par >= 0, sc[par.clamp_min(0)], torch.zeros_like(sc)))
        return dynamic(root, torch.tensor(tokens), par, sc, probs, torch.tensor(depths), self.budget)

    def draft(self, root: int) -> DraftTree:
        assert root == self.next_token, (root, self.next_token)
        tree = self._draft(root)
        self.trees.append(tree)
        return tree


class RandomDrafter(_ProtocolDrafter):
    """Random ids, random probabilities: chains, backbone or product trees."""

    def _draft(self, root: int) -> DraftTree:
        if self.shape == "dynamic":
            return self._expand(root)
        if self.shape == "chain":
            toks = torch.randint(0, self.vocab, (self.depth,), generator=self.gen)
            return chain(root, toks, torch.rand(self.depth, generator=self.gen))
        ids = torch.stack([self._distinct(self.kmax) for _ in range(self.depth)])
        return TREE_BUILDERS[self.shape](root, ids, self._sorted_probs(self.depth), self.k, self.budget)


class OracleDrafter(_ProtocolDrafter):
    """Drafts `reference` (the vanilla output) from the current position.

    Each depth's true token is corrupted with probability `corrupt`; in a backbone or product tree,
    with probability `side` it is moved to a random side column instead (so a side leaf can be
    accepted, and in a product tree the true path can go on below it).
    """

    def __init__(self, reference: list[int], vocab: int, shape: str = "chain", depth: int = 4,
                 k: int | list[int] = 1, budget: int = 64, seed: int = 0, corrupt: float = 0.15,
                 side: float = 0.0):
        self.reference, self.corrupt, self.side = list(reference), corrupt, side
        super().__init__(vocab, shape, depth, k, budget, seed)

    def _truth(self, root: int) -> list[int]:
        g = len(self.history) - self.prompt_len  # index of the root in the generated output
        cont = self.reference[g + 1: g + 1 + self.depth]
        pad = torch.randint(0, self.vocab, (self.depth - len(cont),), generator=self.gen).tolist()
        return cont + pad

    def _wrong(self, tok: int) -> int:
        return (tok + int(torch.randint(1, self.vocab, (), generator=self.gen))) % self.vocab

    def _draft(self, root: int) -> DraftTree:
        truth = self._truth(root)
        if self.shape == "dynamic":
            return self._expand(root, truth, self.corrupt)
        if self.shape == "chain":
            toks = [self._wrong(t) if float(torch.rand((), generator=self.gen)) < self.corrupt else t for t in truth]
            return chain(root, torch.tensor(toks), torch.rand(self.depth, generator=self.gen))
        ks = [self.k] * self.depth if isinstance(self.k, int) else list(self.k)
        rows = []
        for d, t in enumerate(truth):
            row = self._distinct(self.kmax, exclude=t)
            u = float(torch.rand((), generator=self.gen))
            if u < self.side and ks[d] > 1:
                row[int(torch.randint(1, ks[d], (), generator=self.gen))] = t
            elif u >= self.side + self.corrupt:
                row[0] = t
            rows.append(row)
        return TREE_BUILDERS[self.shape](root, torch.stack(rows), self._calibrated_probs(ks), self.k, self.budget)

    def _calibrated_probs(self, ks: list[int]) -> torch.Tensor:
        """Per depth: the top-1 is right with probability 1 - side - corrupt, each side column with
        side / (k - 1): probabilities that tell the tree budget what this oracle's guesses are worth."""
        probs = torch.zeros(self.depth, self.kmax)
        for d, k in enumerate(ks[: self.depth]):
            k = max(1, min(k, self.kmax))
            probs[d, 0] = 1 - self.corrupt - (self.side if k > 1 else 0.0)
            probs[d, 1:k] = self.side / max(k - 1, 1)
            probs[d, k:] = 1e-6 * torch.arange(self.kmax - k, 0, -1)  # outside this depth's k: never kept
        return probs


def steer(drafter, reference: list[int], corrupt: float = 0.25, seed: int = 0):
    """Nudge a real (untrained) drafter towards `reference`, the vanilla output, so that its drafts
    get accepted: an untrained cascade or EAGLE-3-style drafter accepts nothing on the tiny target,
    and a lossless test on it never commits a drafted token (nor extends the drafter by more than
    the root). Its layers, caches, top-k and tree building all still run; only its distributions
    change: at each depth the true next token becomes the top-1 unless (with probability
    `corrupt`) that depth is left alone. Patches the instance; returns it."""
    state = {"seen": 0, "prompt": None, "ids": None, "gen": torch.Generator()}
    orig_reset, orig_extend = drafter.reset, drafter.extend

    def reset(capacity: int = 4096) -> None:
        state.update(seen=0, prompt=None, ids=None)
        state["gen"].manual_seed(seed)
        orig_reset(capacity)

    def extend(tokens: torch.Tensor, features, next_token: int) -> None:
        if state["prompt"] is None:
            state["prompt"] = tokens.numel()
        state["seen"] += tokens.numel()
        orig_extend(tokens, features, next_token)

    def truth(depth: int) -> int | None:
        """The draft-vocab row of the true token `depth` below the root, unless corrupted."""
        g = state["seen"] - state["prompt"]  # index of the root in the generated output
        if float(torch.rand((), generator=state["gen"])) < corrupt or g + depth >= len(reference):
            return None
        row = int(drafter.to_draft_ids(torch.tensor([reference[g + depth]]))[0])
        return row if row >= 0 else None

    drafter.reset, drafter.extend = reset, extend
    if not hasattr(drafter, "depth_probs"):  # EAGLE-3 style: one head call per depth
        orig_step, orig_head = drafter.step, drafter.head

        def step(g, next_ids, *a, **k):
            state["ids"] = next_ids[0]  # while drafting: the frontier nodes' own tokens
            return orig_step(g, next_ids, *a, **k)

        def head(h, depth, rows=None):
            z = orig_head(h, depth, rows)
            row = truth(depth) if rows is None else None
            if row is None:
                return z
            z = z.clone()
            if depth == 1:
                z[..., row] = z.max() + 8
            else:  # under the frontier nodes holding the true previous token
                prev = reference[state["seen"] - state["prompt"] + depth - 1]
                on = state["ids"] == prev
                z[on, row] = z[on].max(-1).values + 8
            return z

        drafter.step, drafter.head = step, head
    else:  # the cascade, DFlash, parallel EAGLE: every depth's distribution in one call
        orig_probs = drafter.depth_probs

        def depth_probs(*args):  # the cascade's (last=None), DFlash's and parallel EAGLE's (root, depths)
            p = orig_probs(*args).clone()
            for a in range(1, p.shape[0] + 1):
                row = truth(a)
                if row is not None:
                    p[a - 1] *= 0.5
                    p[a - 1, row] += 0.5
            return p

        drafter.depth_probs = depth_probs
    return drafter


def check_block_loss(d, feats: torch.Tensor, ids: torch.Tensor, param: torch.nn.Parameter) -> None:
    """A drafter that runs its blocks only where a token counts (`BLOCKS`: DFlash, parallel EAGLE), on rows `ids`
    (2, 24) with target features `feats`: that loss equals the loss with a block at every position, reports every
    depth, and 30 steps of Adam on it halve it, reaching `param` (the mask row)."""
    d.train()
    mask = torch.zeros(2, 24)
    mask[0, 10:] = 1
    mask[1, 16:22] = 1  # a reply that ends before the row does
    t_ids = torch.randint(4, int(ids.max()) + 1, (2, 24, 3))
    t_p = torch.softmax(torch.randn(2, 24, 3), -1)
    loss, stats = d.loss(feats, ids, mask, t_ids, t_p)
    d.BLOCKS = False  # every position's block: the same loss
    try:
        everywhere, _ = d.loss(feats, ids, mask, t_ids, t_p)
    finally:
        del d.BLOCKS
    torch.testing.assert_close(loss, everywhere)
    assert {f"acc{i}" for i in range(1, d.num_depths + 1)} <= set(stats)
    opt = torch.optim.Adam(d.parameters(), lr=3e-3)
    first = float(loss.detach())
    for _ in range(30):
        loss, _ = d.loss(feats, ids, mask, t_ids, t_p)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first
    assert param.grad is not None and bool(param.grad.abs().sum() > 0)


def features(target, ids: torch.Tensor, layers) -> torch.Tensor:
    """The target's hidden states at `layers` for rows `ids`, concatenated: what a drafter trains on."""
    with torch.no_grad():
        out = target.model(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layers], -1)


def check_blocks_read_only_before_their_anchor(target, d, vocab: int) -> None:
    """Every depth's teacher-forced output at position t (a block anchored there) reads features 0..t and
    tokens up to t+1 only: changing those after position 9 changes nothing before it, and something after."""
    ids = torch.randint(4, vocab, (1, 16))
    f = features(target, ids, d.cfg.feature_layers)
    with torch.no_grad():
        a = d.depth_outputs(f[:, :-1], ids[:, 1:])
        f2, ids2 = f.clone(), ids.clone()
        f2[:, 9:] += torch.randn_like(f2[:, 9:])  # features 9.. and tokens 10.. change
        ids2[:, 10:] = torch.randint(4, vocab, (1, 6))
        b = d.depth_outputs(f2[:, :-1], ids2[:, 1:])
    assert len(a) == d.num_depths and all(o.shape == (1, 15, d.cfg.width) for o in a)
    for x, y in zip(a, b):
        torch.testing.assert_close(x[:, :9], y[:, :9])
        assert not torch.allclose(x[:, 9:], y[:, 9:])


def check_lossless(target, d, vocab: int) -> list:
    """Greedy decoding with `d` gives vanilla's output both as it drafts (an untrained drafter's drafts are
    rejected) and steered to the reply (its layers, cache and tree still its own), where deep paths are accepted;
    the steered run's traces are returned."""
    from fasteagle.generate import run

    ids = torch.randint(4, vocab, (10,))
    want, _ = run(target, ids, max_new_tokens=30)
    assert run(target, ids, drafter=d, max_new_tokens=30)[0] == want
    got, traces = run(target, ids, drafter=steer(d, want), max_new_tokens=30)
    assert got == want and traces[-1].tau > 2.0
    return traces

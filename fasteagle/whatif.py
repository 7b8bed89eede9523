"""What a run would have done with another tree, and how fast: the project's one speed model.

    tokens/s(B) = 1000 * tokens per step(B) / (draft ms(B) + verify ms(size(B)) + other ms)

`bench --tree auto` (`fasteagle.bench.tune.auto_tree`) picks the budget that maximises it, `bench
--predict` prints it for a budget, and the app's what-if panel draws it against the budget; all three
call `tokens_per_s`. The costs are measured (`Costs`): a target forward over a tree of T tokens, a
draft step at budget B, and the rest of a step; the tokens per step come from a run (`replay`, `grid`).

Tokens per step at any budget, from one run. A cascade drafts every depth in one forward: depth d's
candidates (its top-k through the frozen head, `StepTrace.layer_top`) do not depend on which tokens
were taken above it. So the tree a budget B, and a depth cap D, would have built at a step is the
tree builder's choice over the same lists (`fasteagle.treeorder`: the order in which
`fasteagle.tree.product` and `.backbone` take nodes), without running the drafter again. What the
target would have accepted is known too: the tokens the run emitted from that step on. Greedy, they
are the target's own continuation, whatever the tree. Sampling, the project's verifier judges a
tree's children with a one-hot q in turn (`fasteagle.verify`): child x is accepted with the target's
probability p(x), the next with its share of the residual, so the token that comes out is a draw from
p, and the child accepted is the one equal to it. A tree's accepted path is therefore the longest
prefix of a draw of the target's continuation that the tree holds, and the run's reply is such a
draw: replayed against it, every budget's expected tokens per step is estimated without bias.

This is the run's acceptance by depth and by sibling rank (`rank_table`), counted on every candidate
the drafter listed, not only on the few a small tree verified. Two limits, said where they apply:
steps are those the run visited (a bigger tree accepts more and would start its steps elsewhere),
and only the depths the run drafted are known (a B-node tree drafts at most B-1 of them).

Torch-free: the app's pages and `bench --predict` read it without a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fasteagle import trace
from fasteagle.errors import FastEagleError
from fasteagle.treeorder import ORDERS, SHAPES


class WhatIfError(FastEagleError):
    """A run the model cannot replay (no candidate lists, a tree joined with lookup, no whole step)."""


# -- a run, replayed --------------------------------------------------------------------------------
@dataclass
class Replay:
    """A run's steps as the model reads them: per whole step, each depth's candidate probabilities and
    the rank the target's token had among them (depth by depth, while it was a candidate)."""

    probs: list[list[list[float]]]  # per step, per depth: candidate probabilities, best first
    ranks: list[list[int]]  # per step: the target's token's rank at depths 1, 2, ... (cut where it was none)
    shape: str = "product"
    k_at: list[int] = field(default_factory=list)  # candidates offered per depth
    run_budget: int = 0  # the run's own node budget
    run_tau: float = 0.0  # tokens per step the run measured (all its decode steps)
    room: list[int] = field(default_factory=list)  # per step: most tokens it can emit (the reply ends there), 0: no end

    @property
    def depths(self) -> int:
        return min((len(p) for p in self.probs), default=0)


def replay(steps, shape: str = "product", k=None, budget: int = 0) -> Replay:
    """Read a run's steps (`StepTrace`s or their dicts) for the model. `k`: the top-k per depth the run
    drafted with (an int or one per depth; None: every candidate listed); `budget`: its node budget.

    A step counts when the run emitted enough after it to judge every depth it listed (the last
    steps of a run cut by its length limit do not; a run that ended at its stop token does: the
    target stops there whatever the tree)."""
    if shape not in ORDERS:
        raise WhatIfError(f"the what-if model replays the {' and '.join(SHAPES)} trees, not {shape!r}")
    decode = trace.decode_steps(steps)
    if not decode:
        raise WhatIfError("the run has no decode step to replay")
    if any(trace.LOOKUP_SOURCE in ((trace._get(s, "tree") or {}).get("sources") or []) for s in decode):
        raise WhatIfError("this run's trees joined prompt lookup's branches, which the what-if model does not "
                          "replay; run FastEagle alone")
    if not all(trace._get(s, "layer_top") for s in decode):
        raise WhatIfError("this run's steps list no drafter candidates per depth (only a cascade's do, in a "
                          "version-2 trace): the what-if model needs them")
    emitted = [[int(t) for t in (trace._get(s, "tokens") or [])] for s in decode]
    ended = trace._get(decode[-1], "finished") == "eos"
    probs, ranks, room = [], [], []
    after = [t for e in emitted for t in e]  # the reply after each step's root, consumed step by step
    for s, e in zip(decode, emitted):
        top = trace._get(s, "layer_top")
        truth = after[:len(top)]
        after = after[len(e):]
        if len(truth) < len(top) and not ended:
            continue
        row_probs = [[float(p) for _, p in depth] for depth in top]
        r_list = []
        for d, depth in enumerate(top[:len(truth)]):
            ids = [int(t) for t, _ in depth]
            if truth[d] not in ids:
                break
            r_list.append(ids.index(truth[d]))
        probs.append(row_probs)
        ranks.append(r_list)
        room.append(len(truth) if ended and len(truth) <= len(top) else 0)  # no bonus after the stop token
    if not probs:
        raise WhatIfError("no step of this run left enough of the reply after it to replay (a longer run will)")
    n = min(len(p) for p in probs)
    if k is None:
        k_at = [len(p) for p in probs[0][:n]]
    else:
        k_at = [int(k)] * n if isinstance(k, int) else ([int(x) for x in k] + [1] * n)[:n]
    lengths = trace.step_lengths(decode)
    return Replay(probs, ranks, shape, k_at, int(budget), trace.tau(sum(lengths), len(lengths)), room)


def accepted(order: list[tuple[int, int, int]], ranks: list[int]) -> list[int]:
    """For each depth the target's token reached, the position + 1 in `order` of the node holding its
    path (the step's tree accepts depth d from a budget of that position + 1 nodes on); cut where a node
    of the path is not in `order`."""
    where = {(parent, r): i for i, (_, r, parent) in enumerate(order, start=1)}
    out, node = [], 0
    for r in ranks:
        node = where.get((node, r))
        if node is None:
            break
        out.append(node)
    return out


@dataclass
class Grid:
    """Tokens per step (tau, the bonus included) and mean tree size, by depth cap and budget: `tau[D][B]`."""

    budgets: list[int]
    tau: dict[int, dict[int, float]]  # depth cap -> budget -> tokens per step
    size: dict[int, dict[int, float]]  # depth cap -> budget -> mean tree nodes, root included
    chain: dict[int, float]  # chain of D drafted tokens (D + 1 nodes) -> tokens per step
    steps: int
    run_budget: int
    run_tau: float

    def to_dict(self) -> dict:
        return {"budgets": self.budgets, "tau": _keys(self.tau), "size": _keys(self.size),
                "chain": {str(d): v for d, v in self.chain.items()}, "steps": self.steps,
                "run_budget": self.run_budget, "run_tau": self.run_tau}

    @classmethod
    def from_dict(cls, d: dict) -> Grid:
        def back(m):
            return {int(a): {int(b): v for b, v in row.items()} for a, row in m.items()}

        return cls([int(b) for b in d["budgets"]], back(d["tau"]), back(d["size"]),
                   {int(k): v for k, v in d["chain"].items()}, int(d["steps"]), int(d.get("run_budget", 0)),
                   float(d.get("run_tau", 0.0)))

    @property
    def depths(self) -> list[int]:
        return sorted(self.tau)


def _keys(m: dict) -> dict:
    return {str(a): {str(b): v for b, v in row.items()} for a, row in m.items()}


def grid(rep: Replay, budgets) -> Grid:
    """Replay every step at every budget and every depth cap 1..the depths the run listed."""
    budgets = sorted({int(b) for b in budgets if int(b) >= 1})
    order_of = ORDERS[rep.shape]
    tau, size, chain = {}, {}, {}
    for cap in range(1, rep.depths + 1):
        hits = {b: 0 for b in budgets}
        nodes = {b: 0 for b in budgets}
        for probs, ranks, room in zip(rep.probs, rep.ranks, rep.room or [0] * len(rep.probs)):
            order = order_of(probs[:cap], rep.k_at[:cap], budgets[-1] - 1)
            reach = accepted(order, ranks[:cap])
            for b in budgets:
                emitted = 1 + sum(1 for pos in reach if pos <= b - 1)  # the reached prefix (nested), the bonus
                hits[b] += min(emitted, room) if room else emitted
                nodes[b] += min(b, len(order) + 1)
        n = len(rep.probs)
        tau[cap] = {b: round(hits[b] / n, 4) for b in budgets}
        size[cap] = {b: round(nodes[b] / n, 2) for b in budgets}
        chain[cap] = round(sum(min(1 + _leading_zeros(r[:cap]), room or cap + 1)
                               for r, room in zip(rep.ranks, rep.room or [0] * n)) / n, 4)
    return Grid(budgets, tau, size, chain, len(rep.probs), rep.run_budget, round(rep.run_tau, 4))


def _leading_zeros(ranks: list[int]) -> int:
    """Depths a chain of top-1 drafts accepts: the target's token was the best candidate at each."""
    n = 0
    for r in ranks:
        if r:
            break
        n += 1
    return n


def rank_table(rep: Replay, ranks: int = 4) -> list[list[float]]:
    """Acceptance by depth and sibling rank: row d, column r is how often the target's token at depth
    d + 1 was the drafter's candidate of rank r, among the steps whose target tokens at every depth
    above were candidates; the last column is "lower than that, or none"."""
    out = []
    for d in range(rep.depths):
        live = [r for r in rep.ranks if len(r) >= d]  # the path above was within the candidates
        if not live:
            break
        counts = [0] * (ranks + 1)
        for r in live:
            counts[min(r[d], ranks) if len(r) > d else ranks] += 1
        out.append([round(c / len(live), 4) for c in counts])
    return out


# -- the costs and the formula ----------------------------------------------------------------------
def tokens_per_s(tokens_per_step: float, draft_ms: float, verify_ms: float, other_ms: float = 0.0) -> float:
    """The model: tokens a step emits over what a step costs (draft, verify, the rest), per second."""
    return 1e3 * tokens_per_step / max(draft_ms + verify_ms + other_ms, 1e-9)


def nondecreasing(ms: dict) -> dict:
    """Timed costs (size -> ms) made non-decreasing in size by pooling adjacent violators (isotonic
    regression). A bigger tree never costs less; where a CPU's flat region (the smallest trees cost
    one decode step) meets run-to-run noise, raw medians said it did, and a budget choice swung."""
    sizes = sorted(ms, key=int)
    blocks: list[list] = []  # [mean, count] of pooled runs of sizes
    for k in sizes:
        blocks.append([ms[k], 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    fitted = [m for m, n in blocks for _ in range(n)]
    return {k: round(v, 2) for k, v in zip(sizes, fitted)}


def interpolate(ms: dict, size: float) -> float:
    """The cost at `size` from timed sizes (size -> ms): linear between neighbours, flat below the
    smallest, and past the largest along the line through the last two (a forward's cost grows with
    its tokens there; `Costs.largest` says how far a device's costs were measured)."""
    pts = sorted((float(k), v) for k, v in ms.items())
    if size > pts[-1][0] and len(pts) > 1:
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        return y1 + max(y1 - y0, 0.0) * (size - x1) / (x1 - x0)
    lo = max((p for p in pts if p[0] <= size), default=pts[0])
    hi = min((p for p in pts if p[0] >= size), default=pts[-1])
    if hi[0] == lo[0]:
        return lo[1]
    return lo[1] + (hi[1] - lo[1]) * (size - lo[0]) / (hi[0] - lo[0])


@dataclass
class Costs:
    """A device's measured costs for the model. `verify_ms`: tree tokens -> ms of one target forward
    over them; `draft_ms`: node budget -> ms of one draft step (a cascade's grows with the layers a
    budget runs, min(B - 1, its depths), then barely); `step_ms`: one plain decode step; `other_ms`:
    the rest of a speculative step (trace, bookkeeping); `label` and `source` say where they came from."""

    label: str
    verify_ms: dict
    draft_ms: dict
    step_ms: float
    other_ms: float = 0.0
    source: str = ""

    @property
    def largest(self) -> int:
        """The largest tree whose verify cost was measured."""
        return int(max(self.verify_ms))

    def verify(self, size: float) -> float:
        return interpolate(self.verify_ms, size)

    def draft(self, budget: int, depth: int | None = None) -> float:
        """Draft ms at `budget`; a depth cap D runs D layers, as the budget D + 1 does."""
        return interpolate(self.draft_ms, budget if depth is None else min(budget, depth + 1))

    def anchored(self, budget: int, size: float, draft_ms: float, verify_ms: float, other_ms: float) -> Costs:
        """These costs moved to pass through a run's own measured step (its draft as at `budget`, its trees
        of `size` nodes): the curves give how a cost changes with the tree, the run the level on this
        machine now."""
        dv, dd = verify_ms - self.verify(size), draft_ms - self.draft(budget)
        return Costs(self.label, {k: round(v + dv, 3) for k, v in self.verify_ms.items()},
                     {k: round(v + dd, 3) for k, v in self.draft_ms.items()}, self.step_ms, other_ms, self.source)

    def to_dict(self) -> dict:
        return {"label": self.label, "verify_ms": {str(k): v for k, v in self.verify_ms.items()},
                "draft_ms": {str(k): v for k, v in self.draft_ms.items()}, "step_ms": self.step_ms,
                "other_ms": self.other_ms, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> Costs:
        return cls(d["label"], {int(k): float(v) for k, v in d["verify_ms"].items()},
                   {int(k): float(v) for k, v in d["draft_ms"].items()}, float(d["step_ms"]),
                   float(d.get("other_ms", 0.0)), d.get("source", ""))


def record_costs(entry: dict) -> Costs:
    """A `bench --what-if` record's cost curves (one method's `what_if` entry) moved through its run's own
    step: the curves give how a cost changes with the tree, the run the level."""
    run = entry["run"]
    return Costs.from_dict(entry["costs"]).anchored(run.get("draft_as_budget", run["budget"]), run["tree_size"],
                                                    run["draft_ms"], run["verify_ms"], run["other_ms"])


def costs_from_auto(doc: dict, method: str = "fasteagle") -> Costs | None:
    """A device's costs from a `bench --tree auto` result (verify ms by mean tree size, draft ms by
    budget, the decode step; no "rest" of a step is measured there: 0), or None if it holds none."""
    auto = (doc.get("settings") or {}).get("tree_auto", {}).get(method)
    if not auto:
        return None
    verify = {float(auto["tree_size"][b]): ms for b, ms in auto["verify_ms"].items()}
    return Costs(f"{doc.get('device', 'a device')}, measured {doc.get('date', '')}", verify,
                 {int(b): ms for b, ms in auto["draft_ms"].items()}, float(auto["decode_step_ms"]))


def predict(g: Grid, costs: Costs, budget: int, depth: int | None = None, chain: bool = False) -> dict:
    """The model at one budget (and depth cap; None: every depth the run listed): tokens per step, tree
    size, the step's three costs, tokens/s and the speed-up over plain decoding's step. `chain`: a chain
    of `depth` tokens instead (its budget is depth + 1)."""
    depth = max(g.depths) if depth is None else min(max(int(depth), 1), max(g.depths))
    if chain:
        budget, tau, size = depth + 1, g.chain[depth], depth + 1.0
    else:
        budget = int(budget)
        row = g.tau[depth]
        b = max((x for x in g.budgets if x <= budget), default=g.budgets[0])
        tau, size = row[b], g.size[depth][b]
    draft = costs.draft(budget, depth if depth < max(g.depths) else None)
    verify = costs.verify(size)
    rate = tokens_per_s(tau, draft, verify, costs.other_ms)
    return {"budget": budget, "depth": depth, "chain": chain, "tau": round(tau, 3), "tree_size": round(size, 2),
            "draft_ms": round(draft, 2), "verify_ms": round(verify, 2), "other_ms": round(costs.other_ms, 2),
            "tokens_per_s": round(rate, 2), "speedup_vs_decode_step": round(rate * costs.step_ms / 1e3, 3)}

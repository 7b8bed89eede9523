"""What a decode records, and every number measured on it, in one torch-free module.

The decoding loop yields one `StepTrace` per step (step 0 is the prefill: its token comes without a
verify step, so no metric counts it as a decode step). The CLI, the benchmark, the trainer's
evaluation, the app and its trace files all read these fields and take their numbers from here,
so they cannot disagree. A metric takes steps as `StepTrace`s or as their `to_dict()`s (what the
app's trace files hold), whichever the caller has.

No torch here: `viz` draws trace files with it and must import without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# A tree node's verdict, one per node in `StepTrace.status`: the verifier never looked at it (its
# parent was not accepted, or an earlier sibling was), accepted it, or rejected it.
NEVER_REACHED, ACCEPTED, REJECTED = 0, 1, 2
LOOKUP_SOURCE = -1  # the `sources` value of tree nodes only prompt lookup proposed (fasteagle.hybrid)


@dataclass
class StepTrace:
    """Everything one step did, as plain data (JSON-ready through `to_dict`)."""

    step: int
    tokens: list[int]  # tokens emitted this step, in order
    token_depths: list[int]  # 0 = the target's own (bonus) token, d = accepted draft token at depth d
    text: str  # decoded text delta of this step
    draft_ms: float
    verify_ms: float
    tree: dict | None = None  # DraftTree.to_dict() of the verified tree (None for prefill)
    status: list[int] = field(default_factory=list)  # per tree node: NEVER_REACHED, ACCEPTED or REJECTED
    target_probs: list[float] = field(default_factory=list)  # per tree node
    path: list[int] = field(default_factory=list)  # accepted node indices, root first
    generated: int = 0  # tokens generated so far, this step included
    forwards: int = 0  # target forwards so far (prefill excluded)
    finished: str | None = None  # "eos" or "length" on the last step
    bonus: int = -1  # the target's own token this step: the next tree's root
    # Added in version 2 of the run file (a version-1 file lacks them; the app then says so):
    draft_passes: list[float] = field(default_factory=list)  # ms of each drafter forward that made this tree
    layer_top: list[list[list]] = field(default_factory=list)  # per depth: [[token, prob], ...] best first
    bonus_kind: str = "bonus"  # "bonus": the target's own draw; "resampled": drawn from the residual
    draws: list[float] = field(default_factory=list)  # per tree node: the uniform draw that judged it (-1: none)
    dists: list[list] = field(default_factory=list)  # per reached node: [node, ids, probs, rest mass]

    @property
    def tau(self) -> float:
        """Mean tokens per target forward so far (the bonus token included; vanilla = 1)."""
        return tau(self.generated - 1, self.forwards)

    def to_dict(self) -> dict:
        return asdict(self) | {"tau": self.tau}

    @classmethod
    def from_dict(cls, d: dict) -> StepTrace:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})

    def draft_tree(self):
        """The verified tree as a `fasteagle.tree.DraftTree` (None for the prefill); needs torch."""
        from fasteagle.tree import DraftTree

        return DraftTree.from_dict(self.tree) if self.tree else None


Step = StepTrace | Mapping[str, Any]


def _get(step: Step, name: str, default: Any = None) -> Any:
    """A field of a `StepTrace` or of its `to_dict()` (a trace file may leave optional ones out)."""
    return step.get(name, default) if isinstance(step, Mapping) else getattr(step, name, default)


def decode_steps(steps: Iterable[Step]) -> list[Step]:
    """The steps that verified a tree: all but the prefill."""
    return [s for s in steps if int(_get(s, "step", 0)) > 0]


def tau(tokens: int, forwards: int) -> float:
    """Tokens per target forward: `tokens` emitted by `forwards` verify steps, each step's bonus
    token included (plain decoding: 1.0). The prefill's token comes without a verify step, so it is
    in neither count; no forward at all gives 0.0."""
    return tokens / forwards if forwards else 0.0


def step_lengths(steps: Iterable[Step]) -> list[int]:
    """Tokens each decode step emitted: its accepted drafts and the bonus token, cut at a stop token
    or the length limit (their mean is the decode's tau)."""
    return [len(_get(s, "tokens") or []) for s in decode_steps(steps)]


def accepted_lengths(steps: Iterable[Step]) -> list[int]:
    """Draft tokens each decode step accepted and emitted (the bonus not counted; the path ends at a
    stop token, `generate` cuts it there)."""
    return [max(len(_get(s, "path") or [0]) - 1, 0) for s in decode_steps(steps)]


def reply_tokens(steps: Iterable[Step]) -> list[int]:
    """The reply a decode emitted, token by token: every step's tokens in order (the prefill's first)."""
    return [int(t) for s in steps for t in (_get(s, "tokens") or [])]


def token_kinds(step: Step) -> list[str]:
    """How each token a step emitted was made: "draft" (an accepted draft token, its depth in
    `token_depths`), "bonus" (the target's own token after the accepted path) or "resampled" (drawn
    from the residual distribution after the verifier rejected drafts: sampling only)."""
    depths = _get(step, "token_depths") or []
    last = _get(step, "bonus_kind", "bonus") or "bonus"
    return ["draft" if d > 0 else last if i == len(depths) - 1 else "bonus" for i, d in enumerate(depths)]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Where two replies part: the first index at which they differ, or where the shorter one ends
    (None when they are equal)."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def histogram(lengths: Sequence[int], first: int) -> list[int]:
    """How many of `lengths` are first, first + 1, ... up to the largest (one zero bin if none)."""
    return [lengths.count(n) for n in range(first, max(lengths, default=first) + 1)]


def depth_counts(steps: Iterable[Step]) -> tuple[list[int], list[int]]:
    """Per draft depth d = 1, 2, ...: in how many decode steps the verifier judged a depth-d node
    (accepted or rejected one: the accepted depth-(d-1) node had children) and in how many it
    accepted one. A depth counts only where the verifier judged it: a path that ends at a leaf, or
    at a rejection, reached no deeper, however deep the tree went."""
    reached: list[int] = []
    accepted: list[int] = []
    for s in steps:
        tree, status = _get(s, "tree"), _get(s, "status")
        if not tree or not status:
            continue
        judged: dict[int, bool] = {}
        for d, verdict in zip(tree["depths"], status):
            if d > 0 and verdict in (ACCEPTED, REJECTED):
                judged[d] = judged.get(d, False) or verdict == ACCEPTED
        for d, hit in judged.items():
            while len(reached) < d:
                reached.append(0)
                accepted.append(0)
            reached[d - 1] += 1
            accepted[d - 1] += hit
    return reached, accepted


def backbone(tree: Mapping) -> list[bool]:
    """Per node of a tree dict: on its backbone, the chain a one-token-per-depth drafter drafts (the root,
    and each backbone node's most probable child; the first of equals)."""
    parents, probs = tree["parents"], tree["draft_probs"]
    best: dict[int, int] = {}
    for i, p in enumerate(parents):
        if p >= 0 and (p not in best or probs[i] > probs[best[p]]):
            best[p] = i
    on = [False] * len(parents)
    for i, p in enumerate(parents):  # parents come before their children
        on[i] = p < 0 or (on[p] and best[p] == i)
    return on


def below_counts(steps: Iterable[Step]) -> tuple[list[int], list[int]]:
    """[on the backbone, off it]: accepted draft nodes whose children the verifier judged, and of those,
    how many had a child accepted. Off the backbone, a cascade's deeper layers drafted for a parent
    token they did not see (a token-conditioned cascade reads only the backbone's tokens)."""
    judged, accepted = [0, 0], [0, 0]
    for s in steps:
        tree, status, path = _get(s, "tree"), _get(s, "status"), _get(s, "path")
        if not tree or not status or not path:
            continue
        on = backbone(tree)
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(tree["parents"]):
            kids.setdefault(p, []).append(i)
        for n in path[1:]:
            seen = [status[c] for c in kids.get(n, []) if status[c] in (ACCEPTED, REJECTED)]
            if seen:
                judged[not on[n]] += 1
                accepted[not on[n]] += ACCEPTED in seen
    return judged, accepted


def depth_rates(reached: Sequence[int], accepted: Sequence[int]) -> list[float | None]:
    """Per depth, the share of the steps that judged a depth-d node that accepted one (the
    conditional acceptance rate of depth d); None for a depth no step reached."""
    return [a / r if r else None for a, r in zip(accepted, reached)]


def depth_acceptance(steps: Iterable[Step]) -> list[dict]:
    """`depth_counts` and `depth_rates` of one decode, a row per depth: depth, reached, accepted, rate."""
    reached, accepted = depth_counts(steps)
    return [{"depth": d, "reached": r, "accepted": a, "rate": rate}
            for d, (r, a, rate) in enumerate(zip(reached, accepted, depth_rates(reached, accepted)), start=1)]


SUMMARY_NUMBERS = ("tokens", "forwards", "tau", "wall_s", "tokens_per_s", "prefill_ms", "draft_ms", "verify_ms",
                   "other_ms")  # the numbers of `run_summary` a trace file's summary must hold


FORMAT, VERSION = "fasteagle-trace", 2  # a run file's format: what the app downloads and replays (viz.trace_io)
READS = (1, 2)  # versions the app replays: version 1 lacks the draft passes and the sampling fields


def make_run_file(meta: Mapping[str, Any], sides: Mapping[str, Mapping[str, Any]],
                  token_labels: Mapping[int, str]) -> dict:
    """A run file: `sides` {"speculative": {...}, "vanilla": {...}}, each with "traces" (StepTrace dicts),
    "spans" (viz.tokens.spans_to_json; empty: the app rebuilds them), "summary" (`run_summary`) and
    "elapsed" (cumulative seconds per step); `token_labels` token id -> its text."""
    return {"format": FORMAT, "version": VERSION, "meta": dict(meta),
            "sides": {k: dict(v) for k, v in sides.items()},
            "token_labels": {str(k): v for k, v in token_labels.items()}}


def run_summary(steps: Sequence[Step], decode_s: float | None = None) -> dict:
    """Totals of one decode. `decode_s`: measured wall time of the whole decode (prefill included);
    without it the sum of the per-step timings is used."""
    if not steps:
        return {"tokens": 0, "forwards": 0, "tau": 0.0, "steps": 0, "prefill_ms": 0.0, "draft_ms": 0.0,
                "verify_ms": 0.0, "other_ms": 0.0, "wall_s": 0.0, "tokens_per_s": 0.0, "finished": None}
    last = steps[-1]
    tokens, forwards = int(_get(last, "generated", 0)), int(_get(last, "forwards", 0))
    prefill_ms = sum(float(_get(s, "verify_ms", 0)) for s in steps if int(_get(s, "step", 0)) == 0)
    draft_ms = sum(float(_get(s, "draft_ms", 0)) for s in steps)
    verify_ms = sum(float(_get(s, "verify_ms", 0)) for s in decode_steps(steps))
    measured = prefill_ms + draft_ms + verify_ms
    wall_s = decode_s if decode_s is not None else measured / 1e3
    return {
        "tokens": tokens, "forwards": forwards, "steps": len(steps) - 1, "tau": tau(tokens - 1, forwards),
        "prefill_ms": prefill_ms, "draft_ms": draft_ms, "verify_ms": verify_ms,
        "other_ms": max(wall_s * 1e3 - measured, 0.0), "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0, "finished": _get(last, "finished"),
    }


# Greedy acceptance replayed: what greedy speculative decoding would have accepted from another tree
# than the one verified, without running the target again.


def greedy_walk(parents: Sequence[int], depths: Sequence[int], matches: Callable[[int], bool]) -> int:
    """Draft tokens greedy verification accepts from a tree (nodes in topological order): the depth
    of the deepest node that, with each of its ancestors, `matches` the target's own greedy token
    (the root always does)."""
    ok = [True] + [False] * (len(parents) - 1)
    deepest = 0
    for j in range(1, len(parents)):
        if ok[parents[j]] and matches(j):
            ok[j], deepest = True, max(deepest, depths[j])
    return deepest


def replay_walk(ids: Sequence[int], reply: Sequence[bool], draft: Callable[[int], Mapping]) -> tuple[int, int]:
    """Greedy speculative decoding of a reply the target wrote greedily (`reply` marks it in `ids`),
    replayed: each step accepts what `greedy_walk` finds of the reply in `draft(g)`, the tree (a
    `DraftTree.to_dict()`) drafted with ids[g] as root, then the target's own token. Returns (tokens
    after the first, steps), whose `tau` is what decoding would measure."""
    where = [i for i, m in enumerate(reply) if m]
    if len(where) < 2:
        return 0, 0
    start, end = where[0], where[-1] + 1  # the reply is ids[start:end]
    g, steps = start, 0  # g: position of the root (the last token the target chose)
    while g + 1 < end:
        g += _walk_reply(draft(g), ids, g, end) + 1  # the accepted drafts, then the target's own token
        steps += 1
    return min(g, end - 1) - start, steps


def _walk_reply(tree: Mapping, ids: Sequence[int], g: int, end: int) -> int:
    """Draft tokens accepted from `tree` rooted at ids[g]: node j matches the reply at g + depth."""
    tokens, depths = tree["tokens"], tree["depths"]
    return greedy_walk(tree["parents"], depths, lambda j: g + depths[j] < end and tokens[j] == ids[g + depths[j]])


def best_nodes(tree: Mapping, budget: int) -> list[int]:
    """The `budget`-1 non-root nodes of a recorded tree (`DraftTree.to_dict()`) with the highest path
    probability, best first; nodes only prompt lookup proposed (LOOKUP_SOURCE) are not the drafter's
    and do not compete."""
    parents, probs = tree["parents"], tree["draft_probs"]
    sources = tree.get("sources") or [0] * len(parents)
    logp = [0.0] * len(parents)
    for i in range(1, len(parents)):
        logp[i] = logp[parents[i]] + math.log(max(probs[i], 1e-30))
    own = [i for i in range(1, len(parents)) if sources[i] != LOOKUP_SOURCE]
    return sorted(own, key=lambda i: (-logp[i], i))[: max(budget - 1, 0)]


def replay_budget(tree: Mapping, path: Sequence[int], budget: int, lookup: set[int] = frozenset(),
                  sizes: bool = False):
    """Draft tokens greedy verification would have accepted had the drafter been given `budget`
    nodes (root included) instead of the recorded tree: both tree builders keep the candidates with
    the highest path probability (product of draft probabilities from the root), so the smaller tree
    is the recorded one's best budget-1 nodes, closed under ancestors (a child never outranks its
    parent; ties go to the earlier node, i.e. the parent). Greedy acceptance does not depend on which
    other nodes are in the tree, so the accepted path is the recorded one up to its first dropped node.

    `lookup`: the nodes prompt lookup proposed that step (present at every budget).
    With `sizes`, returns (accepted, nodes in that budget's tree).
    """
    kept = set(best_nodes(tree, budget)) | set(lookup)
    on_path = set(path[1:])
    n = greedy_walk(tree["parents"], _depths(tree["parents"]), lambda j: j in kept and j in on_path)
    return (n, len(kept) + 1) if sizes else n


def _depths(parents: Sequence[int]) -> list[int]:
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return depths

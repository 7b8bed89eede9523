"""Tree tuning: the budget that gives the most tokens/s on this device (`auto_tree`) and tau against
the budget (`budget_curve`), both from one greedy decode at the largest budget whose every step is
replayed at the smaller ones (`fasteagle.trace.replay_budget`)."""

from __future__ import annotations

import statistics

import torch
from tqdm.auto import tqdm

from fasteagle import trace
from fasteagle.bench.costs import draft_cost, verify_cost
from fasteagle.bench.timing import time_one
from fasteagle.generate import chat_prompt_ids, generate
from fasteagle.target import Target
from fasteagle.verify import SamplingParams
from fasteagle.whatif import interpolate, nondecreasing, tokens_per_s

AUTO_BUDGETS = (2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
GPU_AUTO_BUDGETS = AUTO_BUDGETS + (96, 128, 192)  # a launch-bound GPU verifies a few hundred nodes at ~one step's cost


def auto_tree(target: Target, drafter, prompts: list[dict], budgets=None, max_new: int = 64, seed: int = 0) -> dict:
    """Pick the tree budget B that maximises expected tokens/s on this device, and set it, by the
    project's one speed model (`fasteagle.whatif.tokens_per_s`, docs/design.md "The what-if model"):

        tokens/s(B) = tokens per step(B) / (draft ms(B) + verify ms(B))

    verify ms(B) is this device's cost of one target forward over the tree B gives (`verify_cost`,
    made non-decreasing in tree size by `nondecreasing`), draft ms(B) the drafter's measured step at
    budget B (draft and `extend`, the device synced after each, so a GPU drafter's kernels count even
    where a decode overlaps them), and tokens per step(B) comes from the drafter's own acceptance,
    replayed: one greedy decode at the largest budget records every tree and its accepted path; the
    tree budget B would have drafted is the best B-1 of those nodes (`fasteagle.trace.replay_budget`),
    and greedy acceptance in it is the recorded path cut at its first missing node. One decode thus
    scores every budget, with no run-to-run timing noise in the acceptance part.

    A drafter joined with prompt lookup (`fasteagle.hybrid.WithLookup`) is tuned the same way: B is
    the budget of its own tree, lookup's nodes are in every budget's tree (lookup ignores B), and the
    verify cost is that of the joined tree's size, interpolated between timed sizes. The budgets
    tried go to 64 nodes on a CPU, where a tree's forward grows with its size, and to 192 on a GPU.
    """
    if budgets is None:
        budgets = GPU_AUTO_BUDGETS if target.device.type == "cuda" else AUTO_BUDGETS
    budgets = sorted(set(budgets))
    encoded = [chat_prompt_ids(target, p["text"]) for p in prompts]
    drafter.tree_budget = budgets[-1]
    time_one(target, encoded[0], "draft", drafter, 8, SamplingParams(), seed)  # warmup
    replayed = []  # (tree, path, the nodes lookup proposed) per step, the prefill left out
    for ids in tqdm(encoded, desc="auto tree: replay decode"):
        replayed += [step[:3] for step in _recorded_steps(target, drafter, ids, max_new, seed) if step[4]]
    outcomes = {b: [trace.replay_budget(tree, path, b, lookup, sizes=True) for tree, path, lookup in replayed]
                for b in budgets}
    per_step = {b: trace.tau(sum(n + 1 for n, _ in outcomes[b]), len(outcomes[b])) for b in budgets}
    context = int(statistics.fmean(ids.numel() for ids in encoded)) + max_new // 2
    biggest = max(size for b in budgets for _, size in outcomes[b])
    sizes = sorted({1, *budgets, *(s for s in (2, 3, 5, 96, 128) if s <= biggest)} | {biggest})
    timed = nondecreasing(verify_cost(target, sizes, prefix=context, reps=20)["ms"])
    verify_ms = {b: statistics.fmean(interpolate(timed, size) for _, size in outcomes[b]) for b in budgets}
    draft_ms = draft_cost(target, drafter, encoded[0], budgets, seed)
    rate = {b: tokens_per_s(per_step[b], draft_ms[b], verify_ms[b]) for b in budgets}
    best = max(rate, key=rate.get)
    drafter.tree_budget = best
    vanilla = 1e3 / timed["1"]
    return {"budget": best, "tokens_per_s": {str(b): round(v, 2) for b, v in rate.items()},
            "speedup_vs_decode_step": {str(b): round(v / vanilla, 3) for b, v in rate.items()},
            "tokens_per_step": {str(b): round(v, 3) for b, v in per_step.items()},
            "tree_size": {str(b): round(statistics.fmean(s for _, s in outcomes[b]), 2) for b in budgets},
            "draft_ms": {str(b): round(v, 2) for b, v in draft_ms.items()},
            "verify_ms": {str(b): round(v, 2) for b, v in verify_ms.items()}, "decode_step_ms": timed["1"],
            "replayed_steps": len(replayed), "context": context}


def budget_curve(target: Target, drafter, prompts: list[dict], budgets, max_new: int = 128, seed: int = 0) -> dict:
    """Tokens per target forward (tau, bonus included) against the tree budget, per prompt category:
    one greedy decode of each prompt at the largest budget, every smaller budget replayed from it
    (`fasteagle.trace.replay_budget`, exact for greedy), so the curve costs one decode and has no
    timing in it. It says what a bigger tree buys where verifying it costs little more than a small
    one (a GPU). `decoded` is the tau the decode itself measured (its last steps draft no deeper
    than the tokens left, as in `compare`): the replay leaves those steps out, and a decode at a
    smaller budget would visit other positions, so read the curve to a few hundredths."""
    budgets = sorted(set(budgets))
    drafter.tree_budget = budgets[-1]
    steps: dict[str, list] = {}
    emitted: dict[str, list] = {}  # tokens each step of the decode emitted
    for p in tqdm(prompts, desc="budget curve", unit="prompt"):
        recorded = _recorded_steps(target, drafter, chat_prompt_ids(target, p["text"]), max_new, seed)
        steps.setdefault(p["category"], []).extend(step[:3] for step in recorded if step[4])
        emitted.setdefault(p["category"], []).extend(step[3] for step in recorded)
    if len(steps) > 1:
        steps["all"] = [s for rec in list(steps.values()) for s in rec]
        emitted["all"] = [n for rec in list(emitted.values()) for n in rec]
    tau = {c: {str(b): round(_replayed_tau(rec, b), 3) for b in budgets} for c, rec in steps.items()}
    return {"budget_curve": tau, "decoded": {c: round(trace.tau(sum(n), len(n)), 3) for c, n in emitted.items()},
            "steps": {c: len(rec) for c, rec in steps.items()}, "max_new_tokens": max_new}


def _replayed_tau(recorded: list[tuple], budget: int) -> float:
    """Tau of recorded (tree, path, lookup nodes) steps replayed at `budget`: accepted drafts plus the bonus."""
    return trace.tau(sum(trace.replay_budget(tree, path, budget, lookup) + 1 for tree, path, lookup in recorded),
                     len(recorded))


def _recorded_steps(target: Target, drafter, ids: torch.Tensor, max_new: int, seed: int) -> list[tuple]:
    """One greedy decode for replay: (tree, path, nodes lookup proposed, tokens emitted, whole) per
    decode step. The lookup nodes are empty unless the drafter is joined with lookup, whose tree of a
    step is read as that step comes out (the next step replaces it). `whole` is false for the last
    steps, whose trees `generate` cut to the tokens left: a replay would count the length limit."""
    recorded, room = [], []
    for s in generate(target, ids, drafter=drafter, max_new_tokens=max_new, seed=seed):
        if not s.tree:  # the prefill
            continue
        last = getattr(drafter, "last_lookup", None)
        recorded.append((s.tree, s.path, lookup_nodes(s.tree, last.to_dict()) if last is not None else set(),
                         len(s.tokens)))
        room.append(max_new - (s.generated - len(s.tokens)) - 1)  # the deepest node this step could keep
    deepest = max((max(step[0]["depths"]) for step in recorded), default=0)
    return [step + (r >= deepest,) for step, r in zip(recorded, room)]


def lookup_nodes(tree: dict, lookup_tree: dict) -> set[int]:
    """The non-root nodes of a recorded (joined) tree whose token path lookup's tree holds."""
    proposed = token_paths(lookup_tree)
    return {i for i, p in enumerate(node_paths(tree)) if i and p in proposed}


def node_paths(tree: dict) -> list[tuple[int, ...]]:
    """Each node's root-to-node token path (root excluded, so the root's is empty) of a recorded tree."""
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, len(tree["parents"])):
        paths.append(paths[tree["parents"][i]] + (tree["tokens"][i],))
    return paths


def token_paths(tree: dict) -> set[tuple[int, ...]]:
    return set(node_paths(tree)[1:])

"""Every metric on decode traces, from its one place (`fasteagle.trace`), against small traces
computed by hand; and that the module, and `viz` with it, import without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fasteagle.trace import (
    ACCEPTED,
    LOOKUP_SOURCE,
    NEVER_REACHED,
    REJECTED,
    SUMMARY_NUMBERS,
    StepTrace,
    accepted_lengths,
    best_nodes,
    decode_steps,
    depth_acceptance,
    depth_counts,
    depth_rates,
    first_difference,
    greedy_walk,
    histogram,
    replay_budget,
    replay_walk,
    reply_tokens,
    run_summary,
    step_lengths,
    tau,
)

A, R, N = ACCEPTED, REJECTED, NEVER_REACHED
ROOT = Path(__file__).resolve().parent.parent


def step(n: int, parents: list[int], status: list[int], path: list[int], tokens: list[int], generated: int,
         **extra) -> dict:
    """A decode step as a trace file holds it (`StepTrace.to_dict()`), its tree's depths from `parents`."""
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    tree = {"tokens": list(range(100, 100 + len(parents))), "parents": parents, "depths": depths,
            "draft_probs": [1.0] * len(parents), "sources": [0] * len(parents)}
    return {"step": n, "tokens": tokens, "token_depths": [0] * len(tokens), "text": "", "draft_ms": 2.0,
            "verify_ms": 10.0, "tree": tree, "status": status, "path": path, "generated": generated,
            "forwards": n} | extra


def decode() -> list[dict]:
    """A prefill and three steps:
    1. a chain 0-1-2, both drafts accepted: depths 1 and 2 judged and accepted (3 tokens, the bonus too);
    2. root with children 1, 2 and 3 under 2: 1 accepted at a leaf, 2 rejected; depth 2 exists but was
       never judged (2 tokens);
    3. a chain 0-1-2-3 whose depth 1 was rejected: nothing deeper judged; the step ends the decode at
       a stop token (1 token)."""
    prefill = {"step": 0, "tokens": [7], "token_depths": [0], "text": "", "draft_ms": 1.0, "verify_ms": 30.0,
               "tree": None, "generated": 1, "forwards": 0}
    return [prefill,
            step(1, [-1, 0, 1], [A, A, A], [0, 1, 2], [11, 12, 13], 4),
            step(2, [-1, 0, 0, 2], [A, A, R, N], [0, 1], [14, 15], 6),
            step(3, [-1, 0, 1, 2], [A, R, N, N], [0], [16], 7, finished="eos")]


@pytest.mark.parametrize("as_objects", [False, True])
def test_metrics_read_step_traces_and_their_dicts_alike(as_objects):
    steps = [StepTrace.from_dict(d) for d in decode()] if as_objects else decode()
    assert [int(s.step if as_objects else s["step"]) for s in decode_steps(steps)] == [1, 2, 3]
    assert step_lengths(steps) == [3, 2, 1]
    assert accepted_lengths(steps) == [2, 1, 0]
    assert depth_counts(steps) == ([3, 1], [2, 1])
    assert run_summary(steps)["tau"] == 2.0


def test_tau_is_tokens_per_target_forward_without_the_prefill_token():
    assert tau(6, 3) == 2.0 and tau(0, 0) == 0.0 and tau(5, 5) == 1.0  # plain decoding: one per forward
    last = StepTrace.from_dict(decode()[-1])
    assert last.tau == (7 - 1) / 3 and last.to_dict()["tau"] == last.tau
    assert StepTrace.from_dict(decode()[0]).tau == 0.0  # the prefill: no forward yet


@pytest.mark.parametrize("as_objects", [False, True])
def test_reply_tokens_and_where_two_replies_part(as_objects):
    steps = [StepTrace.from_dict(d) for d in decode()] if as_objects else decode()
    reply = reply_tokens(steps)
    assert reply == [7, 11, 12, 13, 14, 15, 16]  # the prefill's token first, then every step's
    assert first_difference(reply, list(reply)) is None
    assert first_difference(reply, reply[:3] + [0] + reply[4:]) == 3
    assert first_difference(reply, reply[:5]) == 5 and first_difference([], [1]) == 0  # one ends early


def test_accepted_length_histogram():
    assert histogram([3, 2, 1, 3], 1) == [1, 1, 2]  # the bench's: tokens per step, from 1
    assert histogram(accepted_lengths(decode()), 0) == [1, 1, 1]  # the app's: drafts accepted, from 0
    assert histogram([4], 1) == [0, 0, 0, 1]
    assert histogram([], 1) == [0] and histogram([], 0) == [0]


def test_per_depth_acceptance_counts_a_depth_only_where_the_verifier_judged_it():
    reached, accepted = depth_counts(decode())
    assert reached == [3, 1] and accepted == [2, 1]  # depth 1 judged in all three steps, depth 2 in the first
    assert depth_rates(reached, accepted) == [2 / 3, 1.0]
    assert depth_rates([3, 1, 0], [2, 1, 0]) == [2 / 3, 1.0, None]  # a depth no step reached: null
    assert depth_acceptance(decode()) == [{"depth": 1, "reached": 3, "accepted": 2, "rate": 2 / 3},
                                          {"depth": 2, "reached": 1, "accepted": 1, "rate": 1.0}]
    # sampling can leave a reached node's later children unjudged: a depth counts once per step
    sampled = step(1, [-1, 0, 0, 1], [A, A, N, R], [0, 1], [5, 6], 3)
    assert depth_counts([sampled]) == ([1, 1], [1, 0])
    assert depth_counts([decode()[0]]) == ([], [])  # the prefill verifies no tree


def test_run_summary_of_a_decode():
    s = run_summary(decode(), decode_s=0.1)
    assert s["tokens"] == 7 and s["forwards"] == 3 and s["steps"] == 3 and s["tau"] == 2.0
    assert s["prefill_ms"] == 30.0 and s["draft_ms"] == 7.0 and s["verify_ms"] == 30.0
    assert s["other_ms"] == pytest.approx(100 - 67) and s["tokens_per_s"] == pytest.approx(70)
    assert s["finished"] == "eos"
    assert run_summary(decode())["wall_s"] == pytest.approx(0.067)  # no wall time: the steps' own
    assert set(SUMMARY_NUMBERS) <= set(s) and run_summary([])["tau"] == 0.0


def test_greedy_walk_accepts_the_deepest_node_matching_with_all_its_ancestors():
    #      0
    #    1   2
    #    3   4
    #        5
    parents, depths = [-1, 0, 0, 1, 2, 4], [0, 1, 1, 2, 2, 3]
    assert greedy_walk(parents, depths, lambda j: j in {2, 4, 5}) == 3
    assert greedy_walk(parents, depths, lambda j: j in {1, 4, 5}) == 1  # 4 and 5 hang under a rejected node
    assert greedy_walk(parents, depths, lambda j: False) == 0 and greedy_walk([-1], [0], bool) == 0


def test_replay_walk_decodes_a_known_reply_step_by_step():
    ids = [1, 2, 20, 21, 22, 23, 24, 25, 26]  # the reply is ids[2:]: 20 (the prefill's token), then 21..26
    reply = [False, False] + [True] * 7
    trees = {  # the tree drafted with ids[g] as root
        2: {"tokens": [20, 21, 9, 22], "parents": [-1, 0, 0, 2], "depths": [0, 1, 1, 2]},  # 21; 22 is under 9
        4: {"tokens": [22, 23, 24, 25], "parents": [-1, 0, 1, 2], "depths": [0, 1, 2, 3]},  # 23, 24, 25
    }
    seen = []

    def draft(g: int) -> dict:
        seen.append(g)
        return trees[g]

    # step 1 emits 21 and the target's 22, step 2 emits 23, 24, 25 and the target's 26: the reply is done
    assert replay_walk(ids, reply, draft) == (6, 2) and seen == [2, 4]
    assert replay_walk(ids, [False] * 8 + [True], draft) == (0, 0)  # a one-token reply: nothing to draft
    root_only = lambda g: {"tokens": [ids[g]], "parents": [-1], "depths": [0]}  # no drafts: a token per step
    assert replay_walk(ids[:5], reply[:5], root_only) == (2, 2)


def test_replay_at_a_smaller_budget_keeps_the_best_nodes():
    # root 0; 1 (p .5) and 2 (p .3) under it; 3 (.9) and 4 (.2) under 1; 5 (.5) under 3
    tree = {"parents": [-1, 0, 0, 1, 1, 3], "draft_probs": [1.0, 0.5, 0.3, 0.9, 0.2, 0.5]}
    assert best_nodes(tree, 6) == [1, 3, 2, 5, 4]  # path probabilities .5, .45, .3, .225, .1
    assert [replay_budget(tree, [0, 1, 3, 5], b) for b in (2, 3, 4, 5)] == [1, 2, 2, 3]
    assert replay_budget(tree, [0, 1, 3, 5], 3, sizes=True) == (2, 3)
    tree["sources"] = [0, 1, 1, 2, LOOKUP_SOURCE, 3]  # 4 only lookup proposed: it never competes
    assert best_nodes(tree, 10) == [1, 3, 2, 5]
    assert replay_budget(tree, [0, 1, 4], 2, lookup={4}, sizes=True) == (2, 3)


def test_trace_and_viz_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import fasteagle.trace, viz\n"
            "assert viz.VERDICTS and fasteagle.trace.tau(4, 2) == 2.0")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_below_counts_split_judged_children_by_a_backbone_or_side_parent():
    from fasteagle.trace import ACCEPTED as A
    from fasteagle.trace import NEVER_REACHED as N
    from fasteagle.trace import REJECTED as R
    from fasteagle.trace import backbone, below_counts

    #        0 ─┬─ 1 (.6) ─┬─ 3 (.5)        backbone: 0, 1, 3 (each parent's most probable child)
    #           │          └─ 5 (.1)
    #           └─ 2 (.3) ─── 4 (.2)
    tree = {"parents": [-1, 0, 0, 1, 2, 1], "draft_probs": [1, .6, .3, .5, .2, .1], "depths": [0, 1, 1, 2, 2, 2]}
    assert backbone(tree) == [True, True, False, True, False, False]
    side = {"tree": tree, "status": [A, R, A, N, A, N], "path": [0, 2, 4]}  # below side node 2: 4 accepted
    spine = {"tree": tree, "status": [A, A, N, R, N, R], "path": [0, 1]}  # below backbone node 1: both rejected
    leaf = {"tree": tree, "status": [A, A, N, A, N, N], "path": [0, 1, 3]}  # 3 has no children: judged below 1 only
    assert below_counts([side, spine, leaf]) == ([2, 1], [1, 1])
    assert below_counts([{"tree": None, "status": [], "path": []}]) == ([0, 0], [0, 0])

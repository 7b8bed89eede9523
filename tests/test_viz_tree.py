"""The draft-tree picture: its layout (rows, elbows, folding) and the plotly figure drawn from a step."""

from __future__ import annotations

import pytest

import viz
from tests.vizdata import backbone_step, decode, node_traces
from viz import tokens
from viz.tree import (
    ACCEPTED,
    ACCEPTED_PATH,
    BONUS_NAME,
    FOLD_ROWS,
    FOLDED_NAME,
    FOLDED_REJECTED_NAME,
    KEEP_REJECTED,
    LABEL_HEIGHT_PX,
    LOOKUP_NAME,
    LOOKUP_SOURCE,
    LOOKUP_SYMBOL,
    MARKER_PX,
    NEVER_REACHED,
    REJECTED,
    ROW_PX,
    VERDICT_COLORS,
    VERDICTS,
    figure_height,
    row_spacing_px,
    tree_figure,
    tree_layout,
)


# -- layout -----------------------------------------------------------------------------------------
def _crossings(lay) -> list:
    """Pairs of edges that cross: in one column gap, parent order and child order disagree."""
    edges = [(lay.x[c], lay.y[p], lay.y[c]) for c, p in enumerate(lay.parents) if p >= 0]
    return [(a, b) for a in edges for b in edges
            if a[0] == b[0] and (a[1] - b[1]) * (a[2] - b[2]) < 0]


def _shared_elbows(lay) -> list:
    """Pairs of parents in one column whose elbows (the vertical parts between two columns, from the
    parent's row to its last child's) share rows: a child there could be read as the other's."""
    spans: dict[int, list] = {}
    for c, p in enumerate(lay.parents):
        if p >= 0:
            lo, hi = spans.setdefault(p, [lay.y[p], lay.y[p]])
            spans[p] = [min(lo, lay.y[c]), max(hi, lay.y[c])]
    return [(a, b) for a in spans for b in spans
            if a < b and lay.x[a] == lay.x[b] and spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]]


def test_layout_keeps_chains_on_one_row_and_packs_side_leaves():
    parents = backbone_step()["tree"]["parents"]
    lay = tree_layout(parents)
    assert lay.x == [0, 1, 1, 2, 2, 2, 3, 3]  # x = depth
    assert lay.y[0] == lay.y[1] == lay.y[3] == lay.y[6] == 0  # the backbone is one straight line
    assert lay.y[2] == 1 and (lay.y[4], lay.y[5]) == (1, 2) and lay.y[7] == 1  # side leaves right below
    assert lay.rows == 3
    positions = list(zip(lay.x, lay.y))
    assert len(set(positions)) == len(positions)  # no two nodes in one place
    assert not _crossings(lay) and not _shared_elbows(lay)


def test_a_lower_parent_starts_below_the_children_of_the_one_above():
    # root -> a, b; a -> a1, a2, a3 (leaves); b -> b1. Packed naively, b sits on row 1, inside a's elbow
    # (rows 0-2), and b1 would seem to hang from a.
    lay = tree_layout([-1, 0, 0, 1, 1, 1, 2])
    assert lay.y[:3] == [0, 0, 3] and lay.y[3:] == [0, 1, 2, 3]
    assert not _shared_elbows(lay)


def test_layout_of_random_trees_has_no_collisions_or_crossings():
    import random

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 40)
        parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        lay = tree_layout(parents, bonus_parent=rng.randrange(n))
        positions = list(zip(lay.x, lay.y))
        assert len(set(positions)) == len(positions)
        assert not _crossings(lay) and not _shared_elbows(lay)
        assert all(lay.x[c] == lay.x[p] + 1 and lay.y[c] >= lay.y[p] for c, p in enumerate(lay.parents) if p >= 0)
        leaves = sum(1 for i in range(len(lay.parents)) if i not in lay.parents)
        assert lay.rows == max(lay.y) + 1 <= leaves


def test_layout_with_bonus_node_never_collides():
    for parents, last in (([-1, 0, 1], 2), ([-1, 0, 0, 1], 1), ([-1], 0)):
        lay = tree_layout(parents, bonus_parent=last)
        assert lay.bonus == len(parents)
        assert lay.x[lay.bonus] == lay.x[last] + 1
        positions = list(zip(lay.x, lay.y))
        assert len(set(positions)) == len(positions)


# -- tree figure ------------------------------------------------------------------------------------
def test_accepted_path_is_one_trace_through_the_accepted_nodes():
    step = backbone_step()
    fig = tree_figure(step, decode)
    paths = [t for t in fig.data if t.name == ACCEPTED_PATH]
    assert len(paths) == 1
    lay = tree_layout(step["tree"]["parents"], bonus_parent=step["path"][-1])
    assert list(paths[0].x) == [lay.x[i] for i in step["path"]]
    assert list(paths[0].y) == [lay.y[i] for i in step["path"]]
    accepted = [i for i, s in enumerate(step["status"]) if s == ACCEPTED]
    assert accepted == step["path"]


def test_nodes_are_coloured_by_verdict_with_hover_details():
    step = backbone_step()
    fig = tree_figure(step, decode)
    by_name = node_traces(fig)
    seen = []
    for verdict in (ACCEPTED, REJECTED, NEVER_REACHED):
        t = by_name[VERDICTS[verdict]]
        assert t.marker.color == VERDICT_COLORS[verdict]
        nodes = [int(c[0]) for c in t.customdata] if t.customdata is not None else []
        assert nodes == [i for i, s in enumerate(step["status"]) if s == verdict]
        seen += nodes
        for c in t.customdata if t.customdata is not None else []:
            i = int(c[0])
            assert int(c[1]) == step["tree"]["tokens"][i]  # token id
            assert int(c[2]) == step["tree"]["depths"][i]  # depth
            assert float(c[3]) == pytest.approx(step["tree"]["draft_probs"][i])
            assert float(c[4]) == pytest.approx(step["target_probs"][i])
        assert "token id" in t.hovertemplate and "draft p" in t.hovertemplate and "target p" in t.hovertemplate
    assert sorted(seen) == list(range(len(step["status"])))
    assert len({VERDICT_COLORS[v] for v in VERDICTS}) == 3
    assert list(by_name[VERDICTS[ACCEPTED]].text) == ["The", "␣cat", "␣sat"]  # whitespace made visible


def test_nodes_from_prompt_lookup_are_marked():
    from fasteagle.hybrid import LOOKUP_SOURCE as ENGINE_LOOKUP_SOURCE

    assert LOOKUP_SOURCE == ENGINE_LOOKUP_SOURCE  # viz does not import the engine, so keep them equal here
    step = backbone_step()
    assert LOOKUP_NAME not in node_traces(tree_figure(step, decode))  # no lookup node, no legend entry
    step["tree"]["sources"] = [0, 1, 1, 2, 2, LOOKUP_SOURCE, LOOKUP_SOURCE, 3]  # nodes 5 and 6 came from lookup
    fig = tree_figure(step, decode)
    assert LOOKUP_NAME in node_traces(fig)
    for t in fig.data:
        if t.name in VERDICTS.values() and t.customdata is not None:
            for c, symbol in zip(t.customdata, t.marker.symbol):
                from_lookup = int(c[0]) in (5, 6)
                assert symbol.startswith(LOOKUP_SYMBOL) == from_lookup
                assert (c[5] == LOOKUP_NAME) == from_lookup and (from_lookup or c[5].startswith("drafter layer"))


def test_bonus_token_drawn_only_when_the_step_ends_with_one():
    step = backbone_step()
    fig = tree_figure(step, decode)
    bonus = node_traces(fig)[BONUS_NAME]
    assert list(bonus.text)[-1] == "␣the"
    assert int(bonus.customdata[-1][0]) == 15
    cut = dict(step, tokens=[8, 10], token_depths=[1, 2])  # clipped at max_new_tokens: no bonus
    assert BONUS_NAME not in node_traces(tree_figure(cut, decode))


def test_labels_never_overlap_and_height_grows_with_leaves():
    step = backbone_step()
    fig = tree_figure(step, decode)
    assert row_spacing_px(fig) >= LABEL_HEIGHT_PX + MARKER_PX  # a label fits between two rows' markers
    # A wide tree: FOLD_ROWS - 1 side leaves under the root, the most that are drawn unfolded.
    n = FOLD_ROWS
    wide = {"step": 1, "tokens": [9], "token_depths": [0], "tree": {
        "tokens": [7] + [8] * (n - 1), "parents": [-1] + [0] * (n - 1), "depths": [0] + [1] * (n - 1),
        "draft_probs": [1.0] * n, "sources": [0] + [1] * (n - 1)},
        "status": [1] + [2] * (n - 1), "target_probs": [1.0] * n, "path": [0]}
    big = tree_figure(wide, decode)
    assert big.layout.height > fig.layout.height
    assert big.layout.height == figure_height(n)  # the leaves + the bonus node's own row
    assert row_spacing_px(big) >= LABEL_HEIGHT_PX + MARKER_PX
    ys = sorted(y for t in big.data if t.name in VERDICTS.values() for y in t.y)
    gaps = [b - a for a, b in zip(ys, ys[1:]) if b != a]
    assert min(gaps) >= 1  # distinct rows are whole rows apart
    for t in big.data:  # every label is short enough for one depth column
        for label in t.text or []:
            assert len(label) <= tokens.MAX_LABEL


def big_step() -> dict:
    """A 91-node tree: root -> 1 (accepted) -> 2 (accepted), 3 rejected under 1; under the root, 10
    rejected siblings of 1, each with a never-reached chain of 3; under 2, 6 rejected children, each with
    never-reached pairs (a node and its child) x 4; 2 more never-reached leaves under 1."""
    parents, status = [-1, 0, 1, 1], [ACCEPTED, ACCEPTED, ACCEPTED, REJECTED]
    def add(parent, verdict):
        parents.append(parent)
        status.append(verdict)
        return len(parents) - 1
    for _ in range(10):
        s = add(0, REJECTED)
        a = add(s, NEVER_REACHED)
        add(add(a, NEVER_REACHED), NEVER_REACHED)
    for _ in range(6):
        r = add(2, REJECTED)
        for _ in range(4):
            add(add(r, NEVER_REACHED), NEVER_REACHED)
    for _ in range(2):
        add(1, NEVER_REACHED)
    n = len(parents)
    depths = [0] * n
    for j in range(1, n):
        depths[j] = depths[parents[j]] + 1
    return {"step": 5, "tokens": [8, 10, 15], "token_depths": [1, 2, 0],
            "tree": {"tokens": [7 + j % 9 for j in range(n)], "parents": parents, "depths": depths,
                     "draft_probs": [0.5] * n, "sources": depths},
            "status": status, "target_probs": [0.5] * n, "path": [0, 1, 2]}


def test_big_trees_fold_their_never_reached_branches():
    step = big_step()
    n, status = len(step["status"]), step["status"]
    assert tree_layout(step["tree"]["parents"]).rows > FOLD_ROWS
    fig = tree_figure(step, decode)
    by_name = node_traces(fig)
    folded = by_name[FOLDED_NAME]
    # one stand-in per reached node with never-reached children, counting every never-reached node once
    counts = [int(c[0]) for c in folded.customdata]
    assert sum(counts) == status.count(NEVER_REACHED) and len(counts) == 10 + 6 + 1
    assert sorted(folded.text) == sorted(f"+{c}" for c in counts)
    assert list(by_name[VERDICTS[NEVER_REACHED]].x) == []  # none drawn one by one
    drawn = sorted(int(c[0]) for v in (ACCEPTED, REJECTED) for c in by_name[VERDICTS[v]].customdata)
    assert drawn == [i for i in range(n) if status[i] != NEVER_REACHED]
    assert [int(c[0]) for c in by_name[VERDICTS[ACCEPTED]].customdata] == step["path"]
    assert f"{status.count(NEVER_REACHED)} never reached nodes folded" in fig.layout.title.text
    assert FOLDED_REJECTED_NAME not in by_name  # short enough once the never-reached branches fold
    assert fig.layout.height < figure_height(tree_layout(step["tree"]["parents"]).rows)
    assert BONUS_NAME in by_name and row_spacing_px(fig) >= LABEL_HEIGHT_PX + MARKER_PX
    assert FOLDED_NAME not in node_traces(tree_figure(backbone_step(), decode))  # small trees: every node


def test_a_tree_still_too_tall_folds_its_surplus_rejected_leaves():
    """A 192-node tree's accepted nodes may each have dozens of rejected children: past FOLD_ROWS rows
    each parent keeps its KEEP_REJECTED most probable rejected leaves in sight."""
    n_side = 40
    parents = [-1, 0, 1] + [1] * n_side + [0] * 5  # root -> 1 -> 2 accepted; 40 rejected under 1, 5 under root
    status = [ACCEPTED, ACCEPTED, ACCEPTED] + [REJECTED] * (n_side + 5)
    n = len(parents)
    probs = [1.0, 0.9, 0.8] + [0.01 * (k % 7) + 0.001 * k for k in range(n_side)] + [0.05] * 5
    depths = [0, 1, 2] + [2] * n_side + [1] * 5
    step = {"step": 2, "tokens": [8, 10, 15], "token_depths": [1, 2, 0],
            "tree": {"tokens": [7 + j % 9 for j in range(n)], "parents": parents, "depths": depths,
                     "draft_probs": probs, "sources": depths},
            "status": status, "target_probs": [0.5] * n, "path": [0, 1, 2]}
    fig = tree_figure(step, decode)
    by_name = node_traces(fig)
    kept = sorted(int(c[0]) for c in by_name[VERDICTS[REJECTED]].customdata)
    best = sorted(range(3, 3 + n_side), key=lambda i: -probs[i])[:KEEP_REJECTED]
    assert kept == sorted(best + list(range(3 + n_side, n))[:KEEP_REJECTED])
    folded = by_name[FOLDED_REJECTED_NAME]
    assert sorted(folded.text) == sorted([f"+{n_side - KEEP_REJECTED}", f"+{5 - KEEP_REJECTED}"])
    assert f"{n_side + 5 - 2 * KEEP_REJECTED} rejected nodes folded" in fig.layout.title.text
    assert fig.layout.height <= figure_height(FOLD_ROWS)


def test_a_figure_can_be_taller_than_its_tree_without_spreading_the_rows():
    step = backbone_step()
    own = tree_figure(step, decode)
    assert own.layout.height == viz.tree_height(step) == figure_height(3)
    tall = tree_figure(step, decode, min_height=900)
    assert tall.layout.height == 900 and row_spacing_px(tall) == pytest.approx(ROW_PX, rel=0.02)
    assert tree_figure(step, decode, min_height=10).layout.height == own.layout.height
    assert viz.tree_height({"step": 0, "tokens": [7], "token_depths": [0], "tree": None}) == figure_height(0)


def test_prefill_and_vanilla_steps_render():
    fig = tree_figure({"step": 0, "tokens": [7], "token_depths": [0], "tree": None}, decode)
    assert "prefill" in fig.layout.annotations[0].text
    root_only = {"step": 4, "tokens": [8], "token_depths": [0], "tree": {"tokens": [7], "parents": [-1],
                 "depths": [0], "draft_probs": [1.0], "sources": [0]}, "status": [1], "target_probs": [1.0],
                 "path": [0]}
    fig = tree_figure(root_only, decode)
    path = node_traces(fig)[ACCEPTED_PATH]
    assert len(path.x) == 1


def test_label_map_instead_of_a_decoder():
    fig = tree_figure(backbone_step(), {7: "A", 8: "B", 10: "C", 15: "Z"})
    acc = node_traces(fig)[VERDICTS[ACCEPTED]]
    assert list(acc.text) == ["A", "B", "C"]
    rej = node_traces(fig)[VERDICTS[REJECTED]]
    assert list(rej.text)[0] == "#9"  # unknown ids show their number

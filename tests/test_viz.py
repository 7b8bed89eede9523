"""The pure trace -> picture functions in `viz` (no model needed except the tiny one)."""

from __future__ import annotations

import json
import re

import pytest

import viz
from fasteagle import trace
from fasteagle.generate import chat_prompt_ids, run
from fasteagle.lookup import LookupDrafter
from viz import charts, tokens, trace_io
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

NAMES = {7: "The", 8: " cat", 9: " dog", 10: " sat", 11: "\n", 12: " ran", 13: " on", 14: "\t", 15: " the"}


def decode(ids):
    return "".join(NAMES.get(i, f"<{i}>") for i in ids)


def backbone_step() -> dict:
    """root(7) -> 8 -> 10 -> 13 is the backbone; 9 (depth 1), 11 and 12 (depth 2, under 8) and 14
    (depth 3, under 10) are side leaves. Accepted: 8 then 10; 13 rejected with 14; bonus 15."""
    parents = [-1, 0, 0, 1, 1, 1, 3, 3]
    toks = [7, 8, 9, 10, 11, 12, 13, 14]
    depths = [0, 1, 1, 2, 2, 2, 3, 3]
    status = [ACCEPTED, ACCEPTED, REJECTED, ACCEPTED, REJECTED, REJECTED, REJECTED, REJECTED]
    return {
        "step": 3, "tokens": [8, 10, 15], "token_depths": [1, 2, 0], "text": " cat sat the",
        "draft_ms": 4.0, "verify_ms": 20.0,
        "tree": {"tokens": toks, "parents": parents, "depths": depths,
                 "draft_probs": [1, .9, .05, .8, .1, .05, .7, .2], "sources": depths},
        "status": status, "target_probs": [1, .95, .02, .9, .05, .01, .1, .3],
        "path": [0, 1, 3], "generated": 9, "forwards": 3, "finished": None,
    }


def _node_traces(fig):
    return {t.name: t for t in fig.data}


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
    by_name = _node_traces(fig)
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
    assert LOOKUP_NAME not in _node_traces(tree_figure(step, decode))  # no lookup node, no legend entry
    step["tree"]["sources"] = [0, 1, 1, 2, 2, LOOKUP_SOURCE, LOOKUP_SOURCE, 3]  # nodes 5 and 6 came from lookup
    fig = tree_figure(step, decode)
    assert LOOKUP_NAME in _node_traces(fig)
    for t in fig.data:
        if t.name in VERDICTS.values() and t.customdata is not None:
            for c, symbol in zip(t.customdata, t.marker.symbol):
                from_lookup = int(c[0]) in (5, 6)
                assert (symbol == LOOKUP_SYMBOL) == from_lookup
                assert (c[5] == LOOKUP_NAME) == from_lookup and (from_lookup or c[5].startswith("drafter layer"))


def test_bonus_token_drawn_only_when_the_step_ends_with_one():
    step = backbone_step()
    fig = tree_figure(step, decode)
    bonus = _node_traces(fig)[BONUS_NAME]
    assert list(bonus.text)[-1] == "␣the"
    assert int(bonus.customdata[-1][0]) == 15
    cut = dict(step, tokens=[8, 10], token_depths=[1, 2])  # clipped at max_new_tokens: no bonus
    assert BONUS_NAME not in _node_traces(tree_figure(cut, decode))


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
    by_name = _node_traces(fig)
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
    assert FOLDED_NAME not in _node_traces(tree_figure(backbone_step(), decode))  # small trees: every node


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
    by_name = _node_traces(fig)
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
    path = _node_traces(fig)[ACCEPTED_PATH]
    assert len(path.x) == 1


def test_label_map_instead_of_a_decoder():
    fig = tree_figure(backbone_step(), {7: "A", 8: "B", 10: "C", 15: "Z"})
    acc = _node_traces(fig)[VERDICTS[ACCEPTED]]
    assert list(acc.text) == ["A", "B", "C"]
    rej = _node_traces(fig)[VERDICTS[REJECTED]]
    assert list(rej.text)[0] == "#9"  # unknown ids show their number


# -- tokens and spans -------------------------------------------------------------------------------
def test_visible_whitespace_and_labels():
    assert tokens.visible(" a\nb\t") == "␣a↵b⇥"
    assert tokens.token_label("") == "∅"
    assert tokens.token_label("x" * 30) == "x" * 9 + "…"


def test_reply_spans_coloured_by_how_each_token_was_made():
    traces = [{"step": 0, "tokens": [7], "token_depths": [0]}, backbone_step(),
              {"step": 4, "tokens": [11, 12], "token_depths": [1, 0]}]
    spans = viz.token_spans(traces, decode)
    assert [s.text for s in spans] == ["The", " cat", " sat", " the", "\n", " ran"]
    assert [s.category for s in spans] == [viz.BONUS, "draft d1", "draft d2", viz.BONUS, "draft d1", viz.BONUS]
    assert [s.step for s in spans] == [0, 3, 3, 3, 4, 4]
    hl = viz.highlighted(spans)
    assert hl[1] == (" cat", "draft d1")
    cmap = viz.color_map()
    assert all(cat in cmap for _, cat in hl)
    assert len(set(cmap.values())) == len(cmap)  # every depth its own colour


def test_reply_html_spans():
    spans = viz.token_spans([{"step": 0, "tokens": [7], "token_depths": [0]}, backbone_step()], decode)
    spans.append(tokens.Span("<b>&", 1, 5, [99]))
    html = viz.spans_html(spans)
    toks = re.findall(r'<span class="fe-tok" data-depth="(\d+)" data-step="(\d+)" style="background:([^;]+);[^"]*" '
                      r'title="([^"]*)">(.*?)</span>', html)
    assert [(int(d), t) for d, _, _, _, t in toks] == [(0, "The"), (1, " cat"), (2, " sat"), (0, " the"),
                                                          (1, "&lt;b&gt;&amp;")]
    assert [c for _, _, c, _, _ in toks] == [tokens.depth_color(int(d)) for d, _, _, _, _ in toks]
    assert "depth 2" in toks[2][3] and "step 3" in toks[2][3] and "token id 10" in toks[2][3]
    assert "white-space:pre-wrap" in html and html.count('class="fe-chip"') == 5  # legend: bonus, d1..d4
    assert "fe-legend" not in viz.spans_html(spans, legend=False)
    assert "nothing yet" in viz.spans_html([], empty="nothing yet")


def test_spans_merge_a_character_split_across_tokens():
    table = {1: b"a", 2: b"\xe2\x82", 3: b"\xac", 4: b"b"}  # "€" = e2 82 ac, split over tokens 2 and 3

    def dec(ids):
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    spans = viz.token_spans([{"step": 0, "tokens": [1], "token_depths": [0]},
                             {"step": 1, "tokens": [2, 3, 4], "token_depths": [1, 2, 0]}], dec)
    assert [s.text for s in spans] == ["a", "€", "b"]
    assert spans[1].token_ids == [2, 3] and spans[1].depth == 2


def test_spans_from_a_real_decode_match_the_text(tiny):
    ids = chat_prompt_ids(tiny, "w9 w10 w11 w9 w10 w11 w9 w10")
    _, traces = run(tiny, ids, drafter=LookupDrafter(), max_new_tokens=20)
    dicts = [t.to_dict() for t in traces]
    dec = lambda x: tiny.tokenizer.decode(x, skip_special_tokens=True)
    spans = viz.token_spans(dicts, dec)
    assert "".join(s.text for s in spans) == "".join(t["text"] for t in dicts)
    emitted = [(t, d) for tr in dicts for t, d in zip(tr["tokens"], tr["token_depths"])]
    assert [(s.token_ids[-1], s.depth) for s in spans] == [e for e in emitted if dec([e[0]])]
    for tr in dicts[1:]:  # every real step renders, its path trace matching the accepted nodes
        fig = tree_figure(tr, lambda x: tiny.tokenizer.decode(x))
        path = _node_traces(fig)[ACCEPTED_PATH]
        assert len(path.x) == len(tr["path"]) == sum(1 for s in tr["status"] if s == ACCEPTED)
        assert row_spacing_px(fig) >= LABEL_HEIGHT_PX + MARKER_PX


# -- summary charts ---------------------------------------------------------------------------------
def _run_traces():
    prefill = {"step": 0, "tokens": [7], "token_depths": [0], "draft_ms": 1.0, "verify_ms": 30.0, "tree": None,
               "generated": 1, "forwards": 0}
    s1 = backbone_step() | {"generated": 4, "forwards": 1}
    s2 = {"step": 2, "tokens": [9], "token_depths": [0], "draft_ms": 2.0, "verify_ms": 10.0,
          "tree": {"tokens": [15, 8, 9], "parents": [-1, 0, 1], "depths": [0, 1, 2], "draft_probs": [1, .5, .5],
                   "sources": [0, 1, 2]},
          "status": [1, 2, 0], "target_probs": [1, .1, .2], "path": [0], "generated": 5, "forwards": 2,
          "finished": "length"}
    return [prefill, s1, s2]


def test_accepted_lengths_and_histogram():
    traces = _run_traces()
    assert trace.accepted_lengths(traces) == [2, 0]
    fig = charts.acceptance_histogram(traces)
    assert list(fig.data[0].x) == [0, 1, 2] and list(fig.data[0].y) == [1, 0, 1]
    assert "mean 1.00" in fig.layout.title.text and "τ" not in fig.layout.title.text  # one τ per screen


def test_per_depth_acceptance_rates():
    rows = trace.depth_acceptance(_run_traces())
    assert rows == [{"depth": 1, "reached": 2, "accepted": 1, "rate": 0.5},
                    {"depth": 2, "reached": 1, "accepted": 1, "rate": 1.0},
                    {"depth": 3, "reached": 1, "accepted": 0, "rate": 0.0}]
    fig = charts.depth_acceptance_chart(_run_traces())
    assert list(fig.data[0].y) == [0.5, 1.0, 0.0] and list(fig.data[0].text) == ["1/2", "1/1", "0/1"]


def test_summary_and_time_split():
    s = trace.run_summary(_run_traces(), decode_s=0.1)
    assert s["tokens"] == 5 and s["forwards"] == 2 and s["tau"] == 2.0
    assert s["prefill_ms"] == 30.0 and s["draft_ms"] == 7.0 and s["verify_ms"] == 30.0
    assert s["other_ms"] == pytest.approx(100 - 67) and s["tokens_per_s"] == pytest.approx(50)
    fig = charts.time_split_chart({"fasteagle": s, "vanilla": trace.run_summary(_run_traces())})
    assert [t.name for t in fig.data] == ["prefill", "draft", "verify", "other"]
    assert fig.layout.barmode == "stack"
    assert sum(t.x[0] for t in fig.data) == pytest.approx(100)
    assert trace.run_summary([])["tokens"] == 0


# -- trace files ------------------------------------------------------------------------------------
def test_run_file_roundtrip_and_rejections():
    traces = _run_traces()
    run_ = trace_io.make_run_file({"method": "lookup"}, {"speculative": {"traces": traces, "spans": []}},
                                  {7: "The", 8: " cat"})
    back = trace_io.parse_run_file(trace_io.dumps(run_).encode())
    assert back["sides"]["speculative"]["traces"] == json.loads(json.dumps(traces))
    assert back["token_labels"] == {7: "The", 8: " cat"}
    bad = [b"\xff\xfe", b"{not json", b"[]", json.dumps({"format": "x"}).encode(),
           json.dumps(run_ | {"version": 99}).encode(),
           json.dumps(run_ | {"sides": {}}).encode(),
           json.dumps(run_ | {"sides": {"speculative": {"traces": [{"step": 0}]}}}).encode()]
    broken = json.loads(json.dumps(run_))
    broken["sides"]["speculative"]["traces"][1]["path"] = [0, 99]
    bad.append(json.dumps(broken).encode())
    broken = json.loads(json.dumps(run_))
    broken["sides"]["speculative"]["traces"][1]["tree"]["parents"][2] = 5
    bad.append(json.dumps(broken).encode())
    for data in bad:
        with pytest.raises(trace_io.TraceFileError) as err:
            trace_io.parse_run_file(data)
        assert "\n" not in str(err.value)


def test_hovering_the_node_before_the_bonus_shows_that_node():
    """Every hoverable point of the figure is a node with a tooltip: nothing hoverable (the bonus
    line's start) sits on the accepted path's last node with an empty tooltip."""
    step = backbone_step()
    fig = tree_figure(step, decode)
    last = step["path"][-1]
    owner = [t for t in fig.data if t.name == VERDICTS[ACCEPTED]][0]
    k = [int(c[0]) for c in owner.customdata].index(last)
    at = (owner.x[k], owner.y[k])
    on_it = [t for t in fig.data if t.hoverinfo != "skip" and t.x is not None
             and any((x, y) == at for x, y in zip(t.x, t.y))]
    assert [t.name for t in on_it] == [VERDICTS[ACCEPTED]]
    for t in fig.data:  # every hoverable point has a non-empty tooltip
        if t.hoverinfo != "skip" and t.customdata is not None:
            assert all(str(c[0]) != "" for c in t.customdata), t.name


def test_nodes_of_the_lookup_drafter_are_drawn_as_lookup_nodes():
    """The plain lookup method's nodes came only from prompt lookup: diamonds, "prompt lookup" on hover."""
    import torch

    from fasteagle.lookup import LookupDrafter

    d = LookupDrafter()
    d.extend(torch.tensor([5, 6, 7, 8, 5, 6]), None, 7)
    tree = d.draft(7).to_dict()
    n = len(tree["tokens"])
    assert n > 2
    step = {"step": 1, "tokens": [tree["tokens"][1]], "token_depths": [1], "tree": tree,
            "status": [ACCEPTED, ACCEPTED] + [REJECTED] * (n - 2), "path": [0, 1], "target_probs": [1.0] * n}
    fig = tree_figure(step, decode)
    assert LOOKUP_NAME in _node_traces(fig)
    for t in fig.data:
        if t.name in VERDICTS.values() and t.customdata is not None:
            for c, symbol in zip(t.customdata, t.marker.symbol):
                assert (symbol == LOOKUP_SYMBOL) == (int(c[0]) != 0), (t.name, c)
                assert (c[5] == LOOKUP_NAME) == (int(c[0]) != 0), (t.name, c)


def test_the_landing_step_is_the_first_with_the_longest_accepted_path():
    steps = [{"step": 0, "tokens": [5]}, {"step": 1, "path": [0, 1], "tokens": [1, 2]},
             {"step": 2, "path": [0, 1, 2, 3], "tokens": [1, 2, 3, 4]}, {"step": 3, "path": [0, 4, 5, 6]},
             {"step": 4, "path": [0], "tokens": [9]}]
    assert viz.landing_step(steps) == 2
    assert viz.landing_step([{"step": 0, "tokens": [5]}]) == 0  # only the prefill: itself
    assert viz.landing_step([{"step": 0}, {"step": 1, "path": [0]}, {"step": 2, "path": [0]}]) == 1


def test_the_race_strip_counts_target_forwards_both_ways():
    spec = _run_traces()  # 5 tokens in 2 forwards
    van = [{"step": i, "tokens": [7], "generated": i + 1, "forwards": i} for i in range(5)]  # 5 tokens, 4 forwards
    out = viz.race_html(spec, van, 0.1, 0.4, method="FastEagle <x>")
    text = re.sub(r"<[^>]+>", "", out)
    assert "2 vs 4 target forwards: 2.00× fewer" in text
    assert "τ 2.00" in text and "wall-clock speed-up 4.00×" in text  # 50 vs 12.5 tokens/s
    assert "steady number" in text and "this machine" in text
    assert "FastEagle &lt;x&gt;" in out and 'data-forwards="2"' in out
    assert "width:50.0%" in out and "width:100.0%" in out
    alone = re.sub(r"<[^>]+>", "", viz.race_html(spec, None, 0.1))
    assert "2 target forwards for 5 tokens" in alone and "no vanilla" in alone


# -- playback at measured speeds --------------------------------------------------------------------
def _sides() -> dict:
    """A speculative run of _run_traces (steps end at 0.03, 0.05, 0.06 s) and a vanilla one of 5 tokens."""
    spec = _run_traces()
    van = [{"step": i, "tokens": [7 + i], "token_depths": [0], "draft_ms": 0.0, "verify_ms": 10.0,
            "generated": i + 1, "forwards": i} for i in range(5)]
    return {"speculative": {"traces": spec, "elapsed": [0.03, 0.05, 0.06],
                            "spans": tokens.spans_to_json(viz.token_spans(spec, decode))},
            "vanilla": {"traces": van, "elapsed": [0.01, 0.02, 0.035, 0.05, 0.07],
                        "spans": tokens.spans_to_json(viz.token_spans(van, decode))}}


def _play_tokens(html: str) -> list[list[tuple[int, int, str]]]:
    """Per pane, its tokens as (reveal ms, depth, text)."""
    panes = html.split('<div class="fe-play-side"')[1:]
    pat = r'<span class="fe-ptok" data-t="(\d+)" data-n="\d+" data-depth="(\d+)"[^>]*>(.*?)</span>'
    return [[(int(t), int(d), x) for t, d, x in re.findall(pat, p, re.S)] for p in panes]


def test_playback_shows_each_token_when_its_step_ended():
    sides = _sides()
    html = viz.playback_html(sides, "FastEagle")
    spec, van = _play_tokens(html)
    # the speculative reply comes in bursts: every token of a step at the end of that step
    assert spec == [(30, 0, "The"), (50, 1, " cat"), (50, 2, " sat"), (50, 0, " the"), (60, 0, " dog")]
    # vanilla's, token by token at its own measured times
    assert [t for t, _, _ in van] == [10, 20, 35, 50, 70] and {d for _, d, _ in van} == {0}
    assert "".join(x for *_, x in van) == "".join(s["text"] for s in sides["vanilla"]["spans"])
    assert 'data-total="70"' in html and "FastEagle" in html and "fe-play-replay" in html
    assert html.count('<div class="fe-play-side"') == 2 and 'data-end="60"' in html and 'data-end="70"' in html


def test_playback_without_measured_times_uses_the_step_timings():
    sides = _sides()
    del sides["vanilla"]
    sides["speculative"]["elapsed"] = [0.5]  # not one per step: not this run's
    (spec,) = _play_tokens(viz.playback_html(sides))
    # the steps' own draft + verify times, summed: 31 ms, then 24 more, then 12 more
    assert sorted({t for t, _, _ in spec}) == [31, 55, 67]
    empty = viz.playback_html({})
    assert "fe-play-empty" in empty and "data-total" not in empty


# -- presentation mode and narrow screens -----------------------------------------------------------
def test_titles_wrap_to_fit_a_phone():
    from viz.tree import LARGE, TITLE_CHARS, wrap

    assert wrap(["ab", "cd", "efgh"], 7) == "ab · cd<br>efgh"
    assert wrap(["a-very-long-part", "x"], 5) == "a-very-long-part<br>x"
    step = backbone_step()
    for style in (viz.NORMAL, LARGE):
        fig = tree_figure(step, decode, style=style)
        lines = fig.layout.title.text.split("<br>")
        assert all(len(line) <= style.title_chars for line in lines), lines
        head = ["step 3: 7 drafted, 2 accepted + 1 bonus"] if style == viz.NORMAL else \
            ["step 3: 7 drafted", "2 accepted + 1 bonus"]  # large text: a line break for the comma
        assert lines == [*head, "draft 4 ms · verify 20 ms"]
    for fig in (charts.acceptance_histogram(_run_traces()), charts.depth_acceptance_chart(_run_traces()),
                charts.time_split_chart({"a": trace.run_summary(_run_traces())})):
        assert all(len(line) <= TITLE_CHARS for line in fig.layout.title.text.split("<br>")), fig.layout.title.text


def test_the_large_style_has_bigger_text_and_keeps_labels_apart():
    from viz.tree import LARGE

    step = backbone_step()
    small, big = tree_figure(step, decode), tree_figure(step, decode, style=LARGE)
    for fig, style in ((small, viz.NORMAL), (big, LARGE)):
        assert row_spacing_px(fig) >= style.label_height_px + style.marker_px
        assert fig.layout.height == viz.tree_height(step, style)
        assert fig.layout.meta["plot_px"] == fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    label = [_node_traces(f)[VERDICTS[ACCEPTED]].textfont.size for f in (small, big)]
    assert label[1] > label[0] and big.layout.legend.font.size > small.layout.legend.font.size
    assert big.layout.title.font.size > small.layout.title.font.size


def test_presentation_colours_are_distinct_and_readable():
    def rgb(c):
        return [int(c[i:i + 2], 16) for i in (1, 3, 5)]

    def closest(colors):
        return min(sum((a - b) ** 2 for a, b in zip(rgb(x), rgb(y))) ** 0.5
                   for i, x in enumerate(colors) for y in colors[i + 1:])

    present = tokens.PRESENT_COLORS
    assert closest(present) > 2 * closest([tokens.BONUS_COLOR, *tokens.DEPTH_COLORS])  # hues, not shades
    assert all(tokens.contrast(c, tokens.readable_text(c)) >= 4.5 for c in present)  # WCAG AA text
    css = viz.present_css()
    for depth, color in enumerate(present):
        assert f'.fe-tok[data-depth="{depth}"]' in css and f"background:{color}" in css
    assert 'data-depth="3" style' in tokens.legend_html()  # legend chips carry their depth too


def test_the_glyph_note_names_every_whitespace_glyph():
    note = viz.glyph_note()
    for glyph in ("␣", "↵", "⇥", "∅", "…"):
        assert glyph in note
    assert viz.token_label(" \n\t") == "␣↵⇥" and viz.token_label("") == "∅"  # what the note explains


def test_per_depth_acceptance_of_several_methods():
    other = [_run_traces()[0], backbone_step() | {"generated": 4, "forwards": 1}]
    fig = charts.depth_acceptance_lines({"A": _run_traces(), "B": other})
    assert [t.name for t in fig.data] == ["A", "B"]
    for t, traces in zip(fig.data, (_run_traces(), other)):
        rows = trace.depth_acceptance(traces)
        assert list(t.x) == [r["depth"] for r in rows] and list(t.y) == [r["rate"] for r in rows]
    assert fig.data[0].line.color != fig.data[1].line.color


def test_speedup_by_batch_size_is_one_line_per_drafting_method():
    def row(tps: float, tau: float | None = None) -> dict:
        return {"tokens_per_s": tps} | ({"tau": tau} if tau else {})

    doc = {"device": "CPU", "batches": {}}
    for b, (van, fe) in {"1": (10.0, 15.0), "8": (80.0, 60.0)}.items():
        r = {"vanilla": row(van), "fasteagle": row(fe, 1.7)}
        for x in r.values():
            x["speedup_vs_vanilla"] = x["tokens_per_s"] / van
        doc["batches"][b] = {"methods": r}
    fig = charts.batch_speedup_chart(doc)
    assert [t.name for t in fig.data] == ["fasteagle"]  # vanilla is the dotted line at 1
    assert list(fig.data[0].x) == [1, 8] and list(fig.data[0].y) == [1.5, 0.75]


def test_the_app_draws_the_committed_batch_sweep():
    import json

    from fasteagle.app.text import BATCH_RESULT
    from tests.test_repo import ROOT

    doc = json.loads((ROOT / BATCH_RESULT).read_text())
    fig = charts.batch_speedup_chart(doc)
    assert {t.name for t in fig.data} == set(doc["batches"]["1"]["methods"]) - {"vanilla"}

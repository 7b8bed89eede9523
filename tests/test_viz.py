"""The pure trace -> picture functions in `viz` other than the tree (tests/test_viz_tree.py): token spans,
summary charts, trace files, playback and presentation mode. No model needed except the tiny one."""

from __future__ import annotations

import json
import re

import pytest

import viz
from fasteagle import trace
from fasteagle.generate import chat_prompt_ids, run
from fasteagle.lookup import LookupDrafter
from tests.vizdata import backbone_step, decode, node_traces
from viz import charts, tokens, trace_io
from viz.tree import (
    ACCEPTED,
    ACCEPTED_PATH,
    LABEL_HEIGHT_PX,
    LOOKUP_NAME,
    LOOKUP_SYMBOL,
    MARKER_PX,
    REJECTED,
    VERDICTS,
    row_spacing_px,
    tree_figure,
)


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
        path = node_traces(fig)[ACCEPTED_PATH]
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
    assert LOOKUP_NAME in node_traces(fig)
    for t in fig.data:
        if t.name in VERDICTS.values() and t.customdata is not None:
            for c, symbol in zip(t.customdata, t.marker.symbol):
                assert symbol.startswith(LOOKUP_SYMBOL) == (int(c[0]) != 0), (t.name, c)
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
    assert "* 0.500)" in out and "* 1.000)" in out  # each bar's share of the longest
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


def test_playback_heads_say_what_the_stats_line_says():
    """Each pane's head gives its side's tokens as generated (the stop token, which shows no span,
    included) and its decode's own time, the numbers of the stats line and the summary above it."""
    sides = _sides()
    sides["speculative"]["spans"] = sides["speculative"]["spans"][:-1]  # as a stop token: no span
    sides["speculative"]["summary"] = {"wall_s": 0.08}  # the whole decode, past its last step
    spec, van = viz.playback_html(sides).split('<div class="fe-play-side"')[1:]
    assert "5 tokens in 0.08 s" in spec and "5 tokens in 0.07 s" in van  # vanilla: its last step's time


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
    label = [node_traces(f)[VERDICTS[ACCEPTED]].textfont.size for f in (small, big)]
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
    # a line that coincides with a later one shows around it: wider, its own marker
    assert fig.data[0].line.width > fig.data[1].line.width and fig.data[0].marker.size > fig.data[1].marker.size
    assert fig.data[0].marker.symbol != fig.data[1].marker.symbol


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

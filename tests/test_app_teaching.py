"""Teaching in the app: every method on one prompt, the playback, a click on a reply token, presentation
mode and the paper-size tree."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import gradio as gr

import app
import viz
from fasteagle.app import screen
from fasteagle.app import text as app_text
from tests.appclient import call_run, check_complete_run, kept, plot_data, reply_text, served


def _table(markdown: str) -> dict[str, list[str]]:
    """A Markdown table's rows by their first cell (the header and rule left out)."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in markdown.splitlines() if line.startswith("|")]
    return {r[0]: r[1:] for r in rows[2:]}


def test_all_methods_on_one_prompt(tiny, drafters, warnings, monkeypatch):
    """/compare decodes the prompt with vanilla and every method, with the run's settings: one table
    whose numbers are trace.run_summary's, and one per-depth acceptance line per method."""
    from fasteagle import trace

    demo = app.build_app(tiny, drafter_dir=drafters[0], eagle3_dir=drafters[1])
    prompt, settings = "w9 w10 w11 w9 w10 w11 w9 w10", (0.0, 10, "", 6, 0, "product")
    with served(demo) as client:
        status, table, plot = client.predict(prompt, *settings, api_name="/compare")
        rows = _table(table)
        assert list(rows) == ["vanilla", "FastEagle", "EAGLE-3", "FastEagle + lookup", "lookup"]
        assert "5 decodes" in status and "greedy" in status and "node budget 6" in status
        assert "tree shape: side branches continue" in status  # the shape as the settings name it
        lines = {t["name"]: t for t in plot_data(plot)}
        assert list(lines) == list(rows)[1:]  # vanilla accepts no drafts: no line
        for name, (forwards, tau, tps, speed, same) in rows.items():
            engine = app.ENGINE
            req = engine.request(prompt, "lookup" if name == "vanilla" else name, *settings)
            drafter = None if name == "vanilla" else engine.drafter(req)
            traces = [tr for tr, _ in engine.steps(engine.prompt_ids(req), drafter, req)]
            summary = trace.run_summary(traces)
            assert (int(forwards), tau) == (summary["forwards"], f"{summary['tau']:.2f}"), name
            assert float(tps) > 0 and speed.endswith("×")
            assert same == ("–" if name == "vanilla" else "✔ yes")  # greedy: lossless
            if name != "vanilla":
                assert lines[name]["y"] == [r["rate"] for r in trace.depth_acceptance(traces) if r["rate"] is not None]
        # a refused prompt: a warning, and the last comparison stays
        assert all(kept(v) for v in client.predict("  ", *settings, api_name="/compare"))
        assert "empty" in warnings[-1]
        # a failure on the way: the line says where, the table and the chart stay
        real = app.Engine.steps

        def failing(self, ids, drafter, req):
            if drafter is not None and req.method.label == "EAGLE-3":
                raise RuntimeError("boom")
            return real(self, ids, drafter, req)

        monkeypatch.setattr(app.Engine, "steps", failing)
        status, table2, plot2 = client.predict(prompt, *settings, api_name="/compare")
        assert "failed at EAGLE-3: boom" in status and kept(table2) and kept(plot2)
        assert warnings[-1] == "the comparison failed: boom"


def test_the_playback_follows_the_run_on_screen(tiny_app):
    with served(tiny_app) as client:
        res = call_run(client, "w9 w10 w11 w9 w10 w11 w9 w10", max_new=12)
    run = viz.parse_run_file(Path(res["download"]).read_bytes())
    h = app.Handlers.__new__(app.Handlers)
    out = h.on_playback(run)
    assert out == viz.playback_html(run["sides"], "lookup")
    assert out.count('class="fe-play-side"') == 2 and 'data-total="' in out
    texts = re.findall(r'<span class="fe-ptok"[^>]*>(.*?)</span>', out, re.S)
    assert html.unescape("".join(texts)) == reply_text(res["spec_reply"]) + reply_text(res["van_reply"])
    for odd in (None, {"sides": {"speculative": {"traces": 5}}}):
        assert "fe-play-empty" in h.on_playback(odd)


def test_the_page_names_every_tree_shape():
    from fasteagle.app.text import TREE_SHAPE_LABELS
    from fasteagle.tree import TREE_SHAPES

    assert set(TREE_SHAPE_LABELS) == set(TREE_SHAPES)


def test_a_click_on_a_reply_token_shows_its_step():
    h = app.Handlers.__new__(app.Handlers)
    run = {"sides": {"speculative": {"traces": [{"step": i} for i in range(5)]}}}
    assert h.on_token(1, run, gr.EventData(None, {"step": 3})) == 3
    assert kept(h.on_token(3, run, gr.EventData(None, {"step": 3})))  # already there
    for odd in ({"step": 9}, {}, None, {"step": "x"}):
        assert kept(h.on_token(1, run, gr.EventData(None, odd)))
    assert kept(h.on_token(1, None, gr.EventData(None, {"step": 3})))  # no run on screen
    # the speculative reply says so on hover, the vanilla one (no tree) does not
    res_html = viz.spans_html([viz.Span("a", 1, 2, [5])], clickable=True)
    assert "click: the tree of this step" in res_html
    assert "click" not in viz.spans_html([viz.Span("a", 0, 2, [5])], legend=False)


def test_presentation_mode_redraws_the_tree_large(tiny_app):
    with served(tiny_app) as client:
        res = call_run(client, "w9 w10 w11 w9 w10 w11 w9 w10", max_new=12)
    run = viz.parse_run_file(Path(res["download"]).read_bytes())
    h = app.Handlers(app.ENGINE, None, False)
    on, fig, side = h.on_present(True, 1, run)
    assert on is True and side.visible is True
    label = next(t for t in fig.data if t.name == "accepted").textfont.size
    assert label == viz.LARGE.label_px and fig.layout.title.font.size == viz.LARGE.title_px
    assert fig.layout.height == screen._run_tree_height(run, viz.LARGE)
    off, fig, side = h.on_present(False, 1, run)
    assert off is False and side.visible is False and fig.layout.title.font.size == viz.NORMAL.title_px
    assert kept(h.on_present(True, 1, None)[1])  # nothing to redraw


def test_the_paper_size_tree_sets_its_budget_and_says_what_it_costs(tiny, drafters):
    app.build_app(tiny, drafter_dir=drafters[0], eagle3_dir=drafters[1])
    h = app.Handlers(app.ENGINE, None, False)
    budget, note = h.on_tree_size("paper", "FastEagle")
    assert budget == app.PAPER_BUDGET == 60
    assert "slower on this machine" in note and "forward" in note and "GPU" in note
    assert h.on_tree_size("fast", "FastEagle") == (app.default_budget("fasteagle", False), "")
    assert h.on_tree_size("fast", "EAGLE-3") == (app.default_budget("eagle3", False), "")
    assert "Lookup drafts no tree" in h.on_tree_size("paper", "lookup")[1]
    # a new method keeps the chosen size
    assert h.on_method("EAGLE-3", "paper") == 60
    assert h.on_method("EAGLE-3", "fast") == app.default_budget("eagle3", False)
    gpu = app_text.paper_tree_note(app.ENGINE.method("FastEagle"), 128, on_gpu=True)
    assert "nearly free" in gpu and "slower" not in gpu


def test_a_published_eagle3_checkpoint_is_a_method_with_its_name(tiny, tmp_path):
    """An EAGLE-3 checkpoint in the EAGLE / SpecForge format, given as the FastEagle drafter (as a user of a
    GPU Space gives a hub id), is offered as EAGLE-3 under its own name, and draws trees."""

    from tests.test_eagle3_format import PUBLISHED, shrink, write_checkpoint

    raw = shrink(json.loads(PUBLISHED[0].read_text()), tiny) | {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    folder = write_checkpoint(tmp_path / "EAGLE3-tiny", raw)
    demo = app.build_app(tiny, drafter_dir=folder)
    labels = [m.label for m in app.ENGINE.available]
    assert "EAGLE-3 · EAGLE3-tiny" in labels and app.EQUAL_LABEL not in labels
    with served(demo) as client:
        run = check_complete_run(call_run(client, "w9 w10 w11 w12", method="EAGLE-3 · EAGLE3-tiny", max_new=8,
                                          tree_k="3", budget=6), 8)
        assert run["meta"]["method"] == "EAGLE-3 · EAGLE3-tiny"

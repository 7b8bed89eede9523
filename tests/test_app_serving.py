"""The app serving many pages at once (issue 55): the line at the one decoder tells each waiting page
its place, an example at its default settings replays from the on-disk cache without a turn, and a
run that others wait behind decodes only its speculative side, with vanilla's time shown as modelled.

No test here times anything: "never waits" is checked by holding the decoder for the whole test."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import app
import viz
from fasteagle.app import handlers as app_handlers
from fasteagle.app.examples import EXAMPLES
from fasteagle.app.handlers import Handlers
from fasteagle.app.turns import Turns
from fasteagle.methods import default_budget
from tests.appclient import OUT, call_run, check_complete_run, served

FRESH = "w9 w10 w11 w9 w10 w11 w9 w10"


def test_each_waiting_page_has_its_place_and_pages_go_before_background_work():
    turns = Turns()
    running = turns.join(10.0)
    assert turns.wait(running, 0.1) and turns.place(running).ahead == 0
    fill = turns.join(3.0, background=True)
    first, second = turns.join(4.0), turns.join(5.0)
    assert [turns.place(t).ahead for t in (first, second, fill)] == [1, 2, 3]  # pages before the cache's work
    assert turns.waiting() == 2  # the background ticket is nobody's page
    assert 10.0 + 4.0 >= turns.place(second).wait_s >= 4.0  # what is left of the running one, then `first`
    assert not turns.wait(first, 0.01)  # not its turn while `running` holds the decoder
    turns.leave(running)
    assert turns.wait(first, 0.1) and turns.place(second).ahead == 1
    turns.leave(second)  # a page that went away leaves the line
    assert turns.place(fill).ahead == 1
    turns.leave(first)
    assert turns.wait(fill, 0.1)
    turns.leave(fill)
    assert turns.idle()


def handlers_of(demo) -> Handlers:
    return next(f.fn.__self__ for f in demo.fns.values() if isinstance(getattr(f.fn, "__self__", None), Handlers))


def example_args(ex) -> tuple:
    """/run's inputs for an example at the page's defaults with the lookup method (the tiny app's only one)."""
    return ex.prompt, "lookup", ex.temperature, 64, "", default_budget("lookup", False), 0, "product"


@pytest.fixture
def cached_app(tiny, tmp_path):
    demo = app.build_app(tiny, drafter_dir=tmp_path / "none", eagle3_dir=tmp_path / "none", examples=tmp_path / "ex")
    h = handlers_of(demo)
    h.examples.filling.join(timeout=600)
    assert len(list((tmp_path / "ex").glob("*.json"))) == len(EXAMPLES)  # every example, the one method here
    return demo, h


def outputs_until(job, seen, timeout=120.0) -> dict:
    """The first streamed frame for which `seen(frame)` holds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for out in job.outputs():
            frame = dict(zip(OUT, out))
            if seen(frame):
                return frame
        time.sleep(0.05)
    raise AssertionError("no such frame")


def test_examples_replay_from_the_cache_while_a_decode_holds_the_decoder(cached_app):
    demo, h = cached_app
    held = h.turns.join(60.0)
    assert h.turns.wait(held, 1.0)
    try:
        with served(demo) as client:
            for ex in EXAMPLES:
                res = dict(zip(OUT, client.submit(*example_args(ex), api_name="/run").result(timeout=120)))
                assert "replayed from this machine's decode" in res["summary"]
                if ex.temperature == 0:
                    run = check_complete_run(res, 64)
                    assert run["meta"]["prompt"] == ex.prompt and "vanilla" in run["sides"]
            # a fresh prompt waits: its page says where it stands, and runs once the decoder is free
            job = client.submit(FRESH, "lookup", 0.0, 12, "4", 8, 0, "product", api_name="/run")
            frame = outputs_until(job, lambda f: 'data-queue="1"' in str(f["badge"]))
            assert "1 run before yours" in frame["badge"] and "about" in frame["badge"]
            h.turns.leave(held)
            check_complete_run(dict(zip(OUT, job.result(timeout=120))), 12)
            # a changed setting decodes afresh
            ex = EXAMPLES[0]
            res = call_run(client, ex.prompt, "lookup", max_new=12, tree_k="", budget=default_budget("lookup", False))
            assert "replayed" not in res["summary"]
            check_complete_run(res, 12)
    finally:
        h.turns.leave(held)


@pytest.mark.parametrize("precompute", [False, True])  # streamed, or decoded first (ZeroGPU) then animated
def test_a_run_others_wait_behind_skips_vanilla_and_says_its_time_is_modelled(tiny, tmp_path, precompute,
                                                                              monkeypatch):
    monkeypatch.setattr(app_handlers, "ANIMATE_S", 0.2)
    demo = app.build_app(tiny, drafter_dir=tmp_path / "none", eagle3_dir=tmp_path / "none", precompute=precompute)
    h = handlers_of(demo)
    held = h.turns.join(60.0)
    assert h.turns.wait(held, 1.0)
    behind = None
    try:
        with served(demo, timeout=60) as client:
            job = client.submit(FRESH, "lookup", 0.0, 12, "4", 8, 0, "product", api_name="/run")
            outputs_until(job, lambda f: 'data-queue="1"' in str(f["badge"]))
            behind = h.turns.join(5.0)  # another page waits behind it
            h.turns.leave(held)
            res = dict(zip(OUT, job.result(timeout=120)))
    finally:
        h.turns.leave(held)
        if behind is not None:
            h.turns.leave(behind)
    assert 'data-identical="skipped"' in res["badge"] and "modelled" in res["badge"]
    assert "modelled" in res["van_stats"] and "vanilla (modelled)" in res["summary"]
    run = viz.parse_run_file(Path(res["download"]).read_bytes())
    assert set(run["sides"]) == {"speculative"}
    van = run["meta"]["vanilla_modelled"]
    spec = run["sides"]["speculative"]["summary"]
    assert van["tokens"] == spec["tokens"] and van["forwards"] == spec["tokens"] - 1 and van["step_ms"] > 0
    race = h.on_race(json.loads(viz.trace_io.dumps(run)))
    assert 'data-modelled="true"' in race and "vanilla (modelled)" in race


def test_a_page_that_goes_away_leaves_the_line(tiny, tmp_path):
    """A closed tab must not hold a place (or, worse, the decoder) for good."""
    demo = app.build_app(tiny, drafter_dir=tmp_path / "none", eagle3_dir=tmp_path / "none")
    h = handlers_of(demo)
    held = h.turns.join(60.0)
    assert h.turns.wait(held, 1.0)
    try:
        with served(demo, timeout=60) as client:
            job = client.submit(FRESH, "lookup", 0.0, 12, "4", 8, 0, "product", api_name="/run")
            outputs_until(job, lambda f: 'data-queue="1"' in str(f["badge"]))
            assert h.turns.waiting() == 1
            job.cancel()
            end = time.monotonic() + 60
            while h.turns.waiting() and time.monotonic() < end:
                time.sleep(0.1)
            assert h.turns.waiting() == 0
    finally:
        h.turns.leave(held)


def test_the_load_test_stays_on_this_machine_and_reports_what_pages_saw():
    from fasteagle.app import loadtest
    from fasteagle.errors import FastEagleError

    with pytest.raises(FastEagleError, match="this machine"):
        loadtest.parse(["--url", "http://example.com:7860/"])
    with pytest.raises(FastEagleError, match="clients"):
        loadtest.parse(["--clients", str(loadtest.MAX_CLIENTS + 1)])
    from fasteagle.app.text import summary_markdown

    side = {k: 1.0 for k in ("tokens", "forwards", "tau", "wall_s", "prefill_ms", "draft_ms", "verify_ms", "other_ms")}
    table = summary_markdown("FastEagle", side | {"tokens_per_s": 25.0}, side | {"tokens_per_s": 20.0})
    assert loadtest.speedup_of(table) == 1.25 and loadtest.speedup_of("no run") is None
    assert not loadtest.has_tree([None] * 5 + [{"type": "plotly", "plot": json.dumps({"data": []})}])
    assert loadtest.has_tree([None] * 5 + [{"type": "plotly", "plot": json.dumps({"data": [{"x": [0]}]})}])
    pages = ([{"kind": "example", "ok": True, "first_tree_s": t, "vanilla": "decoded"} for t in (0.2, 0.9)]
             + [{"kind": "fresh", "ok": True, "last_frame_s": float(s), "vanilla": "skipped"} for s in range(1, 11)]
             + [{"kind": "fresh", "ok": False, "last_frame_s": None, "vanilla": None}])
    s = loadtest.summarize(pages)
    assert (s["clients"], s["failures"], s["example_first_tree_s_max"]) == (13, 1, 0.9)
    assert s["fresh_last_frame_s_median"] == 5.5 and 9 < s["fresh_last_frame_s_p90"] <= 10
    assert s["fresh_vanilla_skipped"] == 10

"""The app's teaching parts without a browser: the trace's version-2 fields (each drafter forward's
ms, the cascade's layers, how a token was made, what sampling drew), the stage's data, the palette's
colour-blind safety, the tour's cards, the first screen's recorded run, and background work that
waits for pages."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

import app
import viz
from fasteagle import trace
from fasteagle.app import examples, tour
from fasteagle.app.turns import Turns
from fasteagle.drafter import CascadedDrafter
from fasteagle.eagle3 import AutoregressiveDrafter
from fasteagle.generate import chat_prompt_ids, generate
from fasteagle.hybrid import WithLookup
from fasteagle.lookup import LookupDrafter
from fasteagle.verify import DIST_TOP, SamplingParams
from viz import palette, stepper

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "one two three four one two three four one two"


def _decode(target, drafter, temperature=0.0, max_new=12, seed=0):
    ids = chat_prompt_ids(target, PROMPT)
    return [t.to_dict() for t in generate(target, ids, drafter=drafter, max_new_tokens=max_new,
                                          sampling=SamplingParams(temperature), seed=seed)]


KEYS = {"cascade": "fasteagle", "eagle3": "eagle3", "lookup": "lookup", "joined": "fasteagle+lookup"}


def test_each_drafter_records_its_forwards_and_the_cascade_its_layers(tiny, drafters):
    fe_dir, e3_dir = drafters
    cascade = CascadedDrafter.load(fe_dir, tiny.model)
    cascade.tree_budget = 8
    eagle = AutoregressiveDrafter.load(e3_dir, tiny.model)
    eagle.tree_budget = 8
    runs = {"cascade": _decode(tiny, cascade), "eagle3": _decode(tiny, eagle),
            "lookup": _decode(tiny, LookupDrafter()), "joined": _decode(tiny, WithLookup(cascade))}
    for name, steps in runs.items():
        for tr in steps[1:]:
            passes = tr["draft_passes"]
            assert all(ms >= 0 for ms in passes)
            if name in ("cascade", "joined"):  # one pass readies every depth
                assert len(passes) == 1
                assert len(tr["layer_top"]) == cascade.draft_depths
                # every candidate the tree was built from, best first (the what-if model rebuilds from them)
                assert all(len(d) == cascade.max_k and all(a[1] >= b[1] for a, b in zip(d, d[1:]))
                           for d in tr["layer_top"])
            elif name == "eagle3":  # one pass per depth: the one `extend` ran, then depths 2..N
                assert len(passes) == eagle.draft_depths and tr["layer_top"] == []
            else:  # prompt lookup matches a string: no forward
                assert passes == [] and tr["layer_top"] == []
            assert trace.token_kinds(tr) == ["draft"] * (len(tr["tokens"]) - 1) + ["bonus"] or tr["finished"]
        data = stepper.stage_data({"meta": {"method_key": KEYS[name]},
                                   "sides": {"speculative": {"traces": steps}}}, lambda ids: f"<{ids[0]}>")
        assert data["kind"] == {"cascade": "cascade", "joined": "cascade", "eagle3": "eagle3",
                                "lookup": "lookup"}[name]
        assert len(data["steps"]) == len(steps) and "tok" not in data["steps"][0]  # the prefill has no tree
        one = data["steps"][1]
        assert len(one["tok"]) == len(steps[1]["tree"]["tokens"]) and one["path"] == steps[1]["path"]


def test_sampling_records_each_draw_and_what_the_token_came_from(tiny):
    """At temperature 0.7 the trace keeps the uniform draw of every judged node, the target's
    distribution at every reached node (top 32 and the rest's mass), and whether the step's last
    token was the bonus or drawn from the residual after rejections; 64 tokens stay far under 1 MB."""
    steps = []
    for seed in range(6):
        steps += _decode(tiny, LookupDrafter(), temperature=0.7, max_new=32, seed=seed)[1:]
    kinds = [k for tr in steps for k in trace.token_kinds(tr)]
    assert "resampled" in kinds and "bonus" in kinds
    for tr in steps:
        n = len(tr["tree"]["tokens"])
        assert len(tr["draws"]) == n
        judged = [i for i, s in enumerate(tr["status"]) if s != trace.NEVER_REACHED and i > 0]
        assert all(0.0 <= tr["draws"][i] < 1.0 for i in judged)
        assert all(tr["draws"][i] == -1.0 for i in range(n) if i not in judged)
        for _node, ids, probs, rest in tr["dists"]:
            assert len(ids) == len(probs) == min(DIST_TOP, tiny.model.config.vocab_size)
            assert abs(sum(probs) + rest - 1.0) < 1e-4 and probs == sorted(probs, reverse=True)
        # the first child tried at a reached node is judged against the target's own p: accepted iff u < p
        for node, _, _, _ in tr["dists"]:
            kids = [c for c in range(1, n) if tr["tree"]["parents"][c] == node]
            if kids and tr["draws"][kids[0]] >= 0:  # (-1: a stop token cut the path above it)
                first = kids[0]
                assert (tr["status"][first] == trace.ACCEPTED) == (tr["draws"][first] < tr["target_probs"][first])
        if tr["bonus_kind"] == "resampled":
            last = tr["path"][-1]
            assert any(tr["tree"]["parents"][c] == last for c in range(n))  # it rejected a child first
    size = len(json.dumps(_decode(tiny, LookupDrafter(), temperature=0.7, max_new=64)))
    assert size < 1 << 20, size


def test_greedy_traces_keep_no_draws(tiny):
    tr = _decode(tiny, LookupDrafter())[1]
    assert tr["draws"] == [] and tr["dists"] == [] and tr["bonus_kind"] == "bonus"


def _run_file(steps, version=trace.VERSION) -> dict:
    run = trace.make_run_file({"method": "lookup"}, {"speculative": {"traces": steps, "spans": []}}, {})
    run["version"] = version
    return run


def test_a_version_1_file_still_replays_and_bad_new_fields_are_one_line_errors(tiny):
    steps = _decode(tiny, LookupDrafter())
    old = [{k: v for k, v in tr.items() if k not in ("draft_passes", "layer_top", "bonus_kind", "draws", "dists")}
           for tr in steps]
    parsed = viz.parse_run_file(json.dumps(_run_file(old, version=1)))
    data = stepper.stage_data(parsed, lambda ids: str(ids[0]))
    assert "passes" not in data["steps"][1]  # the stage says the draft's total only
    sampled = viz.parse_run_file(json.dumps(_run_file(old, version=1) | {"meta": {"temperature": 0.7}}))
    data = stepper.stage_data(sampled, lambda ids: str(ids[0]))
    assert data["sampled"] and not any("dists" in st for st in data["steps"])  # the inspector says it is off
    assert viz.parse_run_file(json.dumps(_run_file(steps)))["version"] == 2
    for field, value in (("draft_passes", ["x"]), ("layer_top", [[[1]]]), ("bonus_kind", "extra"),
                         ("draws", [0.5] * 99), ("dists", [[0, [1], [0.5, 0.2], 0.3]])):
        bad = json.loads(json.dumps(steps))
        bad[1][field] = value
        with pytest.raises(viz.TraceFileError) as err:
            viz.parse_run_file(json.dumps(_run_file(bad)))
        assert field in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(viz.TraceFileError, match="version 3"):
        viz.parse_run_file(json.dumps(_run_file(steps, version=3)))


def test_the_stage_html_carries_its_data_and_a_placeholder_without_a_run(tiny):
    steps = _decode(tiny, LookupDrafter())
    run = _run_file(steps)
    html = viz.stage_html(run, lambda ids: f"tok<{ids[0]}>")
    data = json.loads(__import__("html").unescape(re.search(r'data-run="([^"]*)"', html).group(1)))
    assert data["steps"][1]["tok"][0].startswith("tok<") and [p for p in stepper.PHASES] == [
        "draft", "verify", "walk", "emit", "bonus"]
    assert all(f'data-phase="{i}"' in html for i in range(5)) and 'class="fe-stage-steps"' in html
    # the step it opens on before the page's slider exists: the replay's landing step, never the prefill
    at = int(re.search(r'data-at="(\d+)"', html).group(1))
    assert at == viz.landing_step(run["sides"]["speculative"]["traces"]) > 0
    assert "fe-stage-empty" in viz.stage_html(None) and "fe-stage-empty" in viz.stage_html({"sides": {}})


def test_the_verdict_colours_are_colour_blind_safe_and_never_alone():
    """Okabe–Ito hues (and a grey), pairwise CIEDE2000 distance above 10 seen normally and under
    simulated deutan, protan and tritan vision; every verdict also has a mark and a marker variant.
    The check itself fails a red-green palette."""
    colors = [*palette.VERDICT_COLORS.values(), palette.BONUS_COLOR]  # what one tree shows side by side
    assert set(colors + [palette.RESAMPLED_COLOR]) - {palette.NEUTRAL} <= set(palette.OKABE_ITO.values())
    assert min(palette.cvd_distances(colors).values()) > 10
    # the star's two colours, which a step shows one at a time
    assert min(palette.cvd_distances([palette.BONUS_COLOR, palette.RESAMPLED_COLOR]).values()) > 10
    assert min(palette.cvd_distances(["#2ca02c", "#d62728", "#b4b4b4"]).values()) < 10  # the old palette fails
    assert len(set(palette.MARKS.values())) == len(palette.MARKS) == 3
    assert len(set(palette.SYMBOL_SUFFIX.values())) == 3
    # the formula: Sharma, Wu & Dalal's (2005) published test pairs
    for a, b, want in (((50, 2.6772, -79.7751), (50, 0, -82.7485), 2.0425),
                       ((50, 2.5, 0), (50, 0, -2.5), 4.3065),
                       ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
                       ((2.0776, 0.0795, -1.135), (0.9033, -0.0636, -0.5514), 0.9082)):
        assert palette.ciede2000(a, b) == pytest.approx(want, abs=1e-4)


def test_the_tour_has_five_to_eight_cards_on_parts_of_the_page(tiny_app):
    cards = tour.CARDS
    assert 5 <= len(cards) <= 8
    assert sum(c.predict for c in cards) >= 1 and cards[-1].focus and cards[-1].target == "#prompt"
    ids = {getattr(b, "elem_id", None) for b in tiny_app.blocks.values()}
    for c in cards:
        assert c.target.split()[0].lstrip("#") in ids, c.target
    js = app.page_js()
    assert "window.feTour" in js and all(c.title in js for c in cards)


def test_the_first_screen_is_a_finished_run_without_a_decode(smollm, tmp_path, monkeypatch):
    """With no example cached the page opens on the shipped recorded run, labelled with the machine
    that made it; the recorded run is the default target's, at the page's defaults."""
    run = viz.parse_run_file(examples.FIRST_RUN.read_bytes())
    meta = run["meta"]
    assert meta["recorded"] and meta["machine"] and meta["target"] == smollm.name
    assert meta["prompt"] == examples.EXAMPLES[0].prompt
    assert trace.reply_tokens(run["sides"]["speculative"]["traces"]) == trace.reply_tokens(
        run["sides"]["vanilla"]["traces"])
    assert "draft_passes" in run["sides"]["speculative"]["traces"][1]  # recorded in the current format
    demo = app.build_app(smollm, examples=None)
    handlers = next(f.fn.__self__ for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "on_first")
    calls = []
    monkeypatch.setattr(type(app.ENGINE), "decode_both", lambda *a, **k: calls.append(a))
    upd = handlers.on_first(False)
    prompt, stage = handlers.first_screen(app.ENGINE, None)
    assert prompt == meta["prompt"] and upd[handlers.ui.run_state]["meta"] == meta and "data-run" in stage
    assert "recorded run" in upd[handlers.ui.summary] and meta["machine"] in upd[handlers.ui.summary]
    assert not calls


def test_background_work_waits_for_pages():
    turns = Turns()
    assert turns.quiet(0.0)
    page = turns.join(1.0)
    assert not turns.quiet(0.0)
    assert turns.wait(page, 1.0)
    turns.leave(page)
    assert not turns.quiet(30.0) and turns.quiet(0.0)  # a page just decoded: not quiet for long yet
    bg = turns.join(1.0, background=True)
    assert turns.quiet(0.0)  # background work does not count
    turns.leave(bg)
    time.sleep(0.05)
    assert turns.quiet(0.04)


def test_a_sampled_cascade_run_on_ten_prompts_says_how_each_token_was_made(smollm):
    """The shipped cascade at temperature 0.7 on 10 held-out prompts, 64 tokens each: every emitted token
    is `draft`, `bonus` or `resampled` (and so says how it was made), `resampled` occurs, and each run's
    trace file (both decodes, every version-2 field, the candidate lists included) stays under 1 MB."""
    from fasteagle.methods import DEFAULT_DRAFTER

    rows = [json.loads(line) for line in (ROOT / "assets" / "prompts" / "mix_heldout.jsonl").read_text().splitlines()]
    prompts = [r["turns"][0] for r in rows[::len(rows) // 10]][:10]
    d = CascadedDrafter.load(DEFAULT_DRAFTER, smollm.model)
    d.tree_budget = 6
    kinds, sizes = [], []
    for seed, text in enumerate(prompts):
        ids = chat_prompt_ids(smollm, text)
        spec = [t.to_dict() for t in generate(smollm, ids, drafter=d, max_new_tokens=64,
                                              sampling=SamplingParams(0.7), seed=seed)]
        van = [t.to_dict() for t in generate(smollm, ids, max_new_tokens=64, sampling=SamplingParams(0.7), seed=seed)]
        for tr in spec[1:]:
            k = trace.token_kinds(tr)
            assert len(k) == len(tr["tokens"]) and set(k) <= {"draft", "bonus", "resampled"}
            kinds += k
        sides = {s: {"traces": t, "spans": [], "summary": trace.run_summary(t)}
                 for s, t in (("speculative", spec), ("vanilla", van))}
        run = trace.make_run_file({"method": "FastEagle"}, sides, {})
        sizes.append(len(json.dumps(run)))
    assert kinds.count("resampled") > 0 and kinds.count("draft") > 0
    assert max(sizes) < 1 << 20, sizes

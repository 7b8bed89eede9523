"""The Gradio app end to end through its HTTP API (gradio_client), served in-process on a free port.

The tiny random target covers input checks, warnings and the decode-then-animate (ZeroGPU) path
in a few seconds; the integration test runs the real default model with FastEagle (a randomly
initialised drafter written to a temporary directory, so it does not depend on training) and the
lookup drafter.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import gradio as gr
import pytest
from gradio_client import handle_file

import app
import viz
from fasteagle.app import engine as app_engine
from fasteagle.app import handlers as app_handlers
from fasteagle.app import text as app_text
from tests.appclient import OUT, call_run, check_complete_run, kept, plot_data, reply_text, served, unchanged


# -- tiny target: fast ------------------------------------------------------------------------------
def test_bad_inputs_warn_and_the_app_keeps_working(tiny_app, warnings):
    with served(tiny_app) as client:
        assert "FastEagle" not in client.view_api(print_info=False, return_format="str")  # only lookup offered
        for prompt, k, fragment in (("", "4", "empty"), ("   ", "4", "empty"), ("w7 " * 2000, "4", "too long"),
                                    ("w7 w8", "4,x", "top-k"), ("w7 w8", "0", "top-k")):
            res = call_run(client, prompt, tree_k=k)
            assert all(kept(v) for v in res.values())
            assert fragment in warnings[-1], warnings
        for seed in (2**70, -1):
            assert all(kept(v) for v in call_run(client, "w7 w8", seed=seed).values())
            assert "seed" in warnings[-1], warnings
        # the tiny model has 512 positions: a too long context is refused before the screen changes
        res = call_run(client, "w7 " * 500, max_new=64)
        assert all(kept(v) for v in res.values())
        assert "context too long" in warnings[-1] and "512 positions" in warnings[-1], warnings
        res = call_run(client, "w9 w10 w11 w9 w10 w11 w9 w10", max_new=12)
        check_complete_run(res, 12)


def test_sampling_runs_and_the_badge_explains(tiny_app):
    with served(tiny_app) as client:
        res = call_run(client, "w9 w10 w11 w9 w10 w11", max_new=10, temperature=0.9, seed=3)
        assert "tokens/s" in res["van_stats"] and plot_data(res["tree"])
        # the badge says what the replies show: identical, or different as sampling allows (never "a bug")
        identical = reply_text(res["spec_reply"]) == reply_text(res["van_reply"])
        assert ('data-identical="true"' in res["badge"]) == identical, res["badge"]
        assert identical or "expected when sampling" in res["badge"], res["badge"]
        again = call_run(client, "w9 w10 w11 w9 w10 w11", max_new=10, temperature=0.9, seed=3)
        assert reply_text(again["spec_reply"]) == reply_text(res["spec_reply"])  # the seed fixes the sample
    # the tiny target is so peaked that both sides sample the same reply: the badges for replies that differ
    differ = app_text.badge_html([5, 6, 7], [5, 6, 8], greedy=False, dtype="float32")
    assert 'data-identical="false"' in differ and "from token 2 on" in differ and "expected when sampling" in differ
    bug = app_text.badge_html([5, 6, 7], [5, 9], greedy=True, dtype="float32")
    assert 'data-identical="false"' in bug and "from token 1 on" in bug and "this is a bug" in bug
    assert "half precision" in app_text.badge_html([5, 6], [5, 6, 7], greedy=True, dtype="bfloat16")  # from token 2
    assert 'data-identical="true"' in app_text.badge_html([5, 6], [5, 6], greedy=True, dtype="bfloat16")


def test_a_failure_mid_decode_warns_and_the_next_run_works(tiny_app, warnings, monkeypatch):
    real = app_engine.generate

    def failing(*args, **kwargs):
        gen = real(*args, **kwargs)
        yield next(gen)
        raise RuntimeError("boom\nsecond line")

    with served(tiny_app) as client:
        monkeypatch.setattr(app_engine, "generate", failing)
        res = call_run(client, "w9 w10 w11", max_new=6)
        assert warnings[-1] == "decoding failed: RuntimeError: boom"
        assert "decoding failed" in res["badge"] and "Traceback" not in res["badge"]
        monkeypatch.setattr(app_engine, "generate", real)
        good = call_run(client, "w9 w10 w11 w9 w10 w11", max_new=6)
        monkeypatch.setattr(app_engine, "generate", failing)
        res = call_run(client, "w12 w13", max_new=6)  # fails after a good run: that run is shown again
        assert "decoding failed" in res["badge"]
        assert res["summary"] == good["summary"] and res["spec_reply"] == good["spec_reply"]
        assert res["slider"]["interactive"] is True and res["download"] is not None
        fig, info = client.predict(1, api_name="/replay_step")
        assert "Step 1 of" in info
        monkeypatch.setattr(app_engine, "generate", real)
        check_complete_run(call_run(client, "w9 w10 w11 w9 w10 w11", max_new=6), 6)


def test_the_speed_up_is_per_token():
    """Sampled replies can differ in length: the headline compares tokens/s, and says so."""
    spec = {"tokens": 40, "forwards": 20, "tau": 1.95, "wall_s": 2.0, "tokens_per_s": 20.0, "prefill_ms": 1,
            "draft_ms": 1, "verify_ms": 1, "other_ms": 1}
    van = spec | {"tokens": 16, "forwards": 15, "tau": 1.0, "wall_s": 1.0, "tokens_per_s": 16.0}
    text = app_text.summary_markdown("lookup", spec, van)
    assert "**1.25×**" in text and "differ in length (40 and 16 tokens)" in text
    assert "differ in length" not in app_text.summary_markdown("lookup", spec, spec)


@pytest.mark.parametrize("token", ["abc", "```", "a`b", "`x", " ``"])
def test_tokens_with_backticks_stay_one_code_span(token):
    from markdown_it import MarkdownIt

    rendered = MarkdownIt().renderInline(app_text._code(token))
    assert rendered == f"<code>{html.escape(token, quote=False)}</code>"


def test_missing_drafter_is_explained(tiny, tmp_path):
    engine = app.Engine(tiny, tmp_path / "nothing-here", tmp_path / "nor-here")
    assert [m.label for m in engine.available] == ["lookup"]
    with pytest.raises(app.FastEagleError, match="no FastEagle drafter"):
        engine.method("FastEagle")
    demo = app.build_app(tiny, drafter_dir=tmp_path / "nothing-here", eagle3_dir=tmp_path / "nor-here")
    warning = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "drafter-warning"]
    assert warning and "python -m fasteagle train" in warning[0].value


def _banner(demo) -> str:
    found = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "drafter-warning"]
    return found[0].value if found else ""


def test_a_drafter_for_another_target_is_refused_at_startup(tiny, tmp_path):
    from fasteagle.drafter import CascadedDrafter, DrafterConfig
    from tests.conftest import tiny_target

    other = tiny_target(seed=5)  # same shapes, other weights: only the fingerprint tells them apart
    CascadedDrafter(DrafterConfig.for_target(other.model, other.name, num_layers=2, intermediate=64)).save(
        tmp_path / "fe")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text("{not json")
    (tmp_path / "junk" / "model.safetensors").write_bytes(b"x")
    for bad, fragment in ((tmp_path / "fe", "trained for tiny-llama-5"), (tmp_path / "junk", "cannot read")):
        demo = app.build_app(tiny, drafter_dir=bad, eagle3_dir=tmp_path / "none")
        assert [m.label for m in app.ENGINE.available] == ["lookup"]
        assert "does not fit tiny-llama-0" in _banner(demo) and fragment in _banner(demo)


def test_a_drafter_that_fails_to_load_warns(tiny, tmp_path, warnings):
    from fasteagle.drafter import CascadedDrafter, DrafterConfig

    broken = tmp_path / "broken"  # a config that fits, weights that do not load
    CascadedDrafter(DrafterConfig.for_target(tiny.model, tiny.name, num_layers=2, intermediate=64)).save(broken)
    (broken / "model.safetensors").write_bytes(b"not a checkpoint")
    with served(app.build_app(tiny, drafter_dir=broken)) as client:
        res = call_run(client, "w7 w8", method="FastEagle")
        assert all(unchanged(v) for v in res.values())
        assert "FastEagle" in warnings[-1] and "\n" not in warnings[-1]
        check_complete_run(call_run(client, "w9 w10 w11 w9 w10 w11 w9 w10", max_new=10), 10)


def test_replay_steps_and_trace_files(tiny_app, warnings, tmp_path):
    with served(tiny_app) as client:
        res = call_run(client, "w9 w10 w11 w9 w10 w11 w9 w10", max_new=12)
        run = check_complete_run(res, 12)
        traces = run["sides"]["speculative"]["traces"]
        fig, info = client.predict(1, api_name="/replay_step")
        assert "Step 1 of" in info
        layout = json.loads(fig["plot"])["layout"]
        assert layout["title"]["text"].startswith("step 1:")
        # every step is drawn as tall as the run's tallest tree: the page does not jump while replaying
        assert layout["height"] == json.loads(res["tree"]["plot"])["layout"]["height"] == max(
            viz.tree_height(tr) for tr in traces)
        path_trace = [t for t in plot_data(fig) if t["name"] == viz.ACCEPTED_PATH][0]
        assert len(path_trace["x"]) == len(traces[1]["path"])
        # Upload the downloaded file: the same replies and badge come back, with no decoding.
        back = dict(zip(OUT, client.predict(handle_file(res["download"]), api_name="/replay_file")))
        assert back["badge"] == res["badge"] and back["spec_reply"] == res["spec_reply"]
        assert json.loads(Path(back["download"]).read_text()) == json.loads(Path(res["download"]).read_text())
        assert back["slider"]["maximum"] == res["slider"]["maximum"]
        assert back["slider"]["value"] == res["slider"]["value"] and back["step_info"] == res["step_info"]
        # Invalid files warn and change nothing.
        odd = json.loads(Path(res["download"]).read_text())
        odd["sides"]["speculative"]["traces"][1]["target_probs"][0] = "x"
        wide = json.loads(Path(res["download"]).read_text())
        wide["sides"]["speculative"]["traces"][1]["tree"]["tokens"][0] = 10**12
        for i, content in enumerate(("not json at all", json.dumps({"format": "other"}), "", json.dumps(odd),
                                     json.dumps(wide))):
            bad = tmp_path / f"bad{i}.json"
            bad.write_text(content)
            out = client.predict(handle_file(str(bad)), api_name="/replay_file")
            assert all(unchanged(v) for v in out), out
            assert "cannot replay this file" in warnings[-1]
        fig, info = client.predict(2, api_name="/replay_step")  # the replayed run is still there
        assert "Step 2 of" in info


def test_previous_and_next_step_buttons(tiny_app):
    with served(tiny_app) as client:
        assert kept(client.predict(3, api_name="/step_next"))  # no run on screen: the slider stays
        res = call_run(client, "w9 w10 w11 w9 w10 w11 w9 w10", max_new=12)
        last = check_complete_run(res, 12)["sides"]["speculative"]["traces"]
        land = res["slider"]["value"]
        assert client.predict(land, api_name="/step_next") == min(land + 1, len(last) - 1)
        assert client.predict(land, api_name="/step_prev") == max(land - 1, 0)
        assert client.predict(0, api_name="/step_prev") == 0  # kept at the run's ends
        assert client.predict(len(last) - 1, api_name="/step_next") == len(last) - 1
        _, info = client.predict(client.predict(1, api_name="/step_next"), api_name="/replay_step")
        assert "Step 2 of" in info
        # a step typed past the run's ends: its nearest end, never Gradio's bare "Error"
        assert client.predict(999, api_name="/step_prev") == len(last) - 1
        assert f"Step {len(last) - 1} of" in client.predict(999, api_name="/replay_step")[1]
        assert "Step 0 of" in client.predict(-4, api_name="/replay_step")[1]


def test_play_steps_through_the_run_and_stops_at_its_end():
    h = app.Handlers.__new__(app.Handlers)
    run = {"sides": {"speculative": {"traces": [{"step": i} for i in range(4)]}}}
    playing, timer, label, start = h.on_play(False, 3, run)  # at the end: play from the start
    assert playing and timer.active and "pause" in label and start == 0
    assert h.on_tick(0, run)[:2] == (1, True)
    nxt, playing, timer, label = h.on_tick(2, run)
    assert nxt == 3 and not playing and not timer.active and "play" in label
    assert h.on_play(True, 1, run)[0] is False  # pause


def test_the_race_strip_follows_the_run_on_screen(tiny_app, tmp_path):
    with served(tiny_app) as client:
        res = call_run(client, "w9 w10 w11 w9 w10 w11 w9 w10", max_new=12)
    run = viz.parse_run_file(Path(res["download"]).read_bytes())
    h = app.Handlers.__new__(app.Handlers)
    spec, van = (run["sides"][s]["summary"] for s in ("speculative", "vanilla"))
    text = re.sub(r"<[^>]+>", "", h.on_race(run))
    assert f"{spec['forwards']} vs {van['forwards']} target forwards" in text
    assert f"τ {spec['tau']:.2f}" in text and "steady number" in text
    assert f"{spec['tokens_per_s'] / van['tokens_per_s']:.2f}×" in text  # as the summary's speed-up
    assert h.on_race(None) == "" and h.on_race({"sides": {"speculative": {"traces": 5}}}) == ""
    del run["sides"]["vanilla"]
    assert "no vanilla" in h.on_race(run)


def test_examples_have_short_labels_and_one_samples(tiny_app):
    examples = [b for b in tiny_app.blocks.values() if isinstance(b, gr.Dataset)]
    assert len(examples) == 1
    ds = examples[0]
    assert ds.sample_labels == [e.label for e in app.EXAMPLES]
    assert all(len(e.label) <= 40 and "`" not in e.label and e.prompt.strip() for e in app.EXAMPLES)
    assert len({e.label for e in app.EXAMPLES}) == len(app.EXAMPLES)
    assert [c.label for c in ds._components][1].startswith("Temperature")  # an example sets it too
    assert [row[1] for row in ds.samples] == [e.temperature for e in app.EXAMPLES]
    temps = [e.temperature for e in app.EXAMPLES]
    assert 0.0 in temps and any(0 < t <= 1.5 for t in temps)


def test_decode_first_then_animate(tiny, tmp_path, monkeypatch):
    """The ZeroGPU path: both decodes run in one call returning plain data, then the UI animates."""
    monkeypatch.setattr(app_handlers, "ANIMATE_S", 0.2)
    demo = app.build_app(tiny, drafter_dir=tmp_path / "none", precompute=True)
    result = app.ENGINE.decode_both(app.ENGINE.request("w9 w10 w9 w10", "lookup", 0, 6, "4", 8, 0))
    json.dumps(result)  # plain data only
    assert set(result) == {"speculative", "vanilla"}
    with served(demo) as client:
        check_complete_run(call_run(client, "w9 w10 w11 w9 w10 w11 w9 w10", max_new=12), 12)




def test_the_shipped_eagle3_drafter_comes_with_its_equal_cascade(tmp_path, monkeypatch):
    """With the shipped EAGLE-3 drafter the app also offers the cascade trained on the same tokens, right
    after it, and says what the two are; another EAGLE-3 drafter has no such partner."""
    monkeypatch.delenv("FASTEAGLE_EAGLE3_DRAFTER", raising=False)
    specs = app_engine.method_specs()
    assert [m.label for m in specs] == ["FastEagle", "EAGLE-3", app.EQUAL_LABEL, "FastEagle + lookup", "lookup"]
    equal = specs[2]
    assert (equal.key, equal.drafter_dir, equal.available) == ("fasteagle", app_engine.EQUAL_DRAFTER, True)
    assert app.EQUAL_LABEL not in [m.label for m in app_engine.method_specs(eagle3_dir=tmp_path)]


def test_trained_drafters_are_offered_and_draw_trees(tiny, drafters):
    """With drafter directories present, FastEagle and EAGLE-3 join the method list and run."""
    demo = app.build_app(tiny, drafter_dir=drafters[0], eagle3_dir=drafters[1])
    assert [m.label for m in app.ENGINE.available] == ["FastEagle", "EAGLE-3", "FastEagle + lookup", "lookup"]
    with served(demo) as client:
        for method, k, shape in (("FastEagle", "3,2,1", "product"), ("FastEagle", "3,2,1", "backbone"),
                                 ("EAGLE-3", "3", "product")):
            res = call_run(client, "w9 w10 w11 w12", method=method, max_new=10, tree_k=k, budget=6, shape=shape)
            run = check_complete_run(res, 10)
            assert run["meta"]["method"] == method and run["meta"]["tree_shape"] == shape
            trees = [t["tree"] for t in run["sides"]["speculative"]["traces"][1:]]
            assert trees and all(len(t["tokens"]) <= 6 for t in trees)
            assert all(len(t["tokens"]) > 1 for t in trees[:-1])  # the last may hold one token left: root only
            if shape == "backbone":  # the paper's tree: only a depth's first node (the spine) has children
                assert all(t["depths"].index(t["depths"][p]) == p for t in trees for p in t["parents"][1:])
        # the cascade's tree stays within the budget; lookup's branches come on top, marked as lookup's
        res = call_run(client, "w9 w10 w11 w9 w10 w11 w9 w10", method="FastEagle + lookup", max_new=16, budget=3)
        run = check_complete_run(res, 16)
        trees = [t["tree"] for t in run["sides"]["speculative"]["traces"][1:]]
        assert all(sum(s != -1 for s in t["sources"]) <= 3 for t in trees)
        assert any(-1 in t["sources"] for t in trees)
    # an empty top-k gives each drafter its own again, after a request that set another
    fe = app.ENGINE.drafter(app.ENGINE.request("w9 w10", "FastEagle", 0, 4, "3,2,1", 6, 0))
    assert fe.tree_k == [3, 2, 1]
    assert app.ENGINE.drafter(app.ENGINE.request("w9 w10", "FastEagle", 0, 4, "", 6, 0)).tree_k == 32
    assert app.ENGINE.drafter(app.ENGINE.request("w9 w10", "EAGLE-3", 0, 4, " ", 6, 0)).tree_k == 10


def test_an_unknown_tree_shape_is_a_clear_error(tiny, tmp_path):
    app.build_app(tiny, drafter_dir=tmp_path / "no-drafter", eagle3_dir=tmp_path / "no-eagle3")
    with pytest.raises(app.FastEagleError, match="tree shape"):
        app.ENGINE.request("w9 w10", "lookup", 0, 6, "4", 8, 0, "bushy")
    assert app.ENGINE.request("w9 w10", "lookup", 0, 6, "4", 8, 0, None).tree_shape == "product"


# -- the real default model -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def random_drafter(smollm, tmp_path_factory) -> Path:
    """An untrained 2-layer FastEagle drafter for the default target (tests the path, not the speed)."""
    import torch

    from fasteagle.drafter import CascadedDrafter, DrafterConfig

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("drafter")
    cfg = DrafterConfig.for_target(smollm.model, smollm.name, num_layers=2)
    CascadedDrafter(cfg).init_from_target(smollm.model).save(out)
    return out


@pytest.mark.integration
def test_default_model_end_to_end(smollm, random_drafter):
    demo = app.build_app(smollm, drafter_dir=random_drafter)
    with served(demo) as client:
        res = call_run(client, "List three colors.", method="FastEagle", max_new=8, tree_k="4", budget=8)
        run = check_complete_run(res, 8)
        assert run["meta"]["method_key"] == "fasteagle" and run["meta"]["target"] == smollm.name
        trees = [t["tree"] for t in run["sides"]["speculative"]["traces"][1:]]
        assert all(len(t["tokens"]) <= 8 for t in trees)  # real drafted trees within the budget
        assert all(len(t["tokens"]) > 1 for t in trees[:-1])
        res = call_run(client, "Repeat after me: red green blue, red green blue.", method="lookup", max_new=8)
        check_complete_run(res, 8)


def test_a_file_that_is_not_a_trace_warns_the_user(tiny_app, warnings, tmp_path):
    """The warning reaches the page, not only the server log as a UserWarning: gr.Warning needs a
    queued event (the browser calls an unqueued one without an event id; gradio_client always queues)."""
    import warnings as pywarnings

    dep = next(d for d in tiny_app.config["dependencies"] if d.get("api_name") == "replay_file")
    assert dep["queue"] is not False

    bad = tmp_path / "hello.json"
    bad.write_text(json.dumps({"hello": 1}))
    with served(tiny_app) as client, pywarnings.catch_warnings(record=True) as logged:
        pywarnings.simplefilter("always")
        out = client.predict(handle_file(str(bad)), api_name="/replay_file")
    assert all(kept(v) for v in out), out
    assert "cannot replay this file" in warnings[-1]
    assert not [w for w in logged if "cannot replay" in str(w.message)], [str(w.message) for w in logged]


def test_a_replayed_file_loads_its_prompt_and_settings(tiny_app, tmp_path):
    """After /replay_file the page chains /replay_settings: the controls show the file's prompt, method
    and settings (once: a later call, or a refused file, leaves the controls alone)."""
    with served(tiny_app) as client:
        res = call_run(client, "w9 w10 w11 w9 w10 w11", max_new=7, tree_k="3", budget=5, seed=4,
                       shape="backbone")
        call_run(client, "w12 w13", max_new=3)  # another run on screen, its settings in the controls
        client.predict(handle_file(res["download"]), api_name="/replay_file")
        got = client.predict(api_name="/replay_settings")
        assert list(got) == ["w9 w10 w11 w9 w10 w11", "lookup", 0.0, 7, "3", 5, "backbone", 4]
        assert all(kept(v) for v in client.predict(api_name="/replay_settings"))
        bad = tmp_path / "hello.json"
        bad.write_text(json.dumps({"hello": 1}))
        client.predict(handle_file(str(bad)), api_name="/replay_file")
        assert all(kept(v) for v in client.predict(api_name="/replay_settings"))


def test_the_slider_shows_the_decodes_range_while_decoding(tiny_app, monkeypatch):
    """While decoding, the replay slider spans the steps decoded so far, not 0..MAX_NEW_TOKENS."""
    monkeypatch.setattr(app_handlers, "FRAME_S", 0.0)  # every step on screen
    with served(tiny_app) as client:
        job = client.submit("w9 w10 w11 w9 w10 w11 w9 w10", "lookup", 0.0, 12, "4", 8, 0, "product",
                            api_name="/run")
        final = dict(zip(OUT, job.result()))
        sliders = [dict(zip(OUT, out))["slider"] for out in job.outputs()]
    last = final["slider"]["maximum"]
    assert last < app.MAX_NEW_TOKENS
    during = [s for s in sliders[:-1] if isinstance(s, dict) and "maximum" in s]
    assert during and all(s["maximum"] <= max(last, 1) and s["interactive"] is False for s in during), during

"""The page's components and what it shows of a run: `UI` names the components (app.py lays them
out); `Screen` draws a finished or replayed run and answers the events that browse it (a step, a
clicked token, play, presentation mode, a trace file replayed).

`Handlers` (handlers.py) adds the events that decode: it is a `Screen` with an engine's turns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

import viz
from fasteagle import trace
from fasteagle.app.costs import CostBook
from fasteagle.app.engine import MAX_NEW_TOKENS, Engine
from fasteagle.app.text import badge_html, fmt_stats, modelled_badge, modelled_stats, step_markdown, summary_markdown
from fasteagle.methods import MAX_BUDGET
from fasteagle.tree import TREE_SHAPES
from viz.tokens import spans_from_json, spans_to_json

log = logging.getLogger("fasteagle.app")


@dataclass
class UI:
    """The page's components: a run's settings, then what a run shows, then the trace file buttons."""

    prompt: gr.Textbox
    method: gr.Radio
    tree_size: gr.Radio  # fast (this device's default budget) or the paper's tree; sets the budget
    tree_size_note: gr.Markdown
    temperature: gr.Slider
    max_new: gr.Slider
    tree_k: gr.Textbox
    budget: gr.Slider
    tree_shape: gr.Radio
    seed: gr.Number
    run_btn: gr.Button
    compare_btn: gr.Button
    spec_stats: gr.Markdown
    spec_reply: gr.HTML
    van_stats: gr.Markdown
    van_reply: gr.HTML
    badge: gr.HTML
    stage: gr.HTML  # set from run_state: the step on screen in phases, played in the browser (viz.stepper)
    whatif: gr.HTML  # set from run_state: the speed at other tree sizes (viz.whatif)
    race: gr.HTML  # set from run_state (not an API output): a finished run's forwards, both ways
    playback: gr.HTML  # set from run_state: both replies played at their measured speeds (in the browser)
    tree_plot: gr.Plot
    step_slider: gr.Slider
    prev_btn: gr.Button
    next_btn: gr.Button
    play_btn: gr.Button
    play_timer: gr.Timer  # ticks only while playing
    step_info: gr.Markdown
    tree_side: gr.Column  # the short explainer beside the tree, shown in presentation mode
    summary: gr.Markdown
    hist_plot: gr.Plot
    depth_plot: gr.Plot
    time_plot: gr.Plot
    download: gr.DownloadButton
    upload: gr.UploadButton
    compare_box: gr.Accordion  # "All methods on this prompt", opened by its button
    compare_status: gr.Markdown
    compare_table: gr.Markdown
    compare_plot: gr.Plot
    present: gr.Checkbox  # presentation mode
    present_state: gr.State  # the same, for handlers (a State is no API parameter)
    run_state: gr.State  # the run on screen (its record, as `viz.make_run_file` makes it), or None
    tour_btn: gr.Button  # opens the guided tour (fasteagle.app.tour; it runs in the browser)

    @property
    def run_inputs(self) -> list:
        return [self.prompt, self.method, self.temperature, self.max_new, self.tree_k, self.budget, self.seed,
                self.tree_shape, self.run_state, self.present_state]

    @property
    def compare_inputs(self) -> list:
        """The run's settings but the method: the comparison runs every method."""
        return [self.prompt, self.temperature, self.max_new, self.tree_k, self.budget, self.seed, self.tree_shape]

    @property
    def compare_outputs(self) -> list:
        return [self.compare_status, self.compare_table, self.compare_plot, self.compare_box]

    @property
    def outputs(self) -> list:
        """Everything a finished run or a replayed file sets, in the order of the API's outputs."""
        return [self.spec_stats, self.spec_reply, self.van_stats, self.van_reply, self.badge, self.tree_plot,
                self.step_slider, self.step_info, self.summary, self.hist_plot, self.depth_plot, self.time_plot,
                self.download, self.run_state]


class Screen:
    """The run on screen: its outputs drawn from its record, and the events that browse it. Each
    event handler gets the run from `ui.run_state`; none decodes. Like `Handlers`' own, the event
    handlers (on_*) have comments, not docstrings: Gradio publishes a docstring as its API description."""

    engine: Engine  # labels tokens, lists the methods a replayed file may name
    ui: UI
    costs: CostBook  # the what-if panel's presets

    def finish(self, run: dict, label: Callable[[int], str], style: viz.TreeStyle = viz.NORMAL) -> dict:
        """Every end-of-run output from a run record (a fresh run or an uploaded file), its tree drawn
        in `style`."""
        ui = self.ui
        meta, sides = run.get("meta", {}), run["sides"]
        spec, van = sides["speculative"], sides.get("vanilla")
        mlabel = meta.get("method", "speculative")
        s_sum = spec.get("summary") or trace.run_summary(spec["traces"])
        v_sum = (van.get("summary") or trace.run_summary(van["traces"])) if van else None
        modelled = None if van else modelled_vanilla(meta)
        traces = spec["traces"]
        n = len(traces)
        land = viz.landing_step(traces)  # the longest accepted path, not the lone bonus token at the end
        height = _run_tree_height(run, style)
        upd = {
            ui.spec_stats: fmt_stats("speculative", traces[-1], s_sum["wall_s"], mlabel),
            ui.spec_reply: viz.spans_html(spans_from_json(spec.get("spans") or []), clickable=True),
            ui.summary: summary_markdown(mlabel, s_sum, v_sum or modelled, modelled=modelled is not None),
            ui.hist_plot: viz.acceptance_histogram(traces),
            ui.depth_plot: viz.depth_acceptance_chart(traces),
            ui.time_plot: viz.time_split_chart({mlabel: s_sum} | ({"vanilla": v_sum} if v_sum else {})
                                               | ({"vanilla (modelled)": modelled} if modelled else {})),
            ui.tree_plot: viz.tree_figure(traces[land], label, min_height=height, style=style),
            ui.step_slider: gr.Slider(minimum=0, maximum=max(n - 1, 1), value=land, step=1, interactive=True),
            ui.step_info: step_markdown(traces[land], label, n),
            ui.run_state: run,
        }
        if van:
            upd[ui.van_stats] = fmt_stats("vanilla", van["traces"][-1], v_sum["wall_s"])
            upd[ui.van_reply] = viz.spans_html(spans_from_json(van.get("spans") or []), legend=False)
            upd[ui.badge] = badge_html(trace.reply_tokens(traces), trace.reply_tokens(van["traces"]),
                                       float(meta.get("temperature", 0)) <= 0, meta.get("dtype", ""))
        elif modelled:
            upd[ui.van_stats] = modelled_stats(modelled)
            upd[ui.van_reply] = viz.spans_html([], legend=False, empty="not decoded while other pages waited")
            upd[ui.badge] = modelled_badge(float(meta.get("temperature", 0)) <= 0)
        else:
            upd[ui.van_stats] = "**vanilla** · not in this trace"
            upd[ui.van_reply] = viz.spans_html([], legend=False, empty="no vanilla decode in this trace")
            upd[ui.badge] = '<div class="badge info">no vanilla decode in this trace</div>'
        return upd

    # /replay_step: the tree and the emitted tokens of one step of the run on screen.
    def on_step(self, step, run, present=False):
        if not run:
            return gr.skip(), gr.skip()
        traces = run["sides"]["speculative"]["traces"]
        try:
            i = min(max(int(step or 0), 0), len(traces) - 1)
        except (TypeError, ValueError):
            return gr.skip(), gr.skip()
        label = self._labeler(run)
        try:
            style = style_for(present)
            return (viz.tree_figure(traces[i], label, min_height=_run_tree_height(run, style), style=style),
                    step_markdown(traces[i], label, len(traces)))
        except Exception as exc:  # an uploaded file odd in a way its check missed: say so, keep the app
            log.exception("drawing step %d failed", i)
            gr.Warning(f"cannot draw step {i}: {type(exc).__name__}")
            return gr.skip(), gr.skip()

    # the race strip above the tree, from the run on screen (empty while decoding)
    def on_race(self, run):
        if not isinstance(run, dict) or not run.get("sides"):
            return ""
        spec, van = run["sides"]["speculative"], run["sides"].get("vanilla")
        try:
            meta = run.get("meta") or {}
            return viz.race_html(spec["traces"], van["traces"] if van else None, viz.decode_seconds(spec),
                                 viz.decode_seconds(van) if van else None, meta.get("method", "speculative"),
                                 None if van else modelled_vanilla(meta))
        except Exception:  # an odd replayed file: no strip rather than a broken page
            log.exception("drawing the race strip failed")
            return ""

    # both replies of the run on screen, to play at their measured speeds (a placeholder without one)
    def on_playback(self, run):
        if not isinstance(run, dict) or not run.get("sides"):
            return viz.playback_html({})
        try:
            return viz.playback_html(run["sides"], (run.get("meta") or {}).get("method", "speculative"))
        except Exception:  # an odd replayed file: the placeholder rather than a broken page
            log.exception("drawing the playback failed")
            return viz.playback_html({})

    # the stage: the run on screen's steps, to play phase by phase in the browser (a placeholder without one)
    def on_stage(self, run):
        if not isinstance(run, dict) or not run.get("sides"):
            return viz.stage_html(None)
        try:
            return viz.stage_html(run, self._labeler(run))
        except Exception:  # an odd replayed file: the placeholder rather than a broken page
            log.exception("drawing the stage failed")
            return viz.stage_html(None)

    # the what-if panel: the run's speed at other tree sizes (the reason where the model cannot replay it)
    def on_whatif(self, run):
        if not isinstance(run, dict) or not run.get("sides"):
            return viz.whatif_html(None)
        try:
            return viz.whatif_html(run, self.costs.presets())
        except Exception:  # an odd replayed file: the placeholder rather than a broken page
            log.exception("drawing the what-if panel failed")
            return viz.whatif_html(None)

    # a click on a token of the speculative reply: the slider moves to the step that emitted it
    # (its change event then draws that step), unless it is there already
    def on_token(self, step, run, evt: gr.EventData):
        if not run:
            return gr.skip()
        try:
            want = int(evt.step)
            here = int(step or 0)
        except (AttributeError, TypeError, ValueError):
            return gr.skip()
        traces = run["sides"]["speculative"]["traces"]
        i = next((i for i, tr in enumerate(traces) if int(tr.get("step", i)) == want), None)
        return gr.skip() if i is None or i == here else i

    # presentation mode on or off: the tree redrawn in its sizes, the short explainer beside it
    def on_present(self, on, step, run):
        on = bool(on)
        tree = self.on_step(step, run, on)[0] if run else gr.skip()
        return on, tree, gr.Column(visible=on)

    # /step_prev, /step_next: the step before / after the one on the slider (the slider's change
    # event then draws it); kept at the run's ends, and nothing without a run on screen.
    def on_prev(self, step, run):
        return self._move(step, run, -1)

    def on_next(self, step, run):
        return self._move(step, run, 1)

    def _move(self, step, run, by: int):
        if not run:
            return gr.skip()
        last = len(run["sides"]["speculative"]["traces"]) - 1
        try:
            return min(max(int(step or 0) + by, 0), last)
        except (TypeError, ValueError):
            return gr.skip()

    # play / pause: the timer steps through the run (from the start when at its end), until its end.
    def on_play(self, playing, step, run):
        if playing or not run:
            return False, gr.Timer(active=False), "▶ play", gr.skip()
        last = len(run["sides"]["speculative"]["traces"]) - 1
        start = 0 if int(step or 0) >= last else gr.skip()
        return True, gr.Timer(active=True), "⏸ pause", start

    def on_tick(self, step, run):
        nxt = self._move(step, run, 1)
        last = len(run["sides"]["speculative"]["traces"]) - 1 if run else 0
        if not run or nxt == last or int(step or 0) >= last:
            return nxt, False, gr.Timer(active=False), "▶ play"
        return nxt, True, gr.skip(), gr.skip()

    # /replay_file: a trace file replayed, the screen as its run left it.
    def on_upload(self, path, present=False):
        try:
            if not path:
                raise viz.TraceFileError("no file")
            p = Path(path if isinstance(path, str) else getattr(path, "name", path))
            if p.stat().st_size > viz.trace_io.MAX_BYTES:
                raise viz.TraceFileError(f"the file is larger than {viz.trace_io.MAX_BYTES >> 20} MB")
            run = viz.parse_run_file(p.read_bytes())
            for side in run["sides"].values():  # a file without stored spans: rebuild them here
                if not side.get("spans"):
                    side["spans"] = spans_to_json(viz.token_spans(side["traces"], self.engine.decode_text))
            run["_replayed"] = True  # on_replayed then loads its settings into the controls (once)
            # the download is what is shown
            return self.finish(run, self._labeler(run), style_for(present)) | {self.ui.download: str(p)}
        except (viz.TraceFileError, OSError) as exc:
            gr.Warning(f"cannot replay this file: {exc}")
        except Exception as exc:  # a file that passed validation but is still odd
            log.exception("replaying an uploaded trace failed")
            gr.Warning(f"cannot replay this file: {type(exc).__name__}")
        return {c: gr.skip() for c in self.ui.outputs}

    # /replay_settings: after /replay_file, the replayed run's prompt and settings in the controls
    # (each one this app can take; the others keep their value), so that Run decodes it again.
    def on_replayed(self, run):
        ui = self.ui
        keep = {c: gr.skip() for c in self.settings_outputs}
        if not isinstance(run, dict) or not run.get("_replayed"):
            return keep
        run = {k: v for k, v in run.items() if k != "_replayed"}
        meta = run.get("meta") or {}
        upd = dict(keep) | {ui.run_state: run}

        def put(comp, key, convert, ok=lambda v: True):
            try:
                v = convert(meta[key])
            except (KeyError, TypeError, ValueError, OverflowError):
                return
            if ok(v):
                upd[comp] = v

        put(ui.prompt, "prompt", str)
        put(ui.method, "method", str, lambda v: v in [m.label for m in self.engine.available])
        put(ui.temperature, "temperature", float, lambda v: 0.0 <= v <= 1.5)
        put(ui.max_new, "max_new_tokens", int, lambda v: 1 <= v <= MAX_NEW_TOKENS)
        put(ui.tree_k, "tree_k", str)
        put(ui.budget, "tree_budget", int, lambda v: 2 <= v <= MAX_BUDGET)
        put(ui.tree_shape, "tree_shape", str, lambda v: v in TREE_SHAPES)
        put(ui.seed, "seed", int, lambda v: 0 <= v < 2**63)
        return upd

    @property
    def settings_outputs(self) -> list:
        ui = self.ui
        return [ui.prompt, ui.method, ui.temperature, ui.max_new, ui.tree_k, ui.budget, ui.tree_shape, ui.seed,
                ui.run_state]

    def _labeler(self, run):
        return run_labeler(run, self.engine)


def run_labeler(run: dict, engine: Engine) -> Callable[[list[int]], str]:
    """Token labels from the run's own table (a file from another model), else the engine's."""
    table = run.get("token_labels") or {}
    return lambda ids: "".join(table[i] if i in table else engine.label(i) for i in ids)


def modelled_vanilla(meta: dict) -> dict | None:
    """The modelled vanilla summary a run's meta holds (its vanilla decode skipped under load), or
    None; an uploaded file's odd one counts as none."""
    van = meta.get("vanilla_modelled")
    ok = isinstance(van, dict) and all(isinstance(van.get(k), int | float) and not isinstance(van.get(k), bool)
                                       for k in trace.SUMMARY_NUMBERS)
    return van if ok else None


def _run_tree_height(run, style: viz.TreeStyle = viz.NORMAL) -> int:
    """The tallest step's tree height in `style`: every step of a run is drawn that tall, so the page
    below the tree stays put while the slider moves. Kept in the run state (not in its file)."""
    key = "_tree_height" if style == viz.NORMAL else "_tree_height_large"
    if type(run.get(key)) is not int:
        run[key] = max(viz.tree_height(tr, style) for tr in run["sides"]["speculative"]["traces"])
    return run[key]


def style_for(present) -> viz.TreeStyle:
    """The tree's sizes: large in presentation mode."""
    return viz.LARGE if present else viz.NORMAL

"""What the app's page does on each event: the handlers of `app.py`'s components, the one decoder
taken in turns, and example runs replayed from the cache.

`UI` names the page's components (app.py lays them out); `Handlers` turns an event's inputs into
their updates. A run validates its request, replays an example from the cache at once when it can,
else waits its turn at the decoder (the page shows its place and an estimate) and streams the decode.
When other pages are waiting as its turn comes, it decodes only the speculative side and shows
vanilla's time modelled from this machine's measured step, labelled so.
"""

from __future__ import annotations

import html
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

import viz
from fasteagle import files, trace
from fasteagle.app.engine import MAX_NEW_TOKENS, Engine, Request
from fasteagle.app.examples import ExampleCache, run_record
from fasteagle.app.text import (
    badge_html,
    compare_markdown,
    compare_settings,
    fmt_stats,
    modelled_badge,
    modelled_stats,
    paper_tree_note,
    queue_line,
    replay_note,
    shared_note,
    step_markdown,
    summary_markdown,
)
from fasteagle.app.turns import Turns
from fasteagle.errors import FastEagleError
from fasteagle.methods import MAX_BUDGET, PAPER_BUDGET, default_budget
from fasteagle.tree import DEFAULT_TREE_SHAPE, TREE_SHAPES
from viz.tokens import spans_from_json, spans_to_json

log = logging.getLogger("fasteagle.app")

FRAME_S = 0.12  # at most one tree figure per this many seconds while streaming (the last step always)
ANIMATE_S = 6.0  # precomputed runs replay in about this long per side
WAIT_POLL_S = 1.0  # a waiting page looks at its place this often
WAIT_SAY_S = 5.0  # and tells it at least this often (its estimate counts down)


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


class Handlers:
    """What the page does on each event, for one engine and one page's components. Every decode takes
    its turn at `turns` (shared by all pages); an example at its defaults replays from `examples`
    without one. `precompute`: decode to the end first (on ZeroGPU, in a GPU function: `decode_both`),
    then animate the steps; otherwise each step is shown as it is decoded.

    The event handlers (on_*) have comments, not docstrings: Gradio publishes a handler's docstring
    as its API description."""

    def __init__(self, engine: Engine, ui: UI, precompute: bool, turns: Turns | None = None,
                 examples: ExampleCache | None = None, decode_both: Callable[[Request, bool], dict] | None = None):
        self.engine, self.ui, self.precompute = engine, ui, precompute
        self.turns = turns or Turns()
        self.examples = examples
        self.decode_both = decode_both or engine.decode_both  # on ZeroGPU: inside a spaces.GPU function
        self.replays = 0  # example replays drawn so far: a decode says how many shared its CPU time
        self._replayed: dict[tuple, tuple[dict, dict]] = {}  # (id(run), style) -> (run, its outputs)

    # /run: decode the prompt both ways, streaming each side's steps (an example at its defaults:
    # its stored run at once); a user error is a warning with the screen unchanged, a failure
    # mid-decode a warning over the previous run.
    def on_run(self, prompt, method, temperature, max_new_tokens, tree_k, tree_budget, seed,
               shape=DEFAULT_TREE_SHAPE, previous=None, present=False):
        engine, ui = self.engine, self.ui
        style = _style(present)
        try:
            req = engine.request(prompt, method, temperature, max_new_tokens, tree_k, tree_budget, seed, shape)
            ids = engine.prompt_ids(req)
            engine.load(req.method)  # (once) here, so that a bad checkpoint warns before any waiting
        except FastEagleError as exc:
            gr.Warning(str(exc))
            # every output kept as it is: a generator that yields nothing would blank them all (and the
            # slider's None would then break its change event)
            yield {c: gr.skip() for c in ui.outputs}
            return
        stored = self.examples.get(req) if self.examples else None
        if stored is not None:  # no turn taken: a replay never waits behind a decode
            yield self.replay(stored, style)
            return
        ticket = self.turns.join(engine.estimate(req))
        try:
            yield from self._wait(ticket, req)
            yield from self._decode(req, ids, style, previous, ticket)
        finally:
            self.turns.leave(ticket)

    def _wait(self, ticket, req: Request) -> Iterator[dict]:
        """The cleared screen with this page's place in line, then a new line whenever its place
        changes (or every WAIT_SAY_S seconds) while other decodes go first; returns when the decoder is
        this page's. The tree's placeholder says it too, being the biggest thing on the page. Between lines
        it yields a frame that changes nothing every WAIT_POLL_S: a page that stops or goes away is let
        go at the next frame, so it leaves the line within about a second, not at the next line said."""
        ui, said, said_at = self.ui, None, 0.0
        while said is None or not self.turns.wait(ticket, WAIT_POLL_S):
            place = self.turns.place(ticket)
            if place.ahead == said and time.monotonic() - said_at < WAIT_SAY_S:
                yield {c: gr.skip() for c in ui.outputs}
                continue
            line = queue_line(place.ahead, place.wait_s + ticket.estimate_s)
            frame = {ui.badge: f'<div class="badge info" data-queue="{place.ahead}">{html.escape(line)}</div>'}
            if place.ahead != said:
                frame[ui.tree_plot] = viz.empty_figure(line if place.ahead else "prefill: the target reads the prompt…")
            if said is None:
                frame |= {ui.spec_stats: fmt_stats("speculative", None, 0), ui.van_stats: fmt_stats("vanilla", None, 0),
                          ui.spec_reply: viz.spans_html([]), ui.van_reply: viz.spans_html([], legend=False),
                          ui.summary: "", ui.step_info: "", ui.run_state: None,
                          # the decode's own range (grown by _stream), not the static 0..MAX_NEW_TOKENS; the
                          # state is empty meanwhile, so that the slider's change events draw nothing old
                          ui.step_slider: gr.Slider(minimum=0, maximum=1, value=0, interactive=False)}
            said, said_at = place.ahead, time.monotonic()
            yield frame

    def _decode(self, req: Request, ids, style: viz.TreeStyle, previous, ticket) -> Iterator[dict]:
        """The run's decode, holding the decoder (`ticket`'s turn): both sides, or only the speculative
        one when other pages wait (vanilla's time then modelled); the finished run is kept when it is an
        example's. A decode done to the end first gives its turn back before it is animated."""
        engine, ui = self.engine, self.ui
        waiting, replays = self.turns.waiting(), self.replays
        try:
            yield {ui.badge: '<div class="badge info">decoding…</div>',
                   ui.tree_plot: viz.empty_figure("prefill: the target reads the prompt…")}
            if self.precompute:
                result = self.decode_both(req, not waiting)
                self.turns.leave(ticket)
                if "error" in result:
                    raise FastEagleError(result["error"])
                events = _animate(result)
            else:
                events = self._live(ids, engine.drafter(req), req, vanilla=not waiting)
            builders = {"speculative": viz.SpanBuilder(engine.decode_text)}
            record = {"speculative": {"traces": [], "elapsed": []}}
            if not waiting:
                builders["vanilla"] = viz.SpanBuilder(engine.decode_text)
                record["vanilla"] = {"traces": [], "elapsed": []}
            yield from self._stream(events, builders, record, req.method.label, style)
            modelled = None
            if waiting:  # vanilla skipped: its time modelled, with how many pages it was skipped for
                modelled = engine.modelled_vanilla(record["speculative"]["traces"]) | {"waiting": waiting}
            run = run_record(engine, req, record, {k: b.spans for k, b in builders.items()}, modelled)
            if self.examples:
                self.examples.put(req, run)
            path = Path(tempfile.mkdtemp(prefix="fasteagle-")) / f"fasteagle-trace-{time.strftime('%H%M%S')}.json"
            files.write_text(path, viz.trace_io.dumps(run))
            upd = self.finish(run, engine.label_decode, style)
            upd[ui.summary] = shared_note(self.replays - replays) + upd[ui.summary]
            yield upd | {ui.download: str(path)}
        except Exception as exc:  # keep the app alive; a traceback goes to the server log only
            if isinstance(exc, FastEagleError):
                msg = str(exc)
            else:
                log.exception("decoding failed")
                msg = f"decoding failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            gr.Warning(msg)
            # the screen shows the previous run again (still replayable and downloadable), under the error
            restored = self.finish(previous, self._labeler(previous), style) if previous else {}
            yield restored | {ui.badge: f'<div class="badge bad">{html.escape(msg)}</div>'}

    def replay(self, run: dict, style: viz.TreeStyle) -> dict:
        """A stored example run on screen at once, as a finished run; its file is the download. Its
        outputs are drawn once per run and style and then reused: many pages may ask at once."""
        self.replays += 1
        key = (id(run), style)
        if key not in self._replayed or self._replayed[key][0] is not run:
            path = Path(tempfile.mkdtemp(prefix="fasteagle-")) / "fasteagle-trace-example.json"
            files.write_text(path, viz.trace_io.dumps(run))
            upd = self.finish(run, self._labeler(run), style)
            upd[self.ui.summary] = replay_note(run.get("meta") or {}) + upd[self.ui.summary]
            self._replayed[key] = (run, upd | {self.ui.download: str(path)})
        return dict(self._replayed[key][1])

    # /compare: vanilla and every method here on the prompt, with the same settings, one after the
    # other in one turn at the decoder (a progress line meanwhile); then one table and one per-depth
    # chart. A user error is a warning with the screen unchanged, a failure a line saying so over the
    # last comparison.
    def on_compare(self, prompt, temperature, max_new_tokens, tree_k, tree_budget, seed, shape=DEFAULT_TREE_SHAPE):
        engine, ui = self.engine, self.ui
        try:
            reqs = [engine.request(prompt, m.label, temperature, max_new_tokens, tree_k, tree_budget, seed, shape)
                    for m in engine.available]
            ids = engine.prompt_ids(reqs[0])
        except FastEagleError as exc:
            gr.Warning(str(exc))
            yield {c: gr.skip() for c in ui.compare_outputs}
            return
        ticket = self.turns.join(sum(engine.estimate(r) for r in reqs) + engine.estimate(reqs[0], vanilla=True))
        try:
            while not self.turns.wait(ticket, WAIT_POLL_S):
                place = self.turns.place(ticket)
                yield {ui.compare_box: gr.Accordion(open=True),
                       ui.compare_status: queue_line(place.ahead, place.wait_s + ticket.estimate_s)}
            yield from self._compare(reqs, ids)
        finally:
            self.turns.leave(ticket)

    def _compare(self, reqs: list[Request], ids) -> Iterator[dict]:
        engine, ui = self.engine, self.ui
        jobs = [("vanilla", reqs[0], False)] + [(r.method.label, r, True) for r in reqs]
        runs: dict[str, tuple[list[dict], float]] = {}
        try:
            for i, (name, req, drafted) in enumerate(jobs):
                done = " · ".join(f"{n} ✔" for n in runs)
                yield {ui.compare_box: gr.Accordion(open=True),
                       ui.compare_status: f"{done + ' · ' if done else ''}decoding with **{name}** "
                                          f"({i + 1} of {len(jobs)})…"}
                drafter = engine.drafter(req) if drafted else None
                engine.warmup(drafter)  # its first decode's lazy set-up not billed to its tokens/s
                rows = list(engine.steps(ids, drafter, req))
                runs[name] = ([r for r, _ in rows], rows[-1][1] if rows else 0.0)
        except Exception as exc:  # keep the last comparison on screen; say what failed, in one line
            if not isinstance(exc, FastEagleError):
                log.exception("comparing the methods failed")
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            gr.Warning(f"the comparison failed: {msg}")
            yield {ui.compare_status: f"⚠️ the comparison failed at {name}: {html.escape(msg)}",
                   ui.compare_table: gr.skip(), ui.compare_plot: gr.skip(), ui.compare_box: gr.skip()}
            return
        yield {ui.compare_status: compare_settings(reqs[0], len(jobs)),
               ui.compare_table: compare_markdown(runs, reqs[0].temperature <= 0),
               ui.compare_plot: viz.depth_acceptance_lines({n: tr for n, (tr, _) in runs.items() if n != "vanilla"}),
               ui.compare_box: gr.skip()}

    def _live(self, ids, drafter, req, vanilla: bool = True):
        for side, d in (("speculative", drafter), ("vanilla", None))[:2 if vanilla else 1]:
            for tr, spent in self.engine.steps(ids, d, req):
                yield side, tr, spent

    def _stream(self, events, builders: dict, record: dict, mlabel: str, style: viz.TreeStyle) -> Iterator[dict]:
        """Each side's steps into `record` and its reply into `builders`; a frame on screen at most
        every FRAME_S seconds, and the last step's."""
        ui = self.ui
        last_frame, tree_height = 0.0, 0  # the tree's figure grows with the run, never shrinks
        for side, tr, spent in events:
            record[side]["traces"].append(tr)
            record[side]["elapsed"].append(spent)
            builders[side].add_trace(tr)
            now = time.perf_counter()
            if now - last_frame < FRAME_S and not tr.get("finished"):
                continue
            last_frame = now
            if side == "speculative":
                fig = viz.tree_figure(tr, self.engine.label_decode, min_height=tree_height, style=style)
                tree_height = fig.layout.height
                steps = len(record[side]["traces"]) - 1
                yield {ui.spec_stats: fmt_stats("speculative", tr, spent, mlabel),
                       ui.spec_reply: viz.spans_html(builders[side].spans, clickable=True),
                       ui.tree_plot: fig,
                       ui.step_slider: gr.Slider(minimum=0, maximum=max(steps, 1), value=steps, interactive=False)}
            else:
                yield {ui.van_stats: fmt_stats("vanilla", tr, spent),
                       ui.van_reply: viz.spans_html(builders[side].spans, legend=False)}

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
            style = _style(present)
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
        def wall(side):  # the run's own decode time, as its summary table shows it
            if (side.get("summary") or {}).get("wall_s") is not None:
                return float(side["summary"]["wall_s"])
            return float(side["elapsed"][-1]) if side.get("elapsed") else None

        try:
            meta = run.get("meta") or {}
            return viz.race_html(spec["traces"], van["traces"] if van else None, wall(spec),
                                 wall(van) if van else None, meta.get("method", "speculative"),
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

    # the tree size choice: the node budget it stands for, and what it costs on this device
    def on_tree_size(self, size, method):
        on_gpu = self.engine.target.device.type == "cuda"
        try:
            m = self.engine.method(method)
        except FastEagleError:
            return gr.skip(), ""
        fast = default_budget(m.key, on_gpu)
        if size != "paper":
            return fast, ""
        return PAPER_BUDGET, paper_tree_note(m, fast, on_gpu)

    # a new method: its own fast budget, or the paper's tree when that is chosen
    def on_method(self, method, size):
        try:
            key = self.engine.method(method).key
        except FastEagleError:
            return gr.skip()
        return PAPER_BUDGET if size == "paper" else default_budget(key, self.engine.target.device.type == "cuda")

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
            return self.finish(run, self._labeler(run), _style(present)) | {self.ui.download: str(p)}
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
        """Token labels from the run's own table (a file from another model), else the engine's."""
        table = run.get("token_labels") or {}
        return lambda ids: "".join(table[i] if i in table else self.engine.label(i) for i in ids)



def _animate(result):
    """A precomputed decode's steps, paced so that each side replays in about ANIMATE_S seconds."""
    for side in [k for k in ("speculative", "vanilla") if k in result]:  # vanilla skipped under load
        traces, elapsed = result[side]["traces"], result[side]["elapsed"]
        pause = min(0.08, ANIMATE_S / max(len(traces), 1))
        for tr, spent in zip(traces, elapsed):
            yield side, tr, spent
            time.sleep(pause)


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


def _style(present) -> viz.TreeStyle:
    """The tree's sizes: large in presentation mode."""
    return viz.LARGE if present else viz.NORMAL

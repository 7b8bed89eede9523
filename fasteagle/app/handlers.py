"""What the app's page does on each event that decodes: the one decoder taken in turns, and example
runs replayed from the cache.

`Handlers` is a `Screen` (screen.py: the page's components, and the events that browse the run on
screen) that also decodes: it turns a run's or a comparison's inputs into their updates. A run validates
its request, replays an example from the cache at once when it can, else waits its turn at the decoder
(the page shows its place and an estimate) and streams the decode. When other pages are waiting as its
turn comes, it decodes only the speculative side and shows vanilla's time modelled from this machine's
measured step, labelled so.
"""

from __future__ import annotations

import html
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gradio as gr

import viz
from fasteagle import files
from fasteagle.app.costs import CostBook
from fasteagle.app.engine import Engine, Request
from fasteagle.app.examples import EXAMPLES, ExampleCache, recorded_run, run_record
from fasteagle.app.screen import UI, Screen, run_labeler, style_for
from fasteagle.app.text import (
    compare_markdown,
    compare_settings,
    fmt_stats,
    paper_tree_note,
    queue_line,
    recorded_note,
    replay_note,
    shared_note,
)
from fasteagle.app.turns import Turns
from fasteagle.errors import FastEagleError
from fasteagle.methods import PAPER_BUDGET, default_budget
from fasteagle.tree import DEFAULT_TREE_SHAPE

log = logging.getLogger("fasteagle.app")

FRAME_S = 0.12  # at most one tree figure per this many seconds while streaming (the last step always)
ANIMATE_S = 6.0  # precomputed runs replay in about this long per side
WAIT_POLL_S = 1.0  # a waiting page looks at its place this often
WAIT_SAY_S = 5.0  # and tells it at least this often (its estimate counts down)


class Handlers(Screen):
    """What the page does on each event, for one engine and one page's components. Every decode takes
    its turn at `turns` (shared by all pages); an example at its defaults replays from `examples`
    without one. `precompute`: decode to the end first (on ZeroGPU, in a GPU function: `decode_both`),
    then animate the steps; otherwise each step is shown as it is decoded.

    The event handlers (on_*) have comments, not docstrings: Gradio publishes a handler's docstring
    as its API description."""

    def __init__(self, engine: Engine, ui: UI, precompute: bool, turns: Turns | None = None,
                 examples: ExampleCache | None = None, decode_both: Callable[[Request, bool], dict] | None = None,
                 costs: CostBook | None = None):
        self.engine, self.ui, self.precompute = engine, ui, precompute
        self.costs = costs or CostBook(engine, None)  # the what-if panel's presets
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
        style = style_for(present)
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
                drafter = engine.drafter(req)
                engine.warmup(drafter)  # (once per drafter) its lazy set-up not billed to this run
                events = self._live(ids, drafter, req, vanilla=not waiting)
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

    # the page's first screen: a finished run, without a click or a decode (the first example's cached
    # run, else the recorded one shipped with the app; nothing when neither exists). Its prompt and stage
    # are in the page as built (`first_screen`); this event sends the other outputs.
    def on_first(self, present=False):
        ui = self.ui
        keep = {c: gr.skip() for c in ui.outputs}
        run = first_run(self.engine, self.examples)
        if run is None:
            return keep
        try:
            upd = self.replay(run, style_for(present))
        except Exception:  # the page still opens, on its empty form
            log.exception("the first screen's run could not be drawn")
            return keep
        if (run.get("meta") or {}).get("recorded"):
            upd[ui.summary] = recorded_note(run["meta"]) + upd[ui.summary].split("\n\n", 1)[-1]
        return keep | upd

    @staticmethod
    def first_screen(engine: Engine, examples: ExampleCache | None) -> tuple[str, str]:
        """(prompt, stage HTML) of the run the page opens on, ("", "") without one."""
        run = first_run(engine, examples)
        if run is None:
            return "", ""
        return (run.get("meta") or {}).get("prompt", ""), viz.stage_html(run, run_labeler(run, engine))

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



def first_run(engine: Engine, examples: ExampleCache | None) -> dict | None:
    """The run the page opens on: the first example's, by the default method, from the cache, else the
    shipped recorded run (when it is this target's)."""
    run = None
    if examples is not None:
        run = examples.get(examples.defaults(EXAMPLES[0], engine.available[0].label))
    return run or recorded_run(engine)


def _animate(result):
    """A precomputed decode's steps, paced so that each side replays in about ANIMATE_S seconds."""
    for side in [k for k in ("speculative", "vanilla") if k in result]:  # vanilla skipped under load
        traces, elapsed = result[side]["traces"], result[side]["elapsed"]
        pause = min(0.08, ANIMATE_S / max(len(traces), 1))
        for tr, spent in zip(traces, elapsed):
            yield side, tr, spent
            time.sleep(pause)

"""FastEagle visualizer: watch speculative decoding draft a tree, verify it, and keep the accepted
path, step by step, next to plain (vanilla) decoding of the same prompt.

    python app.py                    # http://127.0.0.1:7860
    FASTEAGLE_TARGET=<hf id or dir> FASTEAGLE_DRAFTER=<drafter dir> python app.py
    python app.py --target meta-llama/Llama-3.1-8B-Instruct --drafter yuhuili/EAGLE3-LLaMA3.1-Instruct-8B

Environment: FASTEAGLE_TARGET (default: the embedded SmolLM2-135M-Instruct), FASTEAGLE_DRAFTER
(FastEagle drafter dir, default assets/drafters/smollm2-135m-fasteagle), FASTEAGLE_EAGLE3_DRAFTER,
FASTEAGLE_DEVICE / FASTEAGLE_DTYPE, FASTEAGLE_PRECOMPUTE=1 (decode first, then animate: what the
app does on ZeroGPU, which Spaces mark with SPACES_ZERO_GPU), GRADIO_SERVER_PORT / _NAME. The
example prompts' runs are kept in $FASTEAGLE_CACHE/app-examples (default ~/.cache/fasteagle).

This file is the page: its layout and the wiring of its events. The handlers and the engine glue are
`fasteagle/app/` (decoding is `fasteagle.generate.generate`), the pictures `viz`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import torch  # noqa: E402

import viz  # noqa: E402
from fasteagle.app.costs import CostBook  # noqa: E402
from fasteagle.app.engine import EQUAL_INFO, EQUAL_LABEL, MAX_NEW_TOKENS, Engine, Request  # noqa: E402
from fasteagle.app.examples import EXAMPLES, ExampleCache, default_max_new  # noqa: E402
from fasteagle.app.explorer import Explorer  # noqa: E402
from fasteagle.app.handlers import Handlers  # noqa: E402
from fasteagle.app.screen import UI  # noqa: E402
from fasteagle.app.scripts import COMPARE_JS, MARK_STEP_JS, PRESENT_JS, REPLY_JS, SCROLL_JS  # noqa: E402
from fasteagle.app.text import BATCH_NOTE, EXPLAINER, SHORT_EXPLAINER, TREE_SHAPE_LABELS, batch_chart  # noqa: E402
from fasteagle.app.tour import TOUR_CSS, tour_js  # noqa: E402
from fasteagle.app.turns import Turns  # noqa: E402
from fasteagle.env import env  # noqa: E402
from fasteagle.errors import FastEagleError  # noqa: E402
from fasteagle.methods import MAX_BUDGET, PAPER_BUDGET, default_budget  # noqa: E402
from fasteagle.paths import cache_dir  # noqa: E402
from fasteagle.target import Target, load_target  # noqa: E402
from fasteagle.tree import DEFAULT_TREE_SHAPE  # noqa: E402

# Hugging Face ZeroGPU, where the GPU exists only inside functions decorated with spaces.GPU. Spaces
# set SPACES_ZERO_GPU there; `spaces` can be importable on other hardware too, where it must not count.
spaces = None
if os.environ.get("SPACES_ZERO_GPU", "").strip().lower() in ("1", "t", "true", "yes"):
    import spaces  # type: ignore  # noqa: E402

log = logging.getLogger("fasteagle.app")

PLAY_S = 1.2  # the play button's pace: one step per this many seconds
RUN_CONCURRENCY = 64  # pages whose /run is served at once: waiting for the decoder or replaying examples

# the page's styles: its own file, then the pictures' and the tour's
CSS = (Path(__file__).with_name("fasteagle") / "app" / "page.css").read_text(encoding="utf-8") + \
    viz.present_css() + viz.STAGE_CSS + viz.WHATIF_CSS + viz.EXPLORER_CSS + TOUR_CSS + viz.palette_css()



def device_text(target: Target) -> str:
    dev = target.device
    dtype = str(target.dtype).replace("torch.", "")
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        return f"**Device:** CUDA · {name} · {dtype}" + (" · ZeroGPU" if spaces is not None else "")
    return f"**Device:** CPU (torch threads: {torch.get_num_threads()}) · {dtype}" + (
        " · ZeroGPU (decodes run on the GPU)" if spaces is not None else "")


# -- the layout -----------------------------------------------------------------------------------
def layout(engine: Engine, first: tuple[str, str] = ("", "")) -> UI:
    """Every component, in page order (inside a gr.Blocks): the title and presentation mode, a warning
    when FastEagle has no drafter, the settings beside the replies and the tree, the run's charts, the
    comparison of all methods, the trace file buttons and the explainer."""
    target = engine.target
    with gr.Row(equal_height=True, elem_id="header"):
        gr.Markdown("# FastEagle: speculative decoding, step by step\n"
                    f"Target **{target.name}** · " + device_text(target))
        tour_btn = gr.Button("Take the tour ▸", elem_id="tour-btn", scale=0, min_width=140, size="sm")
        present = gr.Checkbox(False, label="Presentation mode", elem_id="present", scale=0, min_width=200,
                              info="large type, projector colours, the settings hidden")
    missing = [m for m in engine.methods if not m.available and m.key == "fasteagle"]
    if missing:
        gr.Markdown(f"⚠️ **FastEagle is not available:** {missing[0].note}", elem_id="drafter-warning")
    run_state, present_state = gr.State(None), gr.State(False)
    # a grid (CSS above): the prompt and Run, then the rest of the settings, beside the run; on a phone
    # the prompt and Run, the run, then the rest
    with gr.Row(elem_id="main"):
        with gr.Column(min_width=280, elem_id="settings-col"):
            settings = _prompt_and_run(first[0])
        with gr.Column(min_width=280, elem_id="run-col"):
            shown = _run_view(first[1])
        with gr.Column(min_width=280, elem_id="settings-rest"):
            settings |= _settings(engine, settings["prompt"])
    summary = gr.Markdown("", elem_id="summary")
    with gr.Row():
        hist_plot = gr.Plot(value=viz.empty_figure("accepted length per step", 280), show_label=False,
                            elem_id="hist-plot")
        depth_plot = gr.Plot(value=viz.empty_figure("acceptance per depth", 280), show_label=False,
                             elem_id="depth-plot")
        time_plot = gr.Plot(value=viz.empty_figure("draft vs verify time", 280), show_label=False,
                            elem_id="time-plot")
    with gr.Accordion("What if? The speed at other tree sizes, from measured costs", open=True, elem_id="whatif-box"):
        whatif = gr.HTML(viz.whatif_html(None), js_on_load=viz.WHATIF_JS, elem_id="whatif")
    compare = _compare_view()
    with gr.Row():
        download = gr.DownloadButton("Download trace (JSON)", value=None, elem_id="download")
        upload = gr.UploadButton("Replay a trace file…", file_types=[".json"], type="filepath", elem_id="upload")
    with gr.Accordion("How it works (for students)", open=False):
        gr.Markdown(EXPLAINER + (BATCH_NOTE if (batches := batch_chart()) else ""))
        gr.Plot(value=batches, show_label=False, elem_id="batch-plot", visible=batches is not None)
    return UI(**settings, **shown, **compare, summary=summary, hist_plot=hist_plot, depth_plot=depth_plot,
              time_plot=time_plot, download=download, upload=upload, present=present, present_state=present_state,
              run_state=run_state, tour_btn=tour_btn, whatif=whatif)


def _compare_view() -> dict[str, Any]:
    """"All methods on this prompt": a progress line, then one table and one per-depth chart."""
    with gr.Accordion("All methods on this prompt", open=False, elem_id="compare-box") as box:
        status = gr.Markdown("**Run all methods** (beside Run) decodes the prompt with vanilla decoding and every "
                             "method here, with the same settings.", elem_id="compare-status")
        table = gr.Markdown("", elem_id="compare-table")
        plot = gr.Plot(value=viz.empty_figure("acceptance per depth, each method", 280), show_label=False,
                       elem_id="compare-plot")
    return {"compare_box": box, "compare_status": status, "compare_table": table, "compare_plot": plot}


def _prompt_and_run(value: str = "") -> dict[str, Any]:
    """The prompt (holding `value`) with Run (and All methods) right under it."""
    prompt = gr.Textbox(value, label="Prompt", lines=3, max_lines=12, elem_id="prompt",
                        placeholder="Ask something, or pick an example below")
    with gr.Row():
        run_btn = gr.Button("Run", variant="primary", elem_id="run", scale=2, min_width=100)
        compare_btn = gr.Button("Run all methods", elem_id="compare", scale=2, min_width=100)
    return {"prompt": prompt, "run_btn": run_btn, "compare_btn": compare_btn}


def _settings(engine: Engine, prompt: gr.Textbox) -> dict[str, Any]:
    """Below the prompt: the method and the examples (which set `prompt`), then the other settings of
    a run behind "Advanced settings"."""
    on_gpu = engine.target.device.type == "cuda"
    methods = [m.label for m in engine.available]
    # created before the examples that set it, drawn in the advanced settings (its place on the page)
    temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0 = greedy)", render=False,
                            elem_id="temperature")
    method = gr.Radio(methods, value=methods[0], label="Drafting method", elem_id="method",
                      info=EQUAL_INFO if EQUAL_LABEL in methods else None)
    gr.Examples(examples=[[e.prompt, e.temperature] for e in EXAMPLES], inputs=[prompt, temperature],
                example_labels=[e.label for e in EXAMPLES], label="Examples", examples_per_page=10, elem_id="examples")
    with gr.Accordion("Advanced settings", open=False, elem_id="advanced"):
        tree_size = gr.Radio([("fast tree (this device's default)", "fast"),
                              (f"paper-size tree ({PAPER_BUDGET} nodes)", "paper")], value="fast",
                             label="Tree size (FastEagle / EAGLE-3)", elem_id="tree-size")
        tree_size_note = gr.Markdown("", elem_id="tree-size-note")
        temperature.render()
        max_new = gr.Slider(1, MAX_NEW_TOKENS, value=default_max_new(on_gpu), step=1,
                            label="Max new tokens", elem_id="max-new")
        with gr.Accordion("Tree settings (FastEagle / EAGLE-3)", open=False):
            tree_k = gr.Textbox(value="", label="Top-k per depth",
                                placeholder="each drafter's own: FastEagle 32, EAGLE-3 10",
                                info="one number, or one per depth: 8,4,2; empty: each drafter's own "
                                     "(what the benchmarks used)")
            budget = gr.Slider(2, MAX_BUDGET, value=default_budget(engine.available[0].key, on_gpu), step=1,
                               label="Node budget", elem_id="budget",
                               info="tree nodes the drafter verifies per step, root included "
                                    "(lookup's branches come on top)")
            tree_shape = gr.Radio([(label, key) for key, label in TREE_SHAPE_LABELS.items()], value=DEFAULT_TREE_SHAPE,
                                  label="Tree shape (FastEagle)", elem_id="tree-shape",
                                  info="both keep the most probable nodes; the paper's lets nothing grow "
                                       "below a runner-up")
        seed = gr.Number(value=0, precision=0, label="Seed (sampling)")
    return {"prompt": prompt, "method": method, "tree_size": tree_size, "tree_size_note": tree_size_note,
            "temperature": temperature, "max_new": max_new, "tree_k": tree_k, "budget": budget,
            "tree_shape": tree_shape, "seed": seed}


def _run_view(stage_value: str = "") -> dict[str, Any]:
    """The right column: the stage (the step on screen in phases, the hero picture), both replies with
    their stats, the badge, the race strip, the replies played at their measured speeds, then the tree in
    detail with its step controls (the short explainer beside it in presentation mode)."""
    stage = gr.HTML(stage_value or viz.stage_html(None), js_on_load=viz.STAGE_JS, elem_id="stage", container=True,
                    padding=True)
    with gr.Row(equal_height=False):
        with gr.Column():
            spec_stats = gr.Markdown("**speculative** · not run yet", elem_id="spec-stats", elem_classes="stats")
            spec_reply = gr.HTML(viz.spans_html([], empty="the reply appears here"), js_on_load=REPLY_JS,
                                 elem_id="spec-reply", container=True, padding=True)
        with gr.Column():
            van_stats = gr.Markdown("**vanilla** · not run yet", elem_id="vanilla-stats", elem_classes="stats")
            van_reply = gr.HTML(viz.spans_html([], legend=False, empty="every token is the target's own"),
                                elem_id="vanilla-reply", container=True, padding=True)
    badge = gr.HTML('<div class="badge info">run a prompt to compare the outputs</div>', elem_id="identical-badge")
    race = gr.HTML("", elem_id="race")
    playback = gr.HTML(viz.playback_html({}), js_on_load=viz.PLAYBACK_JS, elem_id="playback")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=300):
            steps = _step_view()
        with gr.Column(scale=1, min_width=220, visible=False, elem_id="tree-side") as tree_side:
            gr.Markdown(SHORT_EXPLAINER)
    return {"stage": stage, "spec_stats": spec_stats, "spec_reply": spec_reply, "van_stats": van_stats,
            "van_reply": van_reply, "badge": badge, "race": race, "playback": playback, "tree_side": tree_side, **steps}


def _step_view() -> dict[str, Any]:
    """The tree, its step slider with previous / play / next, what the step emitted, and what the
    glyphs in its labels mean."""
    tree_plot = gr.Plot(value=viz.empty_figure(), show_label=False, elem_id="tree-plot")
    # The static maximum bounds what the server accepts; each run narrows the visible range.
    with gr.Row(equal_height=True):
        step_slider = gr.Slider(0, MAX_NEW_TOKENS, value=0, step=1, label="Replay step (after a run)",
                                interactive=False, elem_id="step-slider", scale=6)
        prev_btn = gr.Button("◀ prev", size="sm", elem_id="step-prev", scale=1, min_width=70)
        play_btn = gr.Button("▶ play", size="sm", elem_id="step-play", scale=1, min_width=70)
        next_btn = gr.Button("next ▶", size="sm", elem_id="step-next", scale=1, min_width=70)
    play_timer = gr.Timer(PLAY_S, active=False)
    step_info = gr.Markdown("", elem_id="step-info")
    gr.Markdown(viz.glyph_note() + " Click a token of the speculative reply to see the step that made it.",
                elem_id="glyphs")
    return {"tree_plot": tree_plot, "step_slider": step_slider, "prev_btn": prev_btn, "next_btn": next_btn,
            "play_btn": play_btn, "play_timer": play_timer, "step_info": step_info}



# -- the wiring -----------------------------------------------------------------------------------
def connect(ui: UI, handlers: Handlers) -> None:
    """The events: Run (and Enter in the prompt), the step controls, a trace file, the settings that
    set others, presentation mode and the comparison of all methods."""
    for trigger in (ui.run_btn.click, ui.prompt.submit):
        trigger(None, js=SCROLL_JS, api_name=False, queue=False)
    # many at once: a run waits for the decoder in its own line (fasteagle.app.turns), which tells the page
    # its place, and an example replayed from the cache never waits behind a decode
    ui.run_btn.click(handlers.on_run, ui.run_inputs, ui.outputs,
                     api_name="run", concurrency_limit=RUN_CONCURRENCY, concurrency_id="run")
    ui.prompt.submit(handlers.on_run, ui.run_inputs, ui.outputs,
                     api_visibility="private", concurrency_limit=RUN_CONCURRENCY, concurrency_id="run")
    # queued: gr.Warning reaches the page only from a queued event (else only the server log)
    ui.upload.upload(handlers.on_upload, [ui.upload, ui.present_state], ui.outputs, api_name="replay_file").then(
        handlers.on_replayed, [ui.run_state], handlers.settings_outputs, api_name="replay_settings")
    ui.compare_btn.click(None, js=COMPARE_JS, api_name=False, queue=False)
    ui.compare_btn.click(handlers.on_compare, ui.compare_inputs, ui.compare_outputs, api_name="compare",
                         concurrency_limit=RUN_CONCURRENCY, concurrency_id="run")
    _connect_steps(ui, handlers)
    _connect_settings(ui, handlers)
    ui.tour_btn.click(None, js="() => { if (window.feTour) window.feTour.start(); }", api_name=False, queue=False)


def _connect_steps(ui: UI, handlers: Handlers) -> None:
    """The replay slider, its buttons and timer, a click on a reply token, and what follows the run
    on screen (the race strip, the playback)."""
    # browsing: no queue, no spinner; a step typed past the run's ends reaches the handlers as typed
    # (no preprocess) and they take the nearest end, where Gradio's slider answers a bare "Error"
    quiet = dict(queue=False, show_progress="hidden", preprocess=False)
    ui.step_slider.change(handlers.on_step, [ui.step_slider, ui.run_state, ui.present_state],
                          [ui.tree_plot, ui.step_info], api_name="replay_step", **quiet)
    ui.step_slider.change(None, ui.step_slider, None, js=MARK_STEP_JS, api_name=False, queue=False)
    ui.prev_btn.click(handlers.on_prev, [ui.step_slider, ui.run_state], ui.step_slider, api_name="step_prev", **quiet)
    ui.next_btn.click(handlers.on_next, [ui.step_slider, ui.run_state], ui.step_slider, api_name="step_next", **quiet)
    ui.spec_reply.token(handlers.on_token, [ui.step_slider, ui.run_state], ui.step_slider, api_name=False, **quiet)
    ui.run_state.change(handlers.on_race, ui.run_state, ui.race, api_name=False, **quiet)
    ui.run_state.change(handlers.on_playback, ui.run_state, ui.playback, api_name=False, **quiet)
    ui.run_state.change(handlers.on_stage, ui.run_state, ui.stage, api_name=False, **quiet)
    ui.run_state.change(handlers.on_whatif, ui.run_state, ui.whatif, api_name=False, **quiet)
    playing = gr.State(False)
    ui.play_btn.click(handlers.on_play, [playing, ui.step_slider, ui.run_state],
                      [playing, ui.play_timer, ui.play_btn, ui.step_slider], api_name=False, **quiet)
    ui.play_timer.tick(handlers.on_tick, [ui.step_slider, ui.run_state],
                       [ui.step_slider, playing, ui.play_timer, ui.play_btn], api_name=False, **quiet)


def _connect_settings(ui: UI, handlers: Handlers) -> None:
    """Controls that set others: the method and the tree size set the node budget; presentation mode
    sets the page's look and redraws the tree."""
    # input, not change: a replayed file's method must not reset the node budget it also loads
    ui.method.input(handlers.on_method, [ui.method, ui.tree_size], ui.budget, api_name=False)
    ui.tree_size.input(handlers.on_tree_size, [ui.tree_size, ui.method], [ui.budget, ui.tree_size_note],
                       api_name=False)
    ui.present.change(None, ui.present, None, js=PRESENT_JS, api_name=False, queue=False)
    ui.present.change(handlers.on_present, [ui.present, ui.step_slider, ui.run_state],
                      [ui.present_state, ui.tree_plot, ui.tree_side], api_name=False, queue=False,
                      show_progress="hidden")



# -- the app ----------------------------------------------------------------------------------------
ENGINE: Engine | None = None  # module-level so that a spaces.GPU function can reach it


def _decode_both_plain(req: Request, vanilla: bool = True) -> dict:
    return ENGINE.decode_both(req, vanilla)


_decode_both_gpu = spaces.GPU(duration=120)(_decode_both_plain) if spaces is not None else _decode_both_plain


def build_app(target: Target | None = None, drafter_dir: str | Path | None = None,
              eagle3_dir: str | Path | None = None, precompute: bool | None = None,
              examples: str | Path | None = None) -> gr.Blocks:
    """The Gradio Blocks app. `target`: an already loaded Target (default: FASTEAGLE_TARGET or the
    embedded model); `precompute`: decode first, then animate (always on ZeroGPU); `examples`: the
    folder of the example runs' cache, filled in the background from start-up (on ZeroGPU only on
    first use, which spends no GPU time on examples nobody runs); None: no cache."""
    global ENGINE
    if target is None:
        e = env()
        target = load_target(e.target, e.device, e.dtype)
    engine = Engine(target, drafter_dir, eagle3_dir)
    ENGINE = engine
    if precompute is None:
        precompute = spaces is not None or env().precompute
    if spaces is None:
        engine.warmup()
    turns = Turns()
    cache = ExampleCache(engine, turns, Path(examples)) if examples is not None else None
    costs = CostBook(engine, Path(examples) if examples is not None else None)
    with gr.Blocks(title="FastEagle: speculative decoding, step by step") as demo:
        # the first screen's prompt and stage are in the page itself: drawn before any event answers
        ui = layout(engine, Handlers.first_screen(engine, cache))
        handlers = Handlers(engine, ui, precompute, turns, cache, _decode_both_gpu, costs)
        connect(ui, handlers)
        explorer = Explorer(env().inspect_dirs)  # a room of its own, at the page's foot
        explorer.connect(explorer.layout(), handlers, ui)
        # the first screen: a finished run (an example's from the cache, else the recorded one shipped)
        demo.load(handlers.on_first, [ui.present_state], ui.outputs, api_name=False, show_progress="hidden")
    demo.queue(default_concurrency_limit=1)
    if cache is not None and spaces is None:
        cache.start()
        costs.start(turns)
    return demo


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="The FastEagle app (flags override the FASTEAGLE_* variables).")
    p.add_argument("--target", default=None, help="HF model id or folder (FASTEAGLE_TARGET)")
    p.add_argument("--drafter", default=None, help="FastEagle drafter folder or HF id; an EAGLE-3 checkpoint "
                   "here is shown as the EAGLE-3 method (FASTEAGLE_DRAFTER)")
    p.add_argument("--eagle3-drafter", default=None, help="EAGLE-3 drafter: ours, or a checkpoint of the EAGLE, "
                   "SpecForge or vLLM format, folder or HF id (FASTEAGLE_EAGLE3_DRAFTER)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        e = env()
        target = load_target(args.target or e.target, e.device, e.dtype)
        demo = build_app(target, args.drafter, args.eagle3_drafter, examples=cache_dir() / "app-examples")
    except FastEagleError as exc:
        raise SystemExit(f"error: {exc}") from None
    launch(demo, server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))


def launch(demo: gr.Blocks, **kwargs):
    """demo.launch with the app's theme, CSS and page script (Gradio 6 takes them at launch: the script
    keeps the tree's labels from overlapping); never share=True."""
    kwargs.setdefault("show_error", False)
    kwargs.setdefault("max_threads", RUN_CONCURRENCY + 40)  # waiting pages hold a worker thread between polls
    return demo.launch(theme=theme(), css=CSS, js=page_js(), **kwargs)


def page_js() -> str:
    """The page's script: the tree's label declutter, then the tour."""
    return "() => {\n(" + viz.TREE_JS.strip() + ")();\n" + tour_js() + "\n}"


def theme() -> gr.themes.Base:
    """System fonts only: no font download (the app must work offline)."""
    return gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                          font_mono=["ui-monospace", "Consolas", "monospace"])


if __name__ == "__main__":
    main()

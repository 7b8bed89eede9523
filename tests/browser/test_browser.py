"""The app in a real browser: headless Debian Chromium driven by Playwright for Python, on the
default model. Types a prompt, runs, waits for the tree plot, checks the accepted path, the
vanilla timing and the identical-output badge, replays steps with the slider, and saves
assets/screenshot.png.

Needs `apt-get install -y chromium` and `pip install playwright` (never `playwright install`: the
Debian browser is used). Skipped, with the reason, only when either is absent.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("FASTEAGLE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "assets" / "screenshot.png"
PHONE_SCREENSHOT = SCREENSHOT.with_name("screenshot-phone.png")  # the README's phone view
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
PROMPT = "List the days of the week, one per line, then list them again."
MAX_NEW = 24

pytestmark = [pytest.mark.browser, pytest.mark.integration]

if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python missing: pip install playwright")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _summaries(folder) -> None:
    """Two inspect summaries for the explorer: a small one whose request opens the shipped first run, and
    one of 500 requests (made up: the explorer's speed is what is measured on it)."""
    import random

    from fasteagle import inspection

    run = json.loads((ROOT / "assets" / "first-run.json").read_text())
    small = folder / "small"
    (small / "traces").mkdir(parents=True)
    (small / "traces" / "0000-first.json").write_text(json.dumps(run))
    row = inspection.row_from_steps(run["sides"]["speculative"]["traces"], {"id": "first", "category": "chat",
                                                                           "text": run["meta"]["prompt"]},
                                    trace="traces/0000-first.json")
    doc = inspection.summary([row], {"kind": "engine", "method": "fasteagle"})
    (small / "summary.json").write_text(json.dumps(doc))
    rng = random.Random(0)
    rows = [{"id": f"p{i}", "category": ["qa", "math", "rag", "writing", "translation", "summarization"][i % 6],
             "prompt": f"prompt {i}", "tokens": 64, "forwards": (f := rng.randint(20, 63)), "tau": round(63 / f, 4),
             "drafted_steps": f, "drafted": [f, f // 2], "accepted": [f // 2, f // 4],
             "accepted_histogram": [f // 2, f // 2]}
            for i in range(500)]
    (folder / "big").mkdir()
    (folder / "big" / "summary.json").write_text(json.dumps(inspection.summary(rows, {"kind": "engine"})))


@pytest.fixture(scope="module")
def app_url(smollm, tmp_path_factory):
    import app

    inspect_dir = tmp_path_factory.mktemp("inspect")
    _summaries(inspect_dir)
    os.environ["FASTEAGLE_INSPECT_DIRS"] = str(inspect_dir)
    try:
        demo = app.build_app(smollm)  # the default drafter dir: FastEagle when trained, else lookup only
    finally:
        del os.environ["FASTEAGLE_INSPECT_DIRS"]
    port = _free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    methods = [m.label for m in app.ENGINE.available]
    # the joined method when the trained drafter ships: its trees hold both kinds of node
    yield f"http://127.0.0.1:{port}/", next(m for m in ("FastEagle + lookup", "FastEagle", "lookup") if m in methods)
    demo.close()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    home = tmp_path_factory.mktemp("chromium-home")
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_CACHE_HOME=str(home / "cache"))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS, env=env)
        context = browser.new_context(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
        pg = context.new_page()
        pg.set_default_timeout(120_000)
        yield pg
        context.close()
        browser.close()


def _plot_traces(page, elem_id: str) -> list[dict]:
    return page.evaluate(
        """(id) => { const el = document.querySelector('#' + id + ' .js-plotly-plot');
                     return el && el.data ? el.data.map(t => ({name: t.name, x: t.x ? Array.from(t.x) : [],
                                                               n: t.x ? t.x.length : 0})) : []; }""", elem_id)


# The tree's title; Plotly may be between layouts (no title yet) while it redraws.
TREE_TITLE = "(document.querySelector('#tree-plot .js-plotly-plot')?.layout?.title?.text || '')"



def _set_step(page, step: int) -> None:
    """Move the replay slider with the keyboard, as a person would."""
    rng = page.locator("#step-slider input[type=range]")
    rng.focus()
    page.keyboard.press("Home")
    for _ in range(step):
        page.keyboard.press("ArrowRight")
    page.wait_for_function(
        "(s) => (document.querySelector('#step-info')?.innerText || '').includes('Step ' + s + ' of')", arg=step)


def _present_on(page) -> None:
    """Tick presentation mode and wait for the page to take it. The first screen's stage is in the page as
    built, so it can be on screen before Gradio has bound the checkbox's event: a tick that early is lost, and
    is made again once the box is ticked with no effect."""
    box = page.locator("#present input[type=checkbox]")
    for _ in range(10):
        if not box.is_checked():
            box.check()
        try:
            page.wait_for_function("() => document.body.classList.contains('fe-present')", timeout=3_000)
            return
        except sync_api.TimeoutError:
            box.uncheck()
    page.wait_for_function("() => document.body.classList.contains('fe-present')", timeout=1)


def _first_screen_drawn(page) -> None:
    """Wait for the first screen's stage (in the page as built) and then for its run's outputs (its badge):
    until they land, the run's landing step arrives on the slider and moves the stage from where a test put it."""
    page.wait_for_selector("#stage svg.fe-stage-tree .fe-n circle", timeout=20_000)
    page.wait_for_selector("#identical-badge [data-identical]", timeout=60_000)


def _run(page) -> None:
    """Press Run and wait for the run's end: the badge of the run on screen (the first screen's, at
    first) goes while it decodes, and the new run's comes back."""
    page.locator("#run").click()
    page.wait_for_selector("#identical-badge [data-identical]", state="detached", timeout=60_000)
    page.wait_for_selector("#identical-badge [data-identical]", timeout=180_000)


def _advanced(page) -> None:
    """Open "Advanced settings" (the settings below the method and the examples), unless it is open."""
    if not page.locator("#max-new").is_visible():
        page.locator("#advanced").get_by_text("Advanced settings").first.click()
        page.wait_for_selector("#max-new", state="visible")


def _box(page, selector: str) -> dict:
    return page.evaluate("""(s) => { const b = document.querySelector(s).getBoundingClientRect();
                                     return {l: b.left, r: b.right, t: b.top, b: b.bottom}; }""", selector)


def test_run_and_replay_in_a_browser(app_url, page):
    url, method = app_url
    page.goto(url, wait_until="load")
    # Run sits right under the prompt, above the examples
    page.wait_for_selector("#examples")
    prompt, run_btn, examples = (_box(page, s) for s in ("#prompt", "#run", "#examples"))
    assert prompt["b"] <= run_btn["t"] < prompt["b"] + 40 and run_btn["b"] <= examples["t"], (prompt, run_btn)
    page.locator("#prompt textarea").fill(PROMPT)
    page.locator("#method label", has_text=method).first.click()
    if method != "lookup":  # the node budget follows the method
        import app

        want = str(app.default_budget(app.ENGINE.method(method).key, on_gpu=False))
        _advanced(page)
        page.get_by_text("Tree settings").first.click()  # open the accordion, as a person would to look
        page.wait_for_selector("#budget input[type=number]")
        page.wait_for_function("(v) => document.querySelector('#budget input[type=number]').value === v", arg=want,
                               timeout=20_000)
    _advanced(page)
    num = page.locator("#max-new input[type=number]")
    num.fill(str(MAX_NEW))
    num.press("Enter")
    # The end of the run: the badge compares both outputs.
    try:
        _run(page)
    except sync_api.TimeoutError:
        page.screenshot(path=str(Path(os.environ.get("TMPDIR", "/tmp")) / "fasteagle-browser-failure.png"),
                        full_page=True)
        raise
    # Download the trace as a person would (kept in the temp dir: it explains any failure below).
    with page.expect_download() as dl:
        page.locator("#download").click()
    text = Path(dl.value.path()).read_text(encoding="utf-8")
    (Path(os.environ.get("TMPDIR", "/tmp")) / "fasteagle-browser-trace.json").write_text(text, encoding="utf-8")
    run = json.loads(text)
    badge = page.locator("#identical-badge").inner_text()
    assert page.locator("#identical-badge [data-identical]").get_attribute("data-identical") == "true", badge
    assert "identical outputs" in badge

    # The tree plot, with its highlighted accepted path drawn.
    page.wait_for_selector("#tree-plot .js-plotly-plot .scatterlayer")
    traces = {t["name"]: t for t in _plot_traces(page, "tree-plot")}
    assert "accepted path" in traces and traces["accepted path"]["n"] >= 1
    assert {"accepted", "rejected", "never reached"} <= set(traces)
    assert page.locator("#tree-plot .legendtext", has_text="accepted path").count() == 1

    # Both sides report their timing; the summary has the speed-up and the charts.
    van = page.locator("#vanilla-stats").inner_text()
    spec = page.locator("#spec-stats").inner_text()
    assert "tokens/s" in van and "vanilla" in van and "tokens/s" in spec and "τ" in spec
    assert "Speed-up" in page.locator("#summary").inner_text()
    for chart in ("hist-plot", "depth-plot", "time-plot"):
        assert _plot_traces(page, chart)
    spec_text = page.locator("#spec-reply .fe-reply").inner_text()
    assert spec_text.strip() and spec_text == page.locator("#vanilla-reply .fe-reply").inner_text()
    assert page.locator("#spec-reply .fe-tok").count() >= 1

    # The downloaded trace; pick the step that accepted the most drafts for the screenshot.
    traces_ = run["sides"]["speculative"]["traces"]
    assert run["format"] == "fasteagle-trace" and len(traces_) > 2
    if "lookup" in method:  # the prompt repeats itself: lookup's branches were drafted and drawn as such
        assert any(-1 in t["tree"]["sources"] for t in traces_[1:])
    best = max(range(1, len(traces_)), key=lambda i: (len(traces_[i]["path"]), len(traces_[i]["tree"]["tokens"])))

    # The race strip above the tree: target forwards both ways, the steady number.
    race = page.locator("#race").inner_text()
    assert "target forwards" in race and "steady number" in race
    # Both replies played again side by side: at the end every token is shown, the replies complete.
    page.wait_for_function("() => document.querySelector('#playback .fe-play')?.dataset.playing === 'false'")
    panes = page.locator("#playback .fe-play-text")
    assert panes.nth(0).inner_text() == spec_text and panes.nth(1).inner_text() == spec_text
    assert page.locator("#playback .fe-ptok[style*='hidden']").count() == 0
    # A click on a reply token jumps to the step that emitted it, whose tokens are then outlined.
    _set_step(page, 1)
    tok = page.locator("#spec-reply .fe-tok[data-step='2']").first
    tok.click()
    page.wait_for_function("() => (document.querySelector('#step-info')?.innerText || '').includes('Step 2 of')")
    page.wait_for_function("() => document.querySelector('#spec-reply .fe-tok[data-step=\\'2\\']')"
                           ".classList.contains('fe-sel')")
    outlined = page.evaluate("() => Array.from(document.querySelectorAll('#spec-reply .fe-sel'), t => t.dataset.step)")
    assert outlined and set(outlined) == {"2"}
    # Previous / next step buttons move the slider and the tree.
    _set_step(page, 1)
    page.locator("#step-next").click()
    page.wait_for_function("() => (document.querySelector('#step-info')?.innerText || '').includes('Step 2 of')")
    page.locator("#step-prev").click()
    page.wait_for_function("() => (document.querySelector('#step-info')?.innerText || '').includes('Step 1 of')")

    # Replay: the slider moves the tree to another step without decoding again.
    _set_step(page, 1)
    page.wait_for_function(f"() => {TREE_TITLE}.startsWith('step 1:')")  # a wait, not a read: Plotly may redraw
    step = best if best != 1 else 2
    _set_step(page, step)
    page.wait_for_function(f"(s) => {TREE_TITLE}.startsWith('step ' + s + ':')", arg=step)
    page.wait_for_timeout(500)  # let Plotly finish drawing
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 20_000


def run_lookup(page, url: str | None, max_new: int, present: bool = False) -> None:
    """Open the app (None: the page as it is), run PROMPT with prompt lookup for `max_new` tokens and
    wait for its tree; `present`: in presentation mode (switched on once the settings are made, since
    it hides them; the prompt and Run stay)."""
    if url:
        page.goto(url, wait_until="load")
    page.locator("#method label", has_text="lookup").first.click()
    _advanced(page)
    num = page.locator("#max-new input[type=number]")
    num.fill(str(max_new))
    num.press("Enter")
    if present:
        page.locator("#present input[type=checkbox]").check()
        page.wait_for_function("() => document.body.classList.contains('fe-present')")
        page.evaluate("() => window.scrollTo(0, 0)")
    page.locator("#prompt textarea").fill(PROMPT)
    _run(page)
    page.wait_for_selector("#tree-plot .js-plotly-plot .scatterlayer")


def test_an_error_keeps_the_last_run_on_screen(app_url, page):
    """A refused prompt shows a warning and leaves the previous run as it was (no blanked outputs,
    no 500 from a chained event fed a blank value)."""
    url, _ = app_url
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 500 else None)
    run_lookup(page, url, 8)
    reply = page.locator("#spec-reply .fe-reply").inner_text()
    badge = page.locator("#identical-badge").inner_text()
    info = page.locator("#step-info").inner_text()
    assert reply.strip() and "Step" in info

    page.locator("#prompt textarea").fill("   ")
    page.locator("#run").click()
    page.wait_for_selector(".toast-body", timeout=30_000)
    assert "empty" in page.locator(".toast-body").first.inner_text()
    page.wait_for_timeout(1500)  # any (wrong) blanking of the outputs and the slider's event would land here
    assert page.locator("#spec-reply .fe-reply").inner_text() == reply
    assert page.locator("#identical-badge").inner_text() == badge
    assert page.locator("#step-info").inner_text() == info
    assert _plot_traces(page, "tree-plot")
    assert page.locator("#step-slider input[type=number]").input_value() != ""
    assert not failed, failed


# The tree on screen: the svg, title, toolbar and plot area, the labels drawn (not hidden as overlapping)
# and how many were hidden, the charts' titles, and the rows' planned and actual height.
TREE_BOXES = """() => {
    const root = document.querySelector('#tree-plot .js-plotly-plot');
    const r = (el) => { const b = el.getBoundingClientRect();
                        return {l: b.left, t: b.top, r: b.right, b: b.bottom, w: b.width, h: b.height}; };
    const bar = root.querySelector('.modebar');
    return {plot: r(root.querySelector('.main-svg')), title: r(root.querySelector('.gtitle')),
            bar: bar ? r(bar) : null, area: r(root.querySelector('.nsewdrag')),
            step: root.layout.title.text,
            labels: Array.from(root.querySelectorAll('.scatterlayer .trace')).flatMap(g => {
                const clip = !(g.__data__ && g.__data__[0] && g.__data__[0].trace.cliponaxis === false);
                return Array.from(g.querySelectorAll('.textpoint text'))
                            .filter(t => t.textContent && getComputedStyle(t).visibility !== 'hidden')
                            .map(t => Object.assign(r(t), {clip, text: t.textContent})); }),
            hidden: root.querySelectorAll('.textpoint text[data-fe-hidden]').length,
            charts: ['hist-plot', 'depth-plot', 'time-plot'].map(id => {
                const p = document.querySelector('#' + id + ' .js-plotly-plot');
                return {id, plot: r(p.querySelector('.main-svg')), title: r(p.querySelector('.gtitle'))}; }),
            rows: root.layout.meta.plot_px, area_h: root._fullLayout._size.h}; }"""


def _check_tree_boxes(boxes: dict) -> None:
    """Labels inside the plot and apart, titles inside their plots, rows as tall as planned."""
    plot, title = boxes["plot"], boxes["title"]
    assert boxes["labels"], boxes["step"]
    for b in boxes["labels"]:  # a trace clipped to its axes cuts what lies outside them
        box = boxes["area"] if b["clip"] else plot
        assert box["l"] - 1 <= b["l"] and b["r"] <= box["r"] + 1 and box["t"] - 1 <= b["t"] and \
            b["b"] <= box["b"] + 1, (b, box)
    # no two labels drawn over each other (one that would overlap is hidden; hovering shows its token)
    labels = boxes["labels"]
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            assert a["r"] <= b["l"] + 0.5 or b["r"] <= a["l"] + 0.5 or a["b"] <= b["t"] + 0.5 or \
                b["b"] <= a["t"] + 0.5, (boxes["step"], a, b)
    # every title fits its plot's width, and the legend's extra rows did not squeeze the tree's rows
    for chart in [{"id": "tree-plot", "plot": plot, "title": title}, *boxes["charts"]]:
        assert chart["plot"]["l"] - 1 <= chart["title"]["l"] and chart["title"]["r"] <= chart["plot"]["r"] + 1, chart
    assert boxes["area_h"] >= boxes["rows"] - 1, boxes


def test_the_tree_fits_a_narrow_screen(app_url, page):
    """At 390 px wide (a phone) the tree's labels lie inside the plot without overlapping at every
    step (a long lookup chain crowds them: some are hidden), the titles fit their plots, and the
    Plotly toolbar does not cover the tree's title."""
    url, _ = app_url
    context = page.context.browser.new_context(viewport={"width": 390, "height": 844})  # the same browser
    try:
        pg = context.new_page()
        pg.set_default_timeout(120_000)
        run_lookup(pg, url, MAX_NEW)
        plot = pg.locator("#tree-plot .js-plotly-plot")
        plot.scroll_into_view_if_needed()
        plot.hover()  # the toolbar shows on hover
        pg.wait_for_timeout(800)
        first = pg.evaluate(TREE_BOXES)
        # the README's phone view: the tree and its controls, the toolbar away (the mouse off the plot)
        pg.evaluate("() => document.querySelector('#tree-plot').scrollIntoView({block: 'start'})")
        pg.mouse.move(5, pg.viewport_size["height"] - 5)
        pg.wait_for_timeout(500)
        pg.screenshot(path=str(PHONE_SCREENSHOT))
        every = [first]
        _set_step(pg, 1)
        last = int(pg.locator("#step-slider input[type=range]").get_attribute("max") or 0)
        for step in range(1, last + 1):
            if step > 1:
                pg.locator("#step-next").click()
            pg.wait_for_function(f"() => {TREE_TITLE}.startsWith('step {step}:')")
            pg.wait_for_timeout(300)  # Plotly's afterplot hides the labels that would overlap
            every.append(pg.evaluate(TREE_BOXES))
    finally:
        context.close()
    bar, title = first["bar"], first["title"]
    if bar and bar["w"] > 0 and bar["h"] > 0:
        apart = bar["b"] <= title["t"] or title["b"] <= bar["t"] or bar["r"] <= title["l"] or title["r"] <= bar["l"]
        assert apart, (bar, title)
    for boxes in every:
        _check_tree_boxes(boxes)
    assert any(b["hidden"] for b in every), [b["step"] for b in every]  # a crowded step was decluttered


def test_an_example_sets_the_prompt_and_the_temperature(app_url, page):
    import app

    url, _ = app_url
    page.goto(url, wait_until="load")
    sampled = next(e for e in app.EXAMPLES if e.temperature > 0)
    page.get_by_text(sampled.label, exact=True).first.click()
    page.wait_for_function("(p) => document.querySelector('#prompt textarea').value === p", arg=sampled.prompt)
    _advanced(page)
    page.wait_for_function("(t) => Number(document.querySelector('#temperature input[type=number]').value) === t",
                           arg=sampled.temperature)


def test_play_steps_through_the_run(app_url, page):
    url, _ = app_url
    run_lookup(page, url, 12)
    _set_step(page, 0)
    page.locator("#step-play").click()
    page.wait_for_function("() => (document.querySelector('#step-info')?.innerText || '').includes('Step 2 of')",
                           timeout=20_000)
    assert "pause" in page.locator("#step-play").inner_text()
    page.locator("#step-play").click()
    page.wait_for_function("() => document.querySelector('#step-play').innerText.includes('play')")


PLAYBACK = """() => { const root = document.querySelector('#playback .fe-play');
    const shown = (t) => [Number(t.dataset.t), t.style.visibility !== 'hidden'];
    return {clock: Number(root.dataset.clock), playing: root.dataset.playing,
            panes: Array.from(root.querySelectorAll('.fe-play-side'),
                              (pane) => Array.from(pane.querySelectorAll('.fe-ptok'), shown))}; }"""


def test_the_replies_play_at_their_measured_speeds(app_url, page):
    """After a run both replies play side by side on one clock: a token shows once the clock passes
    the end of the step that emitted it (vanilla's one by one, the speculative ones in bursts); replay
    at a quarter of the speed plays it again, slower."""
    import time

    url, _ = app_url
    run_lookup(page, url, 24)
    page.wait_for_function("() => document.querySelector('#playback .fe-play')?.dataset.playing === 'false'")
    start = time.monotonic()
    page.locator("#playback .fe-play-speed").select_option("0.25")  # a new speed plays it again
    seen = []
    while time.monotonic() - start < 90:
        seen.append(page.evaluate(PLAYBACK))
        if seen[-1]["playing"] == "false":
            break
        page.wait_for_timeout(100)
    took = time.monotonic() - start
    mid = [s for s in seen if s["playing"] == "true"]
    assert len(mid) >= 3, seen[-1]
    for state in seen:  # the clock and what is shown are set in one frame
        for pane in state["panes"]:
            assert all(shown == (t <= state["clock"]) for t, shown in pane), state
    assert any(not all(shown for _, shown in pane) for s in mid for pane in s["panes"])  # it was mid-way
    spec, van = seen[-1]["panes"]
    assert seen[-1]["playing"] == "false" and all(shown for _, shown in spec + van)
    assert len({t for t, _ in spec}) < len(spec)  # speculative tokens come in bursts, one per step
    assert len({t for t, _ in van}) == len(van)  # vanilla's one at a time
    total_s = max(t for t, _ in spec + van) / 1000
    assert 4 * total_s * 0.9 <= took <= 4 * total_s + 10, (total_s, took)  # a quarter of the speed


def test_presentation_mode(app_url, page):
    """Large type, projector colours and the explainer beside the tree; a run brings the tree into
    view."""
    import app

    url, _ = app_url
    page.goto(url, wait_until="load")
    assert not page.locator("#tree-side").is_visible()
    _present_on(page)
    page.wait_for_selector("#tree-side", state="visible")
    assert "Reading the tree" in page.locator("#tree-side").inner_text()
    assert "␣ a space" in page.locator("#glyphs").inner_text() and "↵ a newline" in page.locator("#glyphs").inner_text()
    page.locator("#present input[type=checkbox]").uncheck()
    page.wait_for_function("() => !document.body.classList.contains('fe-present')")
    run_lookup(page, None, 12, present=True)
    stage = _box(page, "#stage")
    assert -2 <= stage["t"] < page.viewport_size["height"] / 2, stage  # scrolled to the stage
    assert not page.locator("#settings-rest").is_visible() and page.locator("#run").is_visible()
    sizes = page.evaluate("""() => { const p = document.querySelector('#tree-plot .js-plotly-plot');
        return [p.layout.title.font.size, p.data.find(t => t.name === 'accepted').textfont.size]; }""")
    assert sizes == [app.viz.LARGE.title_px, app.viz.LARGE.label_px]
    chip = page.evaluate("() => getComputedStyle(document.querySelector('#spec-reply .fe-chip[data-depth=\"1\"]'))"
                         ".backgroundColor")
    r, g, b = (int(app.viz.tokens.PRESENT_COLORS[1][i:i + 2], 16) for i in (1, 3, 5))
    assert chip == f"rgb({r}, {g}, {b})"
    page.locator("#present input[type=checkbox]").uncheck()
    page.wait_for_function("() => !document.body.classList.contains('fe-present')")
    page.wait_for_function(f"() => document.querySelector('#tree-plot .js-plotly-plot')?.layout?.title?.font?.size"
                           f" === {app.viz.NORMAL.title_px}")
    page.wait_for_selector("#tree-side", state="hidden")


# The tree's node markers and visible labels, and the title, in page pixels (presentation mode check).
TREE_TOP = """() => {
    const root = document.querySelector('#tree-plot .js-plotly-plot');
    const r = (el) => { const b = el.getBoundingClientRect(); return {l: b.left, t: b.top, r: b.right, b: b.bottom}; };
    const shown = (el) => getComputedStyle(el).visibility !== 'hidden' && el.getBoundingClientRect().width > 0;
    return {title: r(root.querySelector('.gtitle')), step: root.layout.title.text,
            nodes: Array.from(root.querySelectorAll('.scatterlayer .point, .scatterlayer .textpoint text'))
                        .filter(shown).map(r)}; }"""


@pytest.mark.parametrize("size", [(1440, 900), (1920, 1080)])
def test_presentation_mode_fits_a_projector(app_url, page, size):
    """Presentation mode at a projector's sizes, with a paper-size tree (its title takes more lines, and
    folded nodes a line of their own): the title ends above the tree's top nodes and labels, the
    labels lie apart inside the plot, and the explainer stands beside the tree, not over it. A
    screenshot of each size goes to assets/screenshot-present-<width>.png."""
    import app

    url, method = app_url
    width, height = size
    context = page.context.browser.new_context(viewport={"width": width, "height": height})
    try:
        pg = context.new_page()
        pg.set_default_timeout(180_000)
        pg.goto(url, wait_until="load")
        pg.locator("#prompt textarea").fill(PROMPT)
        pg.locator("#method label", has_text=method).first.click()
        _advanced(pg)
        pg.locator("#tree-size label", has_text="paper").first.click()
        num = pg.locator("#max-new input[type=number]")
        num.fill("12")
        num.press("Enter")
        pg.locator("#present input[type=checkbox]").check()  # it hides the settings made above
        pg.wait_for_function("() => document.body.classList.contains('fe-present')")
        _run(pg)
        pg.wait_for_function(f"() => document.querySelector('#tree-plot .js-plotly-plot')?.layout?.title?.font?.size"
                             f" === {app.viz.LARGE.title_px}")
        seen = []
        for step in (None, 1):  # the step it lands on, then the first
            if step is not None:
                _set_step(pg, step)
            pg.locator("#tree-plot").scroll_into_view_if_needed()
            pg.mouse.move(5, height - 5)
            pg.wait_for_timeout(800)  # Plotly's afterplot hides the labels that would overlap
            seen.append((pg.evaluate(TREE_TOP), pg.evaluate(TREE_BOXES)))
        pg.evaluate("() => document.querySelector('#tree-plot').scrollIntoView({block: 'start'})")
        pg.wait_for_timeout(500)
        pg.screenshot(path=str(SCREENSHOT.with_name(f"screenshot-present-{width}.png")))
        side, tree = _box(pg, "#tree-side"), _box(pg, "#tree-plot")
    finally:
        context.close()
    assert tree["r"] <= side["l"] + 0.5, (tree, side)  # side by side, not over each other
    for top, boxes in seen:
        assert top["nodes"], top["step"]
        assert top["title"]["b"] <= min(n["t"] for n in top["nodes"]) + 0.5, (top["step"], top["title"])
        _check_tree_boxes(boxes)


def test_all_methods_on_one_prompt(app_url, page):
    """Run all methods: a progress line while each decodes, then one table (a row per method and
    vanilla) and one per-depth chart (a line per method), in the section that opens below the charts."""
    import app

    url, _ = app_url
    page.goto(url, wait_until="load")
    page.locator("#prompt textarea").fill(PROMPT)
    _advanced(page)
    num = page.locator("#max-new input[type=number]")
    num.fill("8")
    num.press("Enter")
    page.locator("#compare").click()
    status = "(document.querySelector('#compare-status')?.innerText || '')"
    page.wait_for_function(f"() => {status}.includes('decoding with')")  # the progress line
    page.wait_for_function(f"() => {status}.includes('decodes of')", timeout=300_000)
    names = ["vanilla", *(m.label for m in app.ENGINE.available)]
    rows = page.locator("#compare-table tbody tr").all_inner_texts()
    assert [r.split("\t")[0].strip() for r in rows] == names, rows
    assert all("✔ yes" in r for r in rows[1:]), rows  # greedy: every method writes vanilla's reply
    page.wait_for_selector("#compare-plot .js-plotly-plot .scatterlayer")
    assert [t["name"] for t in _plot_traces(page, "compare-plot")] == names[1:]


# The first screen's parts, in viewport pixels: the stage's tree nodes and the speculative reply.
FIRST_SCREEN = """() => {
    const r = (el) => { if (!el) return null; const b = el.getBoundingClientRect();
                        return {l: b.left, t: b.top, r: b.right, b: b.bottom}; };
    return {nodes: Array.from(document.querySelectorAll('#stage svg.fe-stage-tree .fe-n circle'), r),
            reply: r(document.querySelector('#stage .fe-stage-reply')), spec: r(document.querySelector('#spec-reply')),
            race: r(document.querySelector('#race')), h: window.innerHeight, w: window.innerWidth}; }"""


@pytest.mark.parametrize("size", [(1440, 900), (390, 844)])
def test_the_first_screen_shows_a_finished_run(app_url, page, size):
    """With no click: a finished run (the shipped recorded one, or a cached example's) with its tree's
    nodes and the speculative reply inside the first viewport; at 1440x900 both replies and the race too.
    Screenshots go to assets/screenshot-first-<width>.png.

    The time from the load event is printed (3 loads, each in a new browser context) and bounded only
    loosely: on 2 cores that also run the server and the rest of the suite it moves from 1.5 to 4 s, so a
    3-s target is a measurement, not a test. The bound catches a first screen that waits on a decode."""
    import statistics
    import time

    url, _ = app_url
    width, height = size
    took = []
    for attempt in range(3):
        context = page.context.browser.new_context(viewport={"width": width, "height": height})
        try:
            pg = context.new_page()
            pg.goto(url, wait_until="load")
            start = time.monotonic()  # from the page's load event
            pg.wait_for_selector("#stage svg.fe-stage-tree .fe-n circle", timeout=20_000)
            took.append(time.monotonic() - start)
            if attempt == 0:
                pg.wait_for_timeout(300)
                seen = pg.evaluate(FIRST_SCREEN)
                pg.screenshot(path=str(SCREENSHOT.with_name(f"screenshot-first-{width}.png")))
                prompt = pg.locator("#prompt textarea").input_value()
        finally:
            context.close()
    print(f"first screen at {width}x{height}: {', '.join(f'{t:.2f}' for t in took)} s after load")
    assert statistics.median(took) <= 8.0, took
    assert prompt.strip()  # the run's prompt is in the box: Run decodes it here
    inside = lambda b: b and 0 <= b["t"] and b["b"] <= seen["h"] and b["r"] <= seen["w"] + 1  # noqa: E731
    assert len(seen["nodes"]) >= 3 and all(inside(n) for n in seen["nodes"]), seen
    assert inside(seen["reply"]), seen
    if width >= 1024:
        assert inside(seen["spec"]) and inside(seen["race"]), seen


STAGE = """() => ({state: window.feStage.state(), say: document.querySelector('#stage .fe-stage-say').innerText,
    shown: document.querySelectorAll('#stage .fe-stage-tree g.fe-n:not(.fe-hide)').length,
    all: document.querySelectorAll('#stage .fe-stage-tree g.fe-n').length,
    marks: Array.from(document.querySelectorAll('#stage .fe-stage-tree g.fe-n text'), t => t.textContent),
    slider: document.querySelector('#step-slider input[type=number]').value})"""


def test_the_stage_plays_each_step_in_phases(app_url, page):
    """The stage's arrows walk a step's five phases in order and on into the next step, which the
    page's slider follows; the walk marks every judged node (✓ ✗ ○), not by colour alone; with the
    browser's reduce-motion setting the draft shows whole at once."""
    url, _ = app_url
    page.emulate_media(reduced_motion="reduce")
    page.goto(url, wait_until="load")
    _first_screen_drawn(page)
    start = page.evaluate(STAGE)["state"]
    page.evaluate("() => window.feStage.goto(window.feStage.best(), 0)")
    page.wait_for_timeout(200)
    draft = page.evaluate(STAGE)
    assert draft["state"]["phase"] == 0 and draft["say"].startswith("1 ·") and draft["shown"] == draft["all"]
    said = [draft["say"][:1]]
    for _ in range(4):
        page.locator("#stage button[data-go='1']").click()
        page.wait_for_timeout(150)
        said.append(page.evaluate(STAGE)["say"][:1])
    assert said == ["1", "2", "3", "4", "5"]
    end = page.evaluate(STAGE)
    assert "✓" in end["marks"] and ({"✗", "○"} & set(end["marks"]) or end["marks"].count("✓") >= 1)
    page.locator("#stage button[data-go='1']").click()  # past the bonus: the next step's draft
    page.wait_for_function("(s) => window.feStage.state().step === s + 1", arg=end["state"]["step"])
    page.wait_for_function("(s) => document.querySelector('#step-slider input[type=number]').value === String(s + 1)",
                           arg=end["state"]["step"])
    page.locator("#stage button[data-go='-1']").click()
    assert page.evaluate(STAGE)["state"] == {**end["state"], "phase": 4}
    assert start["kind"] in ("cascade", "eagle3", "lookup")


@pytest.mark.parametrize("size", [(1440, 900), (390, 844)])
def test_the_tour_walks_every_card(app_url, page, size):
    """The tour opens from its button, highlights a part of the page on every card, each card inside the
    screen (on a phone too, where it sits at the bottom), asks for a prediction (a tap on the stage's
    tree, answered right or wrong) and ends in the prompt box. A card's screenshot at 1440x900:
    assets/screenshot-tour.png."""
    from fasteagle.app.tour import CARDS

    url, _ = app_url
    width, height = size
    page.set_viewport_size({"width": width, "height": height})
    try:
        page.goto(url, wait_until="load")
        _first_screen_drawn(page)
        page.evaluate("() => window.feStage.goto(1, 4)")  # away from the step the tour shows
        page.wait_for_function("() => document.querySelector('#step-slider input[type=number]').value === '1'")
        page.locator("#tour-btn").click()
        for i, card in enumerate(CARDS):
            page.wait_for_function("(i) => document.querySelector('#fe-tour')?.dataset.card === String(i)", arg=i)
            assert page.locator(".fe-tour-spot").count() == 1, card.title
            assert card.title in page.locator("#fe-tour h3").inner_text()
            page.wait_for_timeout(500)  # (placed again once the page's smooth scroll has ended)
            tour_box = _box(page, "#fe-tour")
            assert 0 <= tour_box["t"] and tour_box["b"] <= height and 0 <= tour_box["l"] and tour_box["r"] <= width, \
                (card.title, tour_box)
            if card.phase is not None:
                assert page.evaluate("() => window.feStage.state().phase") in (card.phase, 2 if card.predict else -1)
            if card.predict:
                page.wait_for_selector("#stage g.fe-pick")
                page.keyboard.press("Tab")  # the keyboard reaches the pickable nodes too
                page.locator("#stage g.fe-pick").first.click()
                verdict = page.locator("#fe-tour .fe-tour-verdict").inner_text()
                assert verdict.startswith("✓") or verdict.startswith("✗")
            if i == 1 and width == 1440:
                page.screenshot(path=str(SCREENSHOT.with_name("screenshot-tour.png")))
                step = page.evaluate("() => window.feStage.state().step")  # the page's slider follows the tour
                page.wait_for_function("(s) => document.querySelector('#step-slider input[type=number]').value === "
                                       "String(s)", arg=step)
            page.locator("#fe-tour .fe-tour-next").click()
        assert page.locator("#fe-tour").count() == 0  # done closes it
        assert page.evaluate("() => document.activeElement === document.querySelector('#prompt textarea')")
        page.locator("#tour-btn").click()
        page.wait_for_selector("#fe-tour")
        page.keyboard.press("Escape")
        page.wait_for_selector("#fe-tour", state="detached")
    finally:
        page.set_viewport_size({"width": 1440, "height": 1000})  # the page fixture's own, for the tests after


def test_the_projector_shows_tree_reply_and_replay_controls_at_once(app_url, page):
    """Presentation mode at 1920x1080 with the first screen's run: the stage's tree, its replay slider
    and both replies inside the viewport, the settings hidden."""
    url, _ = app_url
    context = page.context.browser.new_context(viewport={"width": 1920, "height": 1080})
    try:
        pg = context.new_page()
        pg.goto(url, wait_until="load")
        pg.wait_for_selector("#stage svg.fe-stage-tree .fe-n circle", timeout=20_000)
        _present_on(pg)
        pg.evaluate("() => document.querySelector('#stage').scrollIntoView({block: 'start'})")
        pg.wait_for_timeout(400)
        boxes = {s: _box(pg, s) for s in ("#stage .fe-stage-tree", "#stage .fe-stage-steps", "#spec-reply",
                                          "#vanilla-reply")}
        pg.screenshot(path=str(SCREENSHOT.with_name("screenshot-present-1920.png")))
        hidden = not pg.locator("#settings-rest").is_visible()
    finally:
        context.close()
    assert hidden
    for name, b in boxes.items():
        assert 0 <= b["t"] and b["b"] <= 1080, (name, b)


def test_the_sampling_inspector_shows_a_draw_and_draws_a_thousand_times(app_url, page):
    """A sampled run: a click on a judged node of the stage shows the target's distribution at its
    parent, each draft's draw against p'(x), and 1,000 draws by the same rule, whose shares pass the
    chi-square test of tests/test_verify.py against p."""
    from tests.test_sampling_view import chi_square

    url, method = app_url
    page.goto(url, wait_until="load")
    page.locator("#method label", has_text=method).first.click()
    _advanced(page)
    temp = page.locator("#temperature input[type=number]")
    temp.fill("0.7")
    temp.press("Enter")
    num = page.locator("#max-new input[type=number]")
    num.fill("16")
    num.press("Enter")
    page.locator("#prompt textarea").fill("Write a short poem about the sea.")
    _run(page)
    page.wait_for_function("() => window.feStage && JSON.parse(document.querySelector('#stage .fe-stage').dataset.run)"
                           ".steps.some(s => s.dists)")
    node = page.evaluate("""() => { const run = JSON.parse(document.querySelector('#stage .fe-stage').dataset.run);
        for (const st of run.steps) if (st.draws) { const i = st.draws.findIndex((u, j) => j > 0 && u >= 0);
          if (i > 0) return [st.s, i]; } return null; }""")
    assert node, "no judged node in the sampled run"
    page.evaluate("(n) => { window.feStage.goto(n[0], 4); }", node)
    page.locator(f"#stage g.fe-insp[data-node='{node[1]}']").click()
    box = page.locator("#stage .fe-inspect")
    assert "distribution" in box.inner_text() and ("u = " in box.inner_text())
    assert page.locator("#stage .fe-dist-row").count() >= 2
    page.locator("#stage .fe-draw-many").click()
    counts = json.loads(box.get_attribute("data-counts"))
    p = json.loads(box.get_attribute("data-p"))
    assert sum(counts) == 1000
    stat, crit = chi_square(counts, p)
    assert stat < crit, (stat, crit)


def test_eagle3s_draft_grows_depth_by_depth_and_the_cascades_at_once(app_url, page):
    """The draft phase in motion: for EAGLE-3 the nodes of depth d show only after its d-th pass (one
    pass bar per depth), for the cascade every depth shows at once after its one pass."""
    import app

    url, _ = app_url
    if "EAGLE-3" not in [m.label for m in app.ENGINE.available]:
        pytest.skip("no EAGLE-3 drafter here")
    page.emulate_media(reduced_motion="no-preference")
    page.goto(url, wait_until="load")
    page.wait_for_selector("#stage svg.fe-stage-tree .fe-n circle", timeout=20_000)
    shown = "() => document.querySelectorAll('#stage .fe-stage-tree g.fe-n:not(.fe-hide)').length"
    passes = "() => document.querySelectorAll('#stage .fe-pass-row').length"
    # the first screen's run is the cascade's: one pass, then every node at once
    page.evaluate("() => window.feStage.goto(window.feStage.best(), 0)")
    page.wait_for_timeout(1200)
    cascade_all = page.evaluate("() => document.querySelectorAll('#stage .fe-stage-tree g.fe-n').length")
    assert page.evaluate(shown) == cascade_all and page.evaluate(passes) == 2  # 1 pass + verify
    page.locator("#method label", has_text="EAGLE-3").first.click()
    _advanced(page)
    num = page.locator("#max-new input[type=number]")
    num.fill("16")
    num.press("Enter")
    page.locator("#prompt textarea").fill(PROMPT)
    _run(page)
    page.wait_for_function("() => window.feStage.state().kind === 'eagle3'")
    page.evaluate("() => window.feStage.goto(window.feStage.best(), 0)")
    seen = []
    for _ in range(12):
        seen.append(page.evaluate(shown))
        page.wait_for_timeout(250)
    assert seen[0] < seen[-1] and len(set(seen)) >= 3, seen  # the tree grew in several beats
    assert page.evaluate(passes) >= 3  # one bar per pass, then verify


WHATIF = """() => { const b = document.querySelector('#whatif .fe-whatif');
    return {ready: b && b.dataset.ready, read: (b.querySelector('.fe-wi-read') || {}).innerText || '',
            note: (b.querySelector('.fe-wi-note') || {}).innerText || '',
            state: window.feWhatIf && window.feWhatIf.state(),
            points: (b.querySelector('.fe-wi-plot polyline') || {getAttribute: () => ''}).getAttribute('points'),
            run: !!b.querySelector('.fe-wi-plot rect'), ranks: b.querySelectorAll('.fe-wi-ranks tr').length}; }"""


def test_the_what_if_panel_answers_its_sliders_at_once(app_url, page):
    """The first screen's run in the what-if panel: its curve with the run measured on it; the budget
    slider, moved by the keyboard, and the costs' presets redraw the read-out in the same frame (no
    server call); the GPU preset goes to bigger trees. Screenshot: assets/screenshot-whatif.png."""
    url, _ = app_url
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.goto(url, wait_until="load")
    page.wait_for_function("() => document.querySelector('#whatif .fe-whatif')?.dataset.ready === '1'",
                           timeout=30_000)
    first = page.evaluate(WHATIF)
    assert first["state"]["budget"] == 6 and first["run"] and first["ranks"] >= 3, first
    assert "tokens per step" in first["read"] and "replayed" in first["note"]
    rng = page.locator("#whatif input.fe-wi-budget")
    rng.focus()
    took = page.evaluate("""() => new Promise((done) => {
        const el = document.querySelector('#whatif input.fe-wi-budget');
        const read = document.querySelector('#whatif .fe-wi-read');
        const before = read.innerText, t0 = performance.now();
        el.value = el.max; el.dispatchEvent(new Event('input'));
        done({ms: performance.now() - t0, changed: read.innerText !== before}); })""")
    assert took["changed"] and took["ms"] < 50, took
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    assert page.evaluate(WHATIF)["state"]["budget"] == 2
    page.evaluate("() => window.feWhatIf.set(60)")
    at60 = page.evaluate(WHATIF)
    assert "Tree, 56 nodes" in at60["read"] or "Tree, 64 nodes" in at60["read"] or "Tree, 60" in at60["read"]
    page.locator("#whatif").get_by_text("H200").click()
    gpu = page.evaluate(WHATIF)
    assert gpu["state"]["preset"] == 1 and not gpu["run"] and gpu["read"] != at60["read"]
    page.evaluate("() => window.feWhatIf.set(128)")
    assert "Tree, 128 nodes" in page.evaluate(WHATIF)["read"]
    page.evaluate("() => window.feWhatIf.set(32, undefined, 0)")
    page.locator("#whatif-box").scroll_into_view_if_needed()
    page.locator("#whatif-box").screenshot(path=str(SCREENSHOT.with_name("screenshot-whatif.png")))


def _pick(page, dropdown: str, text: str) -> None:
    """Choose the option of a Gradio dropdown that contains `text`, by the keyboard, as a person may."""
    box = page.locator(f"{dropdown} input")
    box.click()
    box.fill(text)
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")


def test_the_explorer_opens_500_requests_sorts_them_and_opens_one(app_url, page):
    """The explorer lists the operator's summaries: 500 requests open in under 2 s and re-sort in under
    200 ms (in the browser, header click to table redrawn); a request of a summary with traces opens its
    steps in the main view."""
    import time

    url, _ = app_url
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.goto(url, wait_until="load")
    page.wait_for_selector("#stage svg.fe-stage-tree .fe-n circle", timeout=20_000)
    page.locator("#explorer-box").get_by_text("Explore a prompt set").first.click()
    start = time.monotonic()
    _pick(page, "#explore-a", "big")
    page.wait_for_function("() => document.querySelector('#explorer .fe-explorer')?.dataset.ready === '1' && "
                           "document.querySelectorAll('#explorer tbody tr').length === 500", timeout=10_000)
    opened = time.monotonic() - start
    assert opened < 2.0, opened
    took = page.evaluate("""() => { const b = document.querySelector('#explorer th button[data-key=tau]');
        const t0 = performance.now(); b.click();
        const first = document.querySelector('#explorer tbody tr td:nth-child(4)').textContent;
        return {ms: performance.now() - t0, first}; }""")
    taus = page.evaluate("() => Array.from(document.querySelectorAll('#explorer tbody tr td:nth-child(4)'), "
                         "t => Number(t.textContent))")
    assert took["ms"] < 200 and taus == sorted(taus, reverse=True), took  # tau sorted first: the click turns it
    print(f"explorer: 500 requests opened in {opened:.2f} s, re-sorted in {took['ms']:.1f} ms")
    page.locator("#explorer input.fe-ex-filter").fill("p49")
    assert page.locator("#explorer tbody tr").count() == 11  # p49, p490..p499
    _pick(page, "#explore-a", "small")
    page.wait_for_function("() => document.querySelectorAll('#explorer tbody tr.fe-ex-open').length === 1")
    page.evaluate("() => { const p = document.querySelector('#prompt textarea'); p.value = ''; "
                  "p.dispatchEvent(new Event('input', {bubbles: true})); }")
    page.locator("#explorer tbody tr.fe-ex-open").click()
    page.wait_for_function("() => (document.querySelector('#prompt textarea')?.value || '').length > 0", timeout=30_000)


def test_a_keyboard_sees_where_it_is(app_url, page):
    """Radios, the presentation checkbox and sliders, reached by the keyboard, show a focus ring."""
    url, _ = app_url
    page.goto(url, wait_until="load")
    page.wait_for_selector("#stage svg.fe-stage-tree .fe-n circle", timeout=20_000)
    rings = {}
    for name, sel in (("radio", "#method input[type=radio]"), ("checkbox", "#present input[type=checkbox]"),
                      ("slider", "#step-slider input[type=range]")):
        page.keyboard.press("Shift")  # the last input is the keyboard's: focus-visible applies
        page.locator(sel).first.focus()
        rings[name] = page.evaluate("(s) => { const e = document.querySelector(s); const c = getComputedStyle(e); "
                                    "return c.outlineStyle !== 'none' && parseFloat(c.outlineWidth) >= 2; }", sel)
    assert all(rings.values()), rings

"""Both replies of a finished run played again side by side at the speeds they were measured at:
the vanilla reply token by token, the speculative one in bursts, one per verification step (the
animation of assisted-generation explainers).

`playback_html` is pure (a run's sides -> HTML whose tokens carry the millisecond at which their step
ended); `PLAYBACK_JS` animates it in the browser (a gr.HTML's js_on_load), so playing it again costs
the server nothing and a run nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from viz.tokens import Span, depth_color, spans_from_json, text_color

EMPTY = "After a run, both replies play here side by side, at the speeds this machine measured."
SPEEDS = ((1.0, "1× (as measured)"), (0.5, "½×"), (0.25, "¼×"), (0.1, "⅒×"))


def step_times(traces: Sequence[Mapping], elapsed: Sequence[float] | None) -> list[float]:
    """Seconds from the decode's start to the end of each step: the measured `elapsed` (what the app
    records per step) when it covers every step, else the steps' own draft and verify times summed."""
    if elapsed is not None and len(elapsed) == len(traces):
        return [float(e) for e in elapsed]
    out, t = [], 0.0
    for tr in traces:
        t += (float(tr.get("draft_ms", 0)) + float(tr.get("verify_ms", 0))) / 1e3
        out.append(t)
    return out


def decode_seconds(side: Mapping) -> float | None:
    """One reply's decode time as the page's stats and summary table give it: the side's recorded
    summary, else its last measured `elapsed`; None when neither is there."""
    if (side.get("summary") or {}).get("wall_s") is not None:
        return float(side["summary"]["wall_s"])
    return float(side["elapsed"][-1]) if side.get("elapsed") else None


def reveal_schedule(side: Mapping) -> list[tuple[float, Span]]:
    """(seconds, span) for each token span of one side's reply: the moment the step that emitted it
    ended, so a step's tokens appear together."""
    traces = side["traces"]
    times = step_times(traces, side.get("elapsed"))
    at = {int(tr.get("step", i)): t for i, (tr, t) in enumerate(zip(traces, times))}
    end = times[-1] if times else 0.0
    return [(at.get(s.step, end), s) for s in spans_from_json(side.get("spans") or [])]


def _pane(name: str, side: Mapping) -> tuple[str, int]:
    """One reply's pane, and the millisecond its last token appears."""
    schedule = reveal_schedule(side)
    end_ms = round(1000 * max((t for t, _ in schedule), default=0.0))
    toks = "".join(f'<span class="fe-ptok" data-t="{round(1000 * t)}" data-n="{len(s.token_ids) or 1}" '
                   f'data-depth="{s.depth}" style="background:{depth_color(s.depth)};color:{text_color(s.depth)};'
                   f'border-radius:3px">{escape(s.text, quote=False)}</span>' for t, s in schedule)
    traces = side["traces"]  # the head's numbers are the stats line's: the stop token and the whole decode count
    n = int(traces[-1].get("generated", 0)) if traces else 0
    seconds = decode_seconds(side)
    final = f"{n} tokens in {end_ms / 1000 if seconds is None else seconds:.2f} s"  # what it says once played
    head = (f'<div class="fe-play-head"><b>{escape(name)}</b> · '
            f'<span class="fe-play-stat">{final}</span></div>')
    return (f'<div class="fe-play-side" data-end="{end_ms}" data-final="{final}">{head}'
            f'<div class="fe-play-text">{toks}</div></div>'), end_ms


def playback_html(sides: Mapping[str, Mapping], method: str = "speculative") -> str:
    """Both replies of a run ({"speculative": side, "vanilla": side}, each with traces, elapsed and
    spans as a run file holds them) as two panes with a replay button and a speed choice; the
    placeholder `EMPTY` without a run."""
    if not sides or not sides.get("speculative"):
        return f'<div class="fe-play fe-play-empty">{escape(EMPTY)}</div>'
    panes = [_pane(method, sides["speculative"])]
    if sides.get("vanilla"):
        panes.append(_pane("vanilla", sides["vanilla"]))
    total = max(end for _, end in panes)
    options = "".join(f'<option value="{v}">{escape(label)}</option>' for v, label in SPEEDS)
    bar = ('<div class="fe-play-bar"><button type="button" class="fe-play-replay">↻ replay</button> '
           f'<label>speed <select class="fe-play-speed">{options}</select></label> '
           '<span class="fe-play-note">each token appears when the step that emitted it ended '
           '(its own clock for each reply)</span></div>')
    return (f'<div class="fe-play" data-total="{total}" data-playing="false">{bar}<div class="fe-play-panes">'
            + "".join(html for html, _ in panes) + "</div></div>")


# js_on_load of the gr.HTML that shows `playback_html`: plays it whenever it changes, and again on
# ↻ replay or a new speed. A token is shown once the clock passes its data-t; the root's data-clock
# (ms) and data-playing say where the animation is.
PLAYBACK_JS = """
let raf = 0;
const play = () => {
  cancelAnimationFrame(raf);
  const root = element.querySelector('.fe-play[data-total]');
  if (!root) return;
  const select = root.querySelector('.fe-play-speed');
  if (element.dataset.speed) select.value = element.dataset.speed;
  const speed = Number(select.value) || 1;
  const total = Number(root.dataset.total);
  const sides = Array.from(root.querySelectorAll('.fe-play-side')).map((el) => ({
    toks: Array.from(el.querySelectorAll('.fe-ptok')), stat: el.querySelector('.fe-play-stat'),
    end: Number(el.dataset.end), final: el.dataset.final}));
  let t0 = null;
  const frame = (now) => {
    if (t0 === null) t0 = now;
    const ms = Math.min((now - t0) * speed, total);
    for (const s of sides) {
      let n = 0;
      for (const t of s.toks) {
        const on = Number(t.dataset.t) <= ms;
        t.style.visibility = on ? '' : 'hidden';
        if (on) n += Number(t.dataset.n);
      }
      s.stat.textContent = ms >= s.end ? `${s.final} ✔` : `${n} tokens · ${(ms / 1000).toFixed(2)} s`;
    }
    root.dataset.clock = String(Math.floor(ms));
    root.dataset.playing = ms < total ? 'true' : 'false';
    if (ms < total) raf = requestAnimationFrame(frame);
  };
  frame(performance.now());  // the first frame now: from here on the root says it is playing
};
element.addEventListener('click', (e) => { if (e.target.closest('.fe-play-replay')) play(); });
element.addEventListener('change', (e) => {
  if (e.target.closest('.fe-play-speed')) { element.dataset.speed = e.target.value; play(); }
});
watch('value', play);
play();
"""

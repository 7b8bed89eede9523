"""A step in motion: the run on screen played phase by phase in the browser, and the drafter's
forwards that made each tree (the cascade view).

Each decode step is five phases, in the order the engine runs them:
  1. draft: EAGLE-3 grows the tree depth by depth, one drafter pass per depth; FastEagle's cascade
     gives every depth at once from one pass (its layers L1..LN, each through the frozen LM head);
     prompt lookup matches a string and runs no forward;
  2. verify: one target forward over every node of the tree, with the tree mask;
  3. walk: from the root, a child survives if the target agrees; its siblings are rejected and
     everything below a rejection is never reached;
  4. emit: the accepted tokens join the reply;
  5. bonus: the target's own next token (or, sampling, one redrawn from the residual) ends the step.

`stage_html` is pure: the run's steps as compact data in one attribute. `STAGE_JS` (a gr.HTML's
js_on_load) draws and animates them as SVG, so thirty students playing a run cost the server nothing.
The page's tour (fasteagle.app.tour) drives it through `window.feStage`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from html import escape
from pathlib import Path

from fasteagle.trace import LOOKUP_SOURCE, token_kinds
from viz.palette import BONUS_COLOR, MARKS, OKABE_ITO, RESAMPLED_COLOR, VERDICT_COLORS
from viz.race import landing_step
from viz.tokens import token_label

PHASES = ("draft", "verify", "walk", "emit", "bonus")
EMPTY = "After a run, its steps play here phase by phase: draft, verify, walk, emit, bonus."
TOP_SHOWN = 3  # candidates per layer the stage lists (a trace keeps all the tree was built from)


def drafter_kind(meta: Mapping) -> str:
    """How the run's drafter makes a tree: "cascade", "eagle3", "lookup" or "none" (vanilla), from
    the method key its run file records (or its label, in an older file)."""
    key = str(meta.get("method_key") or meta.get("method") or "").lower().replace(" ", "")
    if key.startswith("fasteagle"):
        return "cascade"
    if key.startswith("eagle"):
        return "eagle3"
    return "lookup" if "lookup" in key else "none"


def _step_data(tr: Mapping, label: Callable[[Sequence[int]], str]) -> dict:
    """One step as the script reads it: labels instead of ids, short keys."""
    lab = lambda t: token_label(label([t]), 12)  # noqa: E731
    out = {"s": int(tr.get("step", 0)), "emit": [lab(t) for t in tr.get("tokens") or []],
           "kinds": token_kinds(tr), "dms": round(float(tr.get("draft_ms", 0)), 2),
           "vms": round(float(tr.get("verify_ms", 0)), 2)}
    tree = tr.get("tree")
    if tree:
        n = len(tree["tokens"])
        out |= {"tok": [lab(t) for t in tree["tokens"]], "par": list(tree["parents"]), "dep": list(tree["depths"]),
                "lk": [int(s == LOOKUP_SOURCE) for s in (tree.get("sources") or [0] * n)],
                "st": list(tr.get("status") or [0] * n), "path": list(tr.get("path") or [0]),
                "bonus": lab(tr["bonus"]) if int(tr.get("bonus", -1)) >= 0 else None,
                "bk": tr.get("bonus_kind", "bonus")}
    if "draft_passes" in tr:
        out["passes"] = [round(float(ms), 2) for ms in tr["draft_passes"]]
    if tr.get("dists"):  # sampling: what the inspector shows (viz/sampling.js)
        out |= {"dists": {str(d[0]): [[lab(t) for t in d[1]], d[2], d[3]] for d in tr["dists"]},
                "draws": list(tr.get("draws") or []), "tp": [round(float(p), 6) for p in tr.get("target_probs") or []]}
    if tr.get("layer_top"):
        out["top"] = [[[lab(t), round(float(p), 3)] for t, p in depth[:TOP_SHOWN]] for depth in tr["layer_top"]]
    return out


def stage_data(run: Mapping, label: Callable[[Sequence[int]], str]) -> dict:
    """The run's speculative side as the stage's script reads it."""
    meta = run.get("meta") or {}
    traces = run["sides"]["speculative"]["traces"]
    return {"kind": drafter_kind(meta), "method": str(meta.get("method", "speculative")),
            "sampled": float(meta.get("temperature") or 0) > 0,
            "steps": [_step_data(tr, label) for tr in traces],
            "colors": {str(k): v for k, v in VERDICT_COLORS.items()} | {
                "bonus": BONUS_COLOR, "resampled": RESAMPLED_COLOR, "draft": OKABE_ITO["orange"],
                "verify": OKABE_ITO["blue"]},
            "marks": {str(k): v for k, v in MARKS.items()}}


def stage_html(run: Mapping | None, label: Callable[[Sequence[int]], str] | None = None) -> str:
    """The stage for the run on screen (`None`: the placeholder)."""
    if not run or not run.get("sides", {}).get("speculative"):
        return f'<div class="fe-stage fe-stage-empty">{escape(EMPTY)}</div>'
    data = json.dumps(stage_data(run, label or (lambda ids: " ".join(map(str, ids)))), ensure_ascii=False,
                      separators=(",", ":"))
    buttons = ('<button type="button" data-go="-1" aria-label="previous phase">◀</button>'
               '<button type="button" data-go="play" class="fe-stage-play" aria-label="play">▶ play</button>'
               '<button type="button" data-go="1" aria-label="next phase">▶</button>')
    chips = "".join(f'<button type="button" class="fe-phase" data-phase="{i}">{i + 1} {p}</button>'
                    for i, p in enumerate(PHASES))
    # data-at: the step the stage opens on before the page's slider exists (the replay's landing step)
    at = landing_step(run["sides"]["speculative"]["traces"])
    return (f'<div class="fe-stage" tabindex="0" role="group" aria-label="the step in phases" '
            f'data-at="{at}" data-run="{escape(data, quote=True)}">'
            f'<div class="fe-stage-bar">{buttons}<input type="range" class="fe-stage-steps" min="0" value="0" '
            'aria-label="replay step"><span class="fe-stage-where" aria-live="polite"></span>'
            f'<span class="fe-phases">{chips}</span></div>'
            '<div class="fe-stage-say" aria-live="polite"></div>'
            '<svg class="fe-stage-tree" role="img" aria-label="the step\'s draft tree"></svg>'
            '<div class="fe-inspect" aria-live="polite"></div><div class="fe-stage-reply"></div>'
            '<div class="fe-passes" aria-label="the drafter\'s forwards this step"></div></div>')


STAGE_CSS = """
.fe-stage { font-variant-numeric: tabular-nums; outline:none; }
.fe-stage-empty { opacity:.7; font-size:90%; padding:8px; }
.fe-stage-bar { display:flex; flex-wrap:wrap; align-items:center; gap:6px; font-size:90%; }
.fe-stage-bar button { padding:2px 10px; border:1px solid #b9c6d8; border-radius:6px; background:#eef2f8;
  min-height:32px; }
.fe-stage-bar button:focus-visible, .fe-stage:focus-visible { outline:3px solid #0072B2; outline-offset:1px; }
.fe-stage-steps { width:9em; accent-color:#0072B2; }
.fe-phases { display:flex; flex-wrap:wrap; gap:4px; margin-left:auto; }
.fe-phase { font-size:85%; opacity:.6; }
.fe-phase.fe-on { opacity:1; font-weight:700; background:#dfe8f5 !important; border-color:#0072B2 !important; }
.fe-stage-say { min-height:2.6em; margin:4px 0; font-size:95%; }
.fe-stage-tree { width:100%; display:block; }
.fe-stage-tree text { font-family:ui-monospace, Consolas, monospace; font-size:12px; }
.fe-stage-tree .fe-n { transition: opacity .35s, transform .35s; cursor:default; }
.fe-stage-tree .fe-n.fe-pick { cursor:pointer; }
.fe-stage-tree .fe-n.fe-pick:hover circle, .fe-stage-tree .fe-n.fe-pick:focus circle { stroke:#000; stroke-width:3; }
.fe-stage-tree .fe-hide { opacity:0; }
.fe-stage-tree .fe-dim { opacity:.28; }
.fe-stage-tree .fe-scan { stroke:#0072B2 !important; stroke-width:3 !important; }
.fe-stage-reply { font-family:ui-monospace, Consolas, monospace; font-size:90%; line-height:1.7; margin:2px 0 4px;
  overflow-wrap:anywhere; }
.fe-stage-reply .fe-old { opacity:.55; }
.fe-stage-reply .fe-new { background:#d7efe6; border-radius:3px; padding:0 2px; }
.fe-stage-reply .fe-b { background:#d6e6f4; border-radius:3px; padding:0 2px; }
.fe-stage-reply .fe-later { opacity:.3; }
@media (max-width:640px) { .fe-phase { font-size:75%; padding:1px 5px !important; } .fe-stage-bar { gap:4px; } }
.fe-passes { font-size:85%; }
.fe-pass-row { display:flex; align-items:center; gap:6px; margin:2px 0; }
.fe-pass-name { width:9.5em; flex:none; text-align:right; }
.fe-pass-track { flex:1; min-width:0; }
.fe-pass-bar { display:block; height:14px; border-radius:3px; min-width:2px; }
.fe-pass-ms { width:5em; flex:none; }
.fe-layers { display:flex; flex-wrap:wrap; gap:4px 10px; margin-top:3px; }
.fe-layer { border:1px solid #dde3ea; border-radius:5px; padding:1px 5px; cursor:default; }
.fe-layer.fe-hl, .fe-layer:hover, .fe-layer:focus-visible { border-color:#0072B2; background:#eef4fb; }
.fe-inspect { font-size:88%; margin:2px 0 6px; }
.fe-inspect:empty { display:none; }
.fe-dist-row { display:flex; align-items:center; gap:6px; margin:1px 0; }
.fe-dist-tok { width:8em; flex:none; text-align:right; font-family:ui-monospace, Consolas, monospace; overflow:hidden; }
.fe-dist-track { flex:1; min-width:0; }
.fe-dist-bar { display:block; height:8px; background:var(--fe-bonus); border-radius:2px; min-width:1px; }
.fe-dist-bar.fe-seen { background:var(--fe-lookup); margin-top:1px; }
.fe-dist-p { width:8.5em; flex:none; }
.fe-try { font-size:85%; border:1px solid #b9c6d8; border-radius:4px; padding:0 4px; }
.fe-draw-many { margin-top:4px; padding:2px 10px; border:1px solid #b9c6d8; border-radius:6px; background:#eef2f8;
  min-height:30px; }
.fe-stage-tree .fe-n.fe-insp { cursor:pointer; }
.fe-views button { padding:1px 8px; border:1px solid #b9c6d8; border-radius:5px; background:#fff; min-height:28px; }
.fe-views button[aria-pressed=true] { background:#dfe8f5; border-color:#0072B2; }
@media (prefers-reduced-motion: reduce) { .fe-stage-tree .fe-n { transition:none; } }
body.fe-present .fe-stage-tree text { font-size:19px !important; }
body.fe-present .fe-stage-bar, body.fe-present .fe-passes { font-size:1.15em; }
body.fe-present .fe-phase, body.fe-present .fe-stage-bar button { font-size:16px !important; }
body.fe-present .fe-stage-tree circle { transform:scale(1.35); }
body.fe-present .fe-stage-say, body.fe-present .fe-stage-reply { font-size:1.2em; }
"""

# js_on_load of the gr.HTML that shows `stage_html`: the stage's script, then the sampling inspector's
# (their own files, to read as JavaScript; one scope)
STAGE_JS = "\n".join((Path(__file__).with_name(f)).read_text(encoding="utf-8") for f in ("sampling.js", "stage.js"))

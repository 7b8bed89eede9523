"""The prompt-set explorer: an inspect summary (`fasteagle.inspection`, from a vLLM server, our engine or
a bench result) as one sortable, filterable table of its requests, tau by category, acceptance by
position and the accepted lengths, and, given a second summary, the two prompt by prompt, who loses
most first. The server sends the rows once; the browser (explorer.js) sorts, filters and draws, so
every click answers at once. A row whose request has a trace file opens it in the main view.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path

from fasteagle import inspection

EMPTY = ("Load an inspect summary (`python -m fasteagle inspect ... --out DIR` writes DIR/summary.json) to see "
         "its requests one by one.")
KEEP = ("id", "category", "prompt", "tokens", "forwards", "tau", "drafted_steps", "drafted", "accepted",
        "mean_acceptance_length", "ttft_ms", "tokens_per_s", "trace")


def _side(doc: Mapping, name: str, traces: bool) -> dict:
    rows = [{k: r.get(k) for k in KEEP} for r in doc["rows"]]
    if not traces:
        for r in rows:
            r["trace"] = None
    agg = doc.get("aggregates") or inspection.aggregate(doc["rows"])
    return {"name": name, "source": inspection.source_text(doc.get("source") or {}), "rows": rows,
            "aggregates": agg, "charts": inspection.charts_html(agg)}


def explorer_data(a: Mapping, b: Mapping | None = None, names: tuple[str, str] = ("A", "B"),
                  traces: tuple[bool, bool] = (False, False)) -> dict:
    """What the page's script needs: each summary's rows and aggregates, and their comparison."""
    out = {"a": _side(a, names[0], traces[0])}
    if b is not None:
        out["b"] = _side(b, names[1], traces[1])
        out["compare"] = inspection.compare(a["rows"], b["rows"])
    return out


def explorer_html(a: Mapping | None = None, b: Mapping | None = None, names: tuple[str, str] = ("A", "B"),
                  traces: tuple[bool, bool] = (False, False), note: str = "") -> str:
    if a is None:
        return f'<div class="fe-explorer"><p class="fe-ex-why">{html.escape(note or EMPTY)}</p></div>'
    payload = html.escape(json.dumps(explorer_data(a, b, names, traces), separators=(",", ":")), quote=True)
    return (f'<div class="fe-explorer" data-ready="0" data-ex="{payload}">'
            f'<p class="fe-ex-why">{html.escape(note)}</p></div>')


EXPLORER_CSS = """
.fe-explorer { font-size: 0.95rem; }
.fe-explorer .fe-ex-bar { display: flex; flex-wrap: wrap; gap: 0.5rem 1rem; align-items: center; margin: 0.4rem 0; }
.fe-explorer table { border-collapse: collapse; font-variant-numeric: tabular-nums; width: 100%; }
.fe-explorer th, .fe-explorer td { padding: 0.2rem 0.5rem; text-align: right; border-bottom: 1px solid #8884; }
.fe-explorer th:nth-child(-n+2), .fe-explorer td:nth-child(-n+2) { text-align: left; }
.fe-explorer th button { all: unset; cursor: pointer; font-weight: 600; }
.fe-explorer th button:focus-visible, .fe-explorer tr:focus-visible { outline: 3px solid #0072b2; }
.fe-explorer tbody tr.fe-ex-open { cursor: pointer; }
.fe-explorer tbody tr.fe-ex-open:hover { background: #0072b222; }
.fe-explorer .fe-ex-scroll { max-height: 28rem; overflow: auto; }
.fe-explorer .fe-ex-charts { display: flex; flex-wrap: wrap; gap: 1rem; }
.fe-explorer .fe-ex-charts svg { max-width: 100%; height: auto; }
"""

EXPLORER_JS = (Path(__file__).with_name("explorer.js")).read_text(encoding="utf-8")

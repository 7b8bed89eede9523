"""Acceptance prompt by prompt: one summary row per request, from any of three sources, and the
aggregates that name where a drafter loses (`python -m fasteagle inspect`).

A row comes from a decode's steps (`StepTrace` dicts: our engine's full trees, or a vLLM request's
steps as `fasteagle.inspect_vllm` places them), or from a bench result's per-prompt row. Every row
counts as this project does everywhere: tau is tokens per target forward over all decode steps, the
bonus token included and undrafted steps counted (plain decoding: 1.0), from the tokens the reply
holds; per position p (the p-th draft of a step), `drafted` is how many steps had a draft there and
`accepted` how many the verifier accepted there (where a stop token or the length limit trimmed the
last step, drafts it accepted past the reply's end count too, as vLLM counts them);
`accepted_histogram[j]` is how many decode steps accepted exactly j drafts (a step that drafted
nothing: 0). A server's own figures keep the server's names (vLLM's `mean_acceptance_length`, which
counts only the steps that drafted, and `acceptance_histogram`).

The summary file (`SUMMARY_FORMAT`, version 1): {"format", "version", "source": {how it was made},
"rows": [...], "aggregates": `aggregate(rows)`}. Torch-free: the app's explorer reads it.
"""

from __future__ import annotations

import html
import json
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from fasteagle import trace
from fasteagle.errors import FastEagleError

SUMMARY_FORMAT, SUMMARY_VERSION = "fasteagle-inspect", 1
LOWEST = 10  # prompts and tokens the aggregates name


def row_from_steps(steps: Sequence, prompt: Mapping, labels: Mapping | None = None, unknown: int | None = None,
                   **server) -> dict:
    """A request's row from its steps (StepTrace dicts). `prompt`: {"id", "category", "text"}; `labels`:
    token id -> text, for the rejected tokens (`unknown`: the id of a draft nobody reported, as vLLM's
    rejected ones are: not counted); `server`: what the server reported (kept as named)."""
    decode = trace.decode_steps(steps)
    tokens = len(trace.reply_tokens(steps))
    forwards = len(decode)
    drafted, accepted, hist, rejected = [], [], Counter(), Counter()
    for s in decode:
        tree, status = trace._get(s, "tree") or {}, trace._get(s, "status") or []
        depths = tree.get("depths") or [0]
        # accepted as the verifier judged (a server counts drafts accepted past a trimmed reply's end too)
        took = sum(1 for i, v in enumerate(status) if i and v == trace.ACCEPTED and depths[i] > 0)
        hist[took] += 1
        for d in range(1, max(depths) + 1):
            _grow(drafted, d)[d - 1] += 1
        for d in sorted({depths[i] for i, v in enumerate(status) if i and v == trace.ACCEPTED}):
            _grow(accepted, d)[d - 1] += 1
        for i, v in enumerate(status):
            tok = tree["tokens"][i] if i < len(tree.get("tokens", [])) else None
            if v == trace.REJECTED and tok is not None and tok >= 0 and tok != unknown:
                rejected[_label(tok, labels)] += 1
    _grow(accepted, len(drafted))
    row = {"id": str(prompt.get("id", "")), "category": str(prompt.get("category", "")),
           "prompt": str(prompt.get("text", ""))[:200], "tokens": tokens, "forwards": forwards,
           "tau": round(trace.tau(tokens - 1, forwards), 4) if forwards else 0.0,
           "drafted_steps": sum(1 for s in decode if len((trace._get(s, "tree") or {}).get("tokens") or [0]) > 1),
           "drafted": drafted, "accepted": accepted,
           "accepted_histogram": [hist.get(j, 0) for j in range(max(hist, default=0) + 1)]}
    if rejected:
        row["rejected_tokens"] = dict(rejected.most_common(LOWEST))
    return row | {k: v for k, v in server.items() if v is not None}


def _grow(xs: list, n: int) -> list:
    while len(xs) < n:
        xs.append(0)
    return xs


def _label(tok: int, labels: Mapping | None) -> str:
    if labels is None:
        return str(tok)
    return str(labels.get(str(tok), labels.get(tok, tok)))


def rows_from_result(doc: Mapping, method: str | None, name: str) -> tuple[str, list[dict]]:
    """A bench result's per-prompt rows of one method as summary rows (the method: `method`, else the one
    speculative method the result holds). A bench row keeps per-depth counts of judged drafts, not the
    drafts themselves, so `drafted` there counts the steps whose verifier judged a draft at that depth."""
    rows = doc.get("rows")
    if not isinstance(rows, Mapping) or not rows:
        raise FastEagleError(f"{name} holds no per-prompt rows: give a method comparison made by `bench`")
    spec = [m for m, rs in rows.items() if rs and rs[0].get("forwards") is not None and m != "vanilla"]
    if method is None:
        if len(spec) != 1:
            raise FastEagleError(f"{name} holds {len(spec)} speculative methods ({', '.join(spec) or 'none'}): "
                                 "name one with --method")
        method = spec[0]
    if method not in rows:
        raise FastEagleError(f"{name} has no method {method!r}; it has {', '.join(rows)}")
    out = []
    for r in rows[method]:
        lengths = r.get("accepted_lengths") or []
        forwards = int(r.get("forwards") or len(lengths))
        tokens = int(r.get("n", sum(lengths) + 1))
        hist = Counter(max(n - 1, 0) for n in lengths)
        decode_s = float(r.get("wall_s", 0)) - float(r.get("prefill_ms", 0) or 0) / 1e3
        out.append({"id": str(r.get("id", "")), "category": str(r.get("category", "")), "prompt": "",
                    "tokens": tokens, "forwards": forwards,
                    "tau": round(trace.tau(tokens - 1, forwards), 4) if forwards else 0.0,
                    "drafted_steps": None, "drafted": list(r.get("depth_reached") or []),
                    "accepted": list(r.get("depth_accepted") or []),
                    "accepted_histogram": [hist.get(j, 0) for j in range(max(hist, default=0) + 1)],
                    "ttft_ms": round(float(r["prefill_ms"]), 1) if r.get("prefill_ms") is not None else None,
                    "tokens_per_s": round((tokens - 1) / decode_s, 2) if decode_s > 0 else None})
    return method, out


def aggregate(rows: Sequence[Mapping]) -> dict:
    """What names the problem: tau by category (pooled over its requests), acceptance by position (pooled),
    the accepted-length distribution, the prompts and categories with the lowest tau, and the drafted
    tokens rejected most often (where the rows know them)."""
    by_cat: dict[str, list] = {}
    for r in rows:
        by_cat.setdefault(r.get("category") or "", []).append(r)

    def pooled(rs) -> float:
        f = sum(int(r.get("forwards") or 0) for r in rs)
        return round(trace.tau(sum(int(r.get("tokens") or 0) - 1 for r in rs), f), 4) if f else 0.0

    drafted = _sum_lists(r.get("drafted") or [] for r in rows)
    accepted = _sum_lists(r.get("accepted") or [] for r in rows)
    rejected: Counter = Counter()
    for r in rows:
        rejected.update(r.get("rejected_tokens") or {})
    cats = {c: {"requests": len(rs), "tau": pooled(rs),
                "tau_median": round(statistics.median(float(r.get("tau") or 0) for r in rs), 4)}
            for c, rs in sorted(by_cat.items())}
    return {"requests": len(rows), "tau": pooled(rows), "by_category": cats,
            "by_position": [{"position": p + 1, "drafted": d, "accepted": a, "rate": round(a / d, 4) if d else None}
                            for p, (d, a) in enumerate(zip(drafted, accepted))],
            "accepted_histogram": _sum_lists(r.get("accepted_histogram") or [] for r in rows),
            "lowest": [{"id": r["id"], "category": r.get("category"), "tau": r.get("tau")}
                       for r in sorted(rows, key=lambda r: float(r.get("tau") or 0))[:LOWEST]],
            "lowest_categories": sorted(cats, key=lambda c: cats[c]["tau"])[:3],
            "rejected_tokens": dict(rejected.most_common(LOWEST))}


def _sum_lists(lists) -> list[int]:
    out: list[int] = []
    for xs in lists:
        for i, v in enumerate(xs):
            _grow(out, i + 1)[i] += int(v or 0)
    return out


def summary(rows: list[dict], source: Mapping) -> dict:
    return {"format": SUMMARY_FORMAT, "version": SUMMARY_VERSION, "source": dict(source), "rows": rows,
            "aggregates": aggregate(rows)}


def read_summary(path: str | Path) -> dict:
    """A summary file, checked: the format, the version, a list of rows with their counts (one line
    otherwise)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise FastEagleError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise FastEagleError(f"{path} is not a JSON summary (`python -m fasteagle inspect` writes one)") from None
    if not isinstance(doc, dict) or doc.get("format") != SUMMARY_FORMAT:
        raise FastEagleError(f"{path} is not an inspect summary (format {SUMMARY_FORMAT!r})")
    if doc.get("version") != SUMMARY_VERSION:
        raise FastEagleError(f"{path} is summary version {doc.get('version')}; this version reads {SUMMARY_VERSION}")
    rows = doc.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "tau" in r and "id" in r for r in rows):
        raise FastEagleError(f"{path}: `rows` must be a list of rows, each with an id and a tau")
    return doc


def compare(a: Sequence[Mapping], b: Sequence[Mapping]) -> list[dict]:
    """Two summaries prompt by prompt (matched by category and id), who loses most first: tau in each
    and b's minus a's."""
    index = {(r.get("category"), r.get("id")): r for r in b}
    out = [{"id": r["id"], "category": r.get("category"), "tau_a": r.get("tau"), "tau_b": index[key].get("tau"),
            "delta": round(float(index[key].get("tau") or 0) - float(r.get("tau") or 0), 4)}
           for r in a if (key := (r.get("category"), r.get("id"))) in index]
    return sorted(out, key=lambda x: x["delta"])


def report_html(doc: Mapping) -> str:
    """The summary as one HTML file: the aggregates' tables, acceptance by position and the accepted
    lengths as inline SVG bars (no script, no download), and every request's row, lowest tau first."""
    agg, src = doc["aggregates"], doc.get("source", {})
    esc = html.escape
    parts = [f"<h1>Acceptance by prompt</h1><p>{esc(source_text(src))}</p>",
             f"<p><b>{agg['requests']} requests</b>, tau {agg['tau']} (tokens per target forward, undrafted steps "
             "included).</p>", "<h2>By category</h2>",
             _table(["category", "requests", "tau", "median tau"],
                    [[c, v["requests"], v["tau"], v["tau_median"]] for c, v in agg["by_category"].items()]),
             "<h2>Acceptance by position</h2>", _position_bars(agg),
             "<h2>Drafts accepted per step</h2>", _histogram_bars(agg)]
    if agg.get("rejected_tokens"):
        parts += ["<h2>Drafted tokens rejected most often</h2>",
                  _table(["token", "rejections"], [[repr(t), n] for t, n in agg["rejected_tokens"].items()])]
    rows = sorted(doc["rows"], key=lambda r: float(r.get("tau") or 0))
    parts += ["<h2>Every request, lowest tau first</h2>",
              _table(["id", "category", "tokens", "tau", "drafted steps", "accepted by position", "server's",
                      "TTFT ms", "tokens/s"],
                     [[r["id"], r.get("category", ""), r.get("tokens"), r.get("tau"), r.get("drafted_steps"),
                       " / ".join(f"{a}/{d}" for a, d in zip(r.get("accepted") or [], r.get("drafted") or [])),
                       r.get("mean_acceptance_length", ""), r.get("ttft_ms", ""), r.get("tokens_per_s", "")]
                      for r in rows])]
    style = ("body{font:15px system-ui,sans-serif;max-width:1100px;margin:2rem auto;padding:0 1rem}"
             "table{border-collapse:collapse;font-variant-numeric:tabular-nums}td,th{padding:.2rem .6rem;"
             "border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}")
    return (f"<!doctype html><html lang=en><meta charset=utf-8><title>FastEagle inspect</title><style>{style}</style>"
            + "".join(parts) + "</html>\n")


def charts_html(agg: Mapping) -> str:
    """The aggregates as three SVG bar charts, side by side where they fit: tau by kind, the share of drafts
    accepted by position, decode steps by drafts accepted (the app's explorer shows them)."""
    cats = list(agg["by_category"])
    return (_bars(cats, [agg["by_category"][c]["tau"] for c in cats], "tau by kind") + _position_bars(agg)
            + _histogram_bars(agg))


def _position_bars(agg: Mapping) -> str:
    return _bars([str(p["position"]) for p in agg["by_position"]], [p["rate"] or 0 for p in agg["by_position"]],
                 "share of drafts at this position accepted")


def _histogram_bars(agg: Mapping) -> str:
    return _bars([str(j) for j in range(len(agg["accepted_histogram"]))], agg["accepted_histogram"],
                 "decode steps by drafts accepted")


def source_text(src: Mapping) -> str:
    """Where a summary's rows came from, in one line."""
    kind = src.get("kind")
    if kind == "vllm":
        return (f"vLLM {src.get('vllm', '')} at {src.get('server', '')}, model {src.get('model', '')}, "
                f"{src.get('date', '')}")
    if kind == "result":
        return f"bench result {src.get('result', '')}, method {src.get('method', '')}"
    return f"our engine, method {src.get('method', '')}, {src.get('device', '')}, {src.get('date', '')}"


def _table(head: list[str], rows: list[list]) -> str:
    esc = html.escape
    return ("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{esc('' if v is None else str(v))}</td>" for v in r) + "</tr>"
                      for r in rows) + "</table>")


def _bars(labels: list[str], values: list[float], title: str) -> str:
    """A small bar chart as inline SVG."""
    if not values:
        return "<p>none</p>"
    top = max(max(values), 1e-9)
    w, h, bw = 40 + 44 * len(values), 180, 32
    out = [f'<svg width="{w}" height="{h + 40}" role="img" aria-label="{html.escape(title)}">']
    for i, (lab, v) in enumerate(zip(labels, values)):
        bh = (h - 20) * v / top
        x = 30 + 44 * i
        out += [f'<rect x="{x}" y="{h - bh}" width="{bw}" height="{bh}" fill="var(--fe-acc, #0072b2)"/>',
                f'<text x="{x + bw / 2}" y="{h + 16}" text-anchor="middle" font-size="12" fill="currentColor">'
                f'{html.escape(lab)}</text>',
                f'<text x="{x + bw / 2}" y="{h - bh - 4}" text-anchor="middle" font-size="11" fill="currentColor">'
                f'{v if isinstance(v, int) else f"{v:.2f}"}</text>']
    out.append(f'<text x="30" y="{h + 36}" font-size="12" fill="currentColor">{html.escape(title)}</text></svg>')
    return "".join(out)

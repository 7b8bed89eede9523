"""One step's draft tree as a Plotly figure.

Nodes are tokens laid out by depth (x) and rows (y) in depth-first leaf order: a drafted chain
(FastEagle's backbone, a lookup continuation) reads as one line of text and side branches hang
below their parent, packed per column, with no crossing edges. The figure's height is
`rows * ROW_PX` plus margins (rows grow with the number of leaves), which keeps labels from ever
overlapping vertically.

A tree that would take more than `FOLD_ROWS` rows (EAGLE-3's 60-node trees, a GPU's 128-node ones)
folds each group of never-reached branches into one "+N" node under their parent: the verifier never
looked at them, and drawn in full they would make a 2000-pixel figure. If it is still too tall, each
parent keeps its `KEEP_REJECTED` most probable rejected leaves and folds the others the same way.
Hovering a stand-in lists what it holds.

Colours give the verifier's verdict per node; the accepted path is one thick line trace named
`ACCEPTED_PATH` (its points are exactly the accepted nodes); the target's own (bonus) token after
the path is drawn as an extra node. Edges are elbows (line shape 'hvh': the vertical part halfway
between two depth columns) so they never run through the labels above the markers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import plotly.graph_objects as go

from fasteagle.trace import ACCEPTED, LOOKUP_SOURCE, NEVER_REACHED, REJECTED
from viz.palette import BONUS_COLOR, SYMBOL_SUFFIX, VERDICT_COLORS
from viz.tokens import Decode, label_decoder, token_label

VERDICTS = {ACCEPTED: "accepted", REJECTED: "rejected", NEVER_REACHED: "never reached"}
ACCEPTED_PATH = "accepted path"
BONUS_NAME = "bonus token"

LABEL_FONT_PX = 12  # label font size
LABEL_HEIGHT_PX = 16  # one line of LABEL_FONT_PX text, line spacing included
MARKER_PX = 12
LOOKUP_SYMBOL = "diamond"  # their marker; drafter nodes are circles
LOOKUP_NAME = "from prompt lookup"
ROW_PX = 40  # >= LABEL_HEIGHT_PX + MARKER_PX: a label sits above its marker
TITLE_PX = 14
TITLE_TOP_PX = 30  # the title starts below the toolbar (which would cover it on a narrow screen)
TITLE_LINES = 2  # a step's title: what it drafted and accepted, then its timings (and folds, a third line)
TITLE_CHARS = 44  # at most this many characters of TITLE_PX text a title line: it fits a 390 px phone
MARGIN = {"l": 30, "r": 30, "t": 76, "b": 84}  # top: Plotly's toolbar, then the title; bottom: the axis, legend
MIN_HEIGHT = 260
FOLD_ROWS = 20  # taller trees fold their never-reached branches, then their surplus rejected leaves
KEEP_REJECTED = 3  # rejected leaves a parent keeps in sight when those fold
FOLDED_NAME = "never reached (folded)"
FOLDED_REJECTED_NAME = "rejected (folded)"
FOLDED_SYMBOL = "circle-open"


@dataclass(frozen=True)
class TreeStyle:
    """Sizes of a tree figure's text, markers and rows: `NORMAL`, or `LARGE` for presentation mode (a
    projector). `row_px` >= `label_height_px` + `marker_px`, so a label sits between two rows' markers;
    `title_chars` keeps a title line inside a phone's width at `title_px`."""

    label_px: int = LABEL_FONT_PX
    label_height_px: int = LABEL_HEIGHT_PX
    marker_px: int = MARKER_PX
    row_px: int = ROW_PX
    title_px: int = TITLE_PX
    title_chars: int = TITLE_CHARS
    legend_px: int = 11
    bottom_px: int = MARGIN["b"]  # the axis title and the legend (two legend rows when large)

    def top_px(self, lines: int) -> int:
        """The top margin: the toolbar, then `lines` lines of title."""
        return TITLE_TOP_PX + round(lines * 1.3 * self.title_px) + 10


NORMAL = TreeStyle()
LARGE = TreeStyle(label_px=17, label_height_px=22, marker_px=16, row_px=54, title_px=19, title_chars=34,
                  legend_px=16, bottom_px=130)


@dataclass
class Layout:
    x: list[float]  # per node (tree nodes, then the bonus node if any)
    y: list[float]  # row index, 0 at the top
    rows: int
    parents: list[int]
    bonus: int | None  # index of the virtual bonus node, if drawn


def tree_layout(parents: list[int], bonus_parent: int | None = None) -> Layout:
    """x = depth; y = row. Nodes are placed in depth-first order: a node's first child stays on its
    parent's row when that column is free there (a chain reads as one line), every other node takes
    the first free row of its column at or below its parent. Rows in a column therefore grow in
    placement order, so the children of a higher node always sit above those of a lower one and no
    two edges cross. A node with children also starts below the last child of every node above it
    in its column: each parent's elbows then own the rows they span between two columns, and no
    child can seem to hang from a neighbour's line.

    With `bonus_parent`, a virtual last child of that node is added (index len(parents)): the
    target's bonus token."""
    parents = [int(p) for p in parents]
    bonus = None
    if bonus_parent is not None:
        bonus = len(parents)
        parents = parents + [int(bonus_parent)]
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i, p in enumerate(parents):
        (children[p] if 0 <= p < n else roots).append(i)
    depth = [0] * n
    y: list[float] = [0.0] * n
    next_free: dict[int, int] = {}  # column -> first free row
    below_kids: dict[int, int] = {}  # column -> first row below every child of that column's nodes
    stack = [(r, 0) for r in reversed(roots)]
    while stack:  # iterative pre-order: place a node, then its children, first child first
        i, lowest = stack.pop()
        d = depth[i]
        row = max(lowest, next_free.get(d, 0), below_kids.get(d, 0) if children[i] else 0)
        y[i] = float(row)
        next_free[d] = row + 1
        if d > 0:
            below_kids[d - 1] = max(below_kids.get(d - 1, 0), row + 1)
        for c in reversed(children[i]):
            depth[c] = d + 1
            stack.append((c, row))
    rows = max(next_free.values(), default=1)
    return Layout([float(d) for d in depth], y, max(rows, 1), parents, bonus)


def fold_unreached(parents: list[int], status: list[int]) -> tuple[list[int], list[tuple[int, list[int]]]]:
    """The nodes to draw of a big tree: (the nodes the verifier reached, in order; per reached node with
    never-reached children, (that node, every node of those children's subtrees)). A reached node's
    parent is reached, and everything below a never-reached node is never reached, so the folds
    cover exactly the never-reached nodes."""
    n = len(parents)
    shown = [i for i in range(n) if status[i] != NEVER_REACHED]
    group: dict[int, list[int]] = {}  # reached parent -> the never-reached nodes below it
    top = list(range(n))  # each never-reached node's highest never-reached ancestor
    for i in range(n):  # parents precede children
        if status[i] != NEVER_REACHED:
            continue
        p = parents[i]
        if p >= 0 and status[p] == NEVER_REACHED:
            top[i] = top[p]
        group.setdefault(parents[top[i]], []).append(i)
    return shown, sorted(group.items())


def fold_rejected_leaves(parents: list[int], status: list[int], draft_probs: list[float], shown: list[int],
                         keep: int = KEEP_REJECTED) -> tuple[list[int], list[tuple[int, list[int]]]]:
    """Fewer nodes to draw of a still too tall tree: per parent with more than `keep` rejected leaves
    among `shown` (rejected nodes without children), the `keep` most probable stay; returns (the nodes
    still shown, in order; (parent, the folded leaves) per parent)."""
    has_children = set(parents)
    leaves: dict[int, list[int]] = {}
    for i in shown:
        if status[i] == REJECTED and i not in has_children:
            leaves.setdefault(parents[i], []).append(i)
    folded: dict[int, list[int]] = {}
    for p, kids in leaves.items():
        if len(kids) > keep:
            best = set(sorted(kids, key=lambda i: -draft_probs[i])[:keep])
            folded[p] = [i for i in kids if i not in best]
    gone = {i for kids in folded.values() for i in kids}
    return [i for i in shown if i not in gone], sorted(folded.items())


def _visible(parents: list[int], status: list[int], draft_probs: list[float], bonus_parent: int | None):
    """(nodes drawn one by one, [(parent, folded nodes, verdict)], their layout): the whole tree while it
    fits in `FOLD_ROWS` rows, else its never-reached branches folded, then its surplus rejected leaves."""
    shown: list[int] = list(range(len(parents)))
    folds: list[tuple[int, list[int], int]] = []

    def layout() -> Layout:
        at = {i: k for k, i in enumerate(shown)}
        drawn = [at.get(parents[i], -1) for i in shown] + [at[p] for p, _, _ in folds]
        return tree_layout(drawn, at[bonus_parent] if bonus_parent is not None else None)

    lay = layout()
    if lay.rows > FOLD_ROWS:
        shown, groups = fold_unreached(parents, status)
        folds = [(p, nodes, NEVER_REACHED) for p, nodes in groups]
        lay = layout()
    if lay.rows > FOLD_ROWS:
        shown, groups = fold_rejected_leaves(parents, status, draft_probs, shown)
        folds += [(p, nodes, REJECTED) for p, nodes in groups]
        lay = layout()
    return shown, folds, lay


def _folded_text(folds: list[tuple[int, list[int], int]]) -> list[str]:
    """The title's part about folded nodes (none when nothing is folded)."""
    counts = {v: sum(len(nodes) for _, nodes, w in folds if w == v) for v in (NEVER_REACHED, REJECTED)}
    parts = [f"{c} {VERDICTS[v]}" for v, c in counts.items() if c]
    return [f"{' and '.join(parts)} nodes folded"] if parts else []


def wrap(parts: list[str], chars: int, sep: str = " · ") -> str:
    """`parts` joined by `sep` into lines of at most `chars` characters (a longer part keeps a line to
    itself), joined by Plotly's <br>: long titles wrap instead of running off a phone's screen."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= chars:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return "<br>".join(lines)


def figure_height(rows: int, style: TreeStyle = NORMAL, lines: int = TITLE_LINES) -> int:
    return max(MIN_HEIGHT, style.top_px(lines) + style.bottom_px + rows * style.row_px)


def empty_figure(message: str = "Run a prompt to see each step's draft tree.", height: int = MIN_HEIGHT) -> go.Figure:
    """A placeholder (gr.Plot needs a figure at load, or Plotly drops the first frames); the message
    wrapped to fit a phone."""
    fig = go.Figure()
    fig.add_annotation(text=wrap(message.split(" "), TITLE_CHARS, " "), x=0.5, y=0.5, xref="paper", yref="paper",
                       showarrow=False, font={"size": 14, "color": "#666"})
    fig.update_layout(height=height, margin=MARGIN, xaxis={"visible": False}, yaxis={"visible": False},
                      plot_bgcolor="white", paper_bgcolor="white")
    return fig


def _bonus_token(step: Mapping) -> int | None:
    """The target's own token emitted after the accepted path (absent when the step was cut)."""
    toks, depths = step.get("tokens") or [], step.get("token_depths") or []
    return int(toks[-1]) if toks and depths and int(depths[-1]) == 0 else None


def _source_text(source: int) -> str:
    return LOOKUP_NAME if source == LOOKUP_SOURCE else f"drafter layer {source}"


def _step_layout(step: Mapping):
    """(status, draft probabilities, accepted path, bonus token, and `_visible` of them) of a step with a tree."""
    tree = step["tree"]
    n = len(tree["tokens"])
    status = [int(s) for s in (step.get("status") or [ACCEPTED] + [NEVER_REACHED] * (n - 1))]
    dprobs = [float(p) for p in (tree.get("draft_probs") or [1.0] * n)]
    path = [int(i) for i in (step.get("path") or [0])]
    bonus_tok = _bonus_token(step)
    visible = _visible([int(q) for q in tree["parents"]], status, dprobs, path[-1] if bonus_tok is not None else None)
    return status, dprobs, path, bonus_tok, visible


def tree_height(step: Mapping, style: TreeStyle = NORMAL) -> int:
    """The height `tree_figure` gives this step, without drawing it (to size a run's figures alike)."""
    if not step.get("tree"):
        return MIN_HEIGHT
    _, _, path, bonus_tok, (_, folds, lay) = _step_layout(step)
    title = _title(step, len(step["tree"]["tokens"]), path, bonus_tok, folds, style)
    return figure_height(lay.rows, style, title.count("<br>") + 1)


@dataclass
class _Drawing:
    """One step's tree, ready to draw: per tree node its token, decoded text, label, verdict, draft
    and target probabilities and source; the accepted path and the bonus token; the nodes drawn one
    by one (`shown`; `at` maps a node to its place in `lay`), the folded groups, and the layout."""

    tokens: list[int]
    texts: list[str]
    labels: list[str]
    status: list[int]
    dprobs: list[float]
    tprobs: list[float]
    sources: list[int]
    path: list[int]
    bonus_tok: int | None
    bonus_text: str
    shown: list[int]
    folds: list[tuple[int, list[int], int]]
    lay: Layout
    at: dict[int, int]
    style: TreeStyle = NORMAL


def _drawing(step: Mapping, label_of: Callable[[int], str], style: TreeStyle) -> _Drawing:
    """A step with a tree, decoded, laid out and folded as `_visible` decides."""
    tree = step["tree"]
    tokens = [int(t) for t in tree["tokens"]]
    n = len(tokens)
    status, dprobs, path, bonus_tok, (shown, folds, lay) = _step_layout(step)
    texts = [label_of(t) for t in tokens]
    return _Drawing(
        tokens=tokens, texts=texts, labels=[token_label(t) for t in texts], status=status, dprobs=dprobs,
        tprobs=[float(p) for p in (step.get("target_probs") or [1.0] * n)],
        sources=[int(s) for s in (tree.get("sources") or [0] * n)], path=path, bonus_tok=bonus_tok,
        bonus_text=label_of(bonus_tok) if lay.bonus is not None else "", shown=shown, folds=folds, lay=lay,
        at={i: k for k, i in enumerate(shown)}, style=style,
    )


def tree_figure(step: Mapping, tokenizer_decode: Decode | Mapping[int, str], title: str | None = None,
                min_height: int = 0, style: TreeStyle = NORMAL) -> go.Figure:
    """Plotly figure of one `StepTrace.to_dict()`: nodes coloured by verdict, the accepted path as
    one line trace, hover with token id, depth, draft and target probabilities. `min_height`: at
    least this tall, rows spaced as usual from the top (so a run's figures need not jump in size);
    `style`: text and row sizes (`LARGE` for a projector)."""
    label_of: Callable[[int], str] = label_decoder(tokenizer_decode)
    if not step.get("tree"):
        toks = step.get("tokens") or []
        first = token_label(label_of(toks[0]), 24) if toks else "∅"
        return empty_figure(f"step {step.get('step', 0)}: prefill — the target read the prompt and chose its "
                            f"first token itself: “{first}”", max(MIN_HEIGHT, min_height))
    d = _drawing(step, label_of, style)
    traces = [_edges(d.lay, len(d.shown) + len(d.folds)), _accepted_path(d)]
    if d.lay.bonus is not None:  # under the nodes, and never hovered
        traces.append(_bonus_edge(d))
    for verdict in (ACCEPTED, REJECTED, NEVER_REACHED):  # each always present so the legend stays put
        traces.append(_verdict_nodes(d, verdict))
    for verdict, name in ((NEVER_REACHED, FOLDED_NAME), (REJECTED, FOLDED_REJECTED_NAME)):
        if any(v == verdict for _, _, v in d.folds):
            traces.append(_folded_nodes(d, verdict, name))
    if LOOKUP_SOURCE in d.sources:  # legend entry for the marker shape of lookup's nodes
        traces.append(go.Scatter(x=[None], y=[None], mode="markers", name=LOOKUP_NAME, hoverinfo="skip",
                                 marker={"size": style.marker_px, "color": "#777777", "symbol": LOOKUP_SYMBOL}))
    if d.lay.bonus is not None:
        traces.append(_bonus_node(d))
    if title is None:
        title = _title(step, len(d.tokens), d.path, d.bonus_tok, d.folds, style)
    # the layout given at construction: update_layout on a figure with traces is several times slower
    return go.Figure(data=traces, layout=_layout(title, d.lay, min_height, style))


def _edges(lay: Layout, count: int) -> go.Scatter:
    """Every edge of the first `count` laid-out nodes, as one trace of None-separated segments."""
    ex, ey = [], []
    for i in range(1, count):
        p = lay.parents[i]
        if p >= 0:
            ex += [lay.x[p], lay.x[i], None]
            ey += [lay.y[p], lay.y[i], None]
    return go.Scatter(x=ex, y=ey, mode="lines", name="edges", hoverinfo="skip", showlegend=False,
                      line={"color": "#d0d0d0", "width": 1.5, "shape": "hvh"})


def _accepted_path(d: _Drawing) -> go.Scatter:
    """Exactly the accepted nodes, root first, under one thick line."""
    lay, at = d.lay, d.at
    return go.Scatter(x=[lay.x[at[i]] for i in d.path], y=[lay.y[at[i]] for i in d.path], mode="lines",
                      name=ACCEPTED_PATH, hoverinfo="skip",
                      line={"color": VERDICT_COLORS[ACCEPTED], "width": 6, "shape": "hvh"}, opacity=0.45)


def _verdict_nodes(d: _Drawing, verdict: int) -> go.Scatter:
    """The nodes drawn one by one that got `verdict`, labelled, with their numbers on hover."""
    lay, at = d.lay, d.at
    idx = [i for i in d.shown if d.status[i] == verdict]
    return go.Scatter(
        x=[lay.x[at[i]] for i in idx], y=[lay.y[at[i]] for i in idx], mode="markers+text",
        name=VERDICTS[verdict], text=[d.labels[i] for i in idx], textposition="top center", cliponaxis=False,
        textfont={"size": d.style.label_px, "family": "monospace"},
        marker={"size": d.style.marker_px, "color": VERDICT_COLORS[verdict], "line": {"color": "white", "width": 1},
                "symbol": [(LOOKUP_SYMBOL if d.sources[i] == LOOKUP_SOURCE else "circle") + SYMBOL_SUFFIX[verdict]
                           for i in idx]},
        customdata=[[i, d.tokens[i], int(lay.x[at[i]]), d.dprobs[i], d.tprobs[i], _source_text(d.sources[i]),
                     repr(d.texts[i])] for i in idx],
        hovertemplate=("node %{customdata[0]}: %{customdata[6]}<br>token id %{customdata[1]}<br>"
                       "depth %{customdata[2]} (%{customdata[5]})<br>"
                       "draft p %{customdata[3]:.3f}<br>target p %{customdata[4]:.3f}<br>"
                       f"{VERDICTS[verdict]}<extra></extra>"),
    )


def _folded_nodes(d: _Drawing, verdict: int, name: str) -> go.Scatter:
    """The "+N" stand-ins of the folded groups of one verdict; hovering one lists what it holds."""
    lay = d.lay
    group = [(len(d.shown) + k, nodes) for k, (_, nodes, v) in enumerate(d.folds) if v == verdict]
    return go.Scatter(
        x=[lay.x[k] for k, _ in group], y=[lay.y[k] for k, _ in group], mode="markers+text", name=name,
        text=[f"+{len(nodes)}" for _, nodes in group], textposition="top center", cliponaxis=False,
        textfont={"size": d.style.label_px, "family": "monospace", "color": VERDICT_COLORS[verdict]
                  if verdict == REJECTED else "#888888"},
        marker={"size": d.style.marker_px, "color": VERDICT_COLORS[verdict], "symbol": FOLDED_SYMBOL},
        customdata=[[len(nodes), " ".join(d.labels[i] for i in nodes[:12]) + (" …" if len(nodes) > 12 else "")]
                    for _, nodes in group],
        hovertemplate=f"%{{customdata[0]}} {VERDICTS[verdict]} nodes, folded: %{{customdata[1]}}<extra></extra>",
    )


def _bonus_edge(d: _Drawing) -> go.Scatter:
    """The dotted line from the accepted path's last node to the bonus star; never hovered, so that
    hovering that node shows its own tooltip (the line's start point sits on it)."""
    lay, b, p = d.lay, d.lay.bonus, d.at[d.path[-1]]
    return go.Scatter(x=[lay.x[p], lay.x[b]], y=[lay.y[p], lay.y[b]], mode="lines", name="bonus edge",
                      hoverinfo="skip", showlegend=False,
                      line={"color": BONUS_COLOR, "width": 2, "dash": "dot", "shape": "hvh"})


def _bonus_node(d: _Drawing) -> go.Scatter:
    """The target's own token, a star hanging from the accepted path's last node (`_bonus_edge`)."""
    lay, b = d.lay, d.lay.bonus
    return go.Scatter(
        x=[lay.x[b]], y=[lay.y[b]], mode="markers+text", name=BONUS_NAME,
        text=[token_label(d.bonus_text)], textposition="top center", cliponaxis=False,
        textfont={"size": d.style.label_px, "family": "monospace", "color": BONUS_COLOR},
        marker={"size": d.style.marker_px + 4, "color": BONUS_COLOR, "symbol": "star"},
        customdata=[[d.bonus_tok, repr(d.bonus_text)]],
        hovertemplate="%{customdata[1]}<br>token id %{customdata[0]}<br>the target's own token after the "
                      "accepted path<extra></extra>",
    )


def _title(step: Mapping, n_tokens: int, path: list[int], bonus_tok: int | None,
           folds: list[tuple[int, list[int], int]], style: TreeStyle) -> str:
    """What the step drafted, accepted and spent, and what is folded, wrapped to `style`'s width."""
    head = [f"step {step.get('step', '?')}: {n_tokens - 1} drafted",
            f"{len(path) - 1} accepted{' + 1 bonus' if bonus_tok is not None else ''}"]
    times = [f"draft {float(step.get('draft_ms', 0)):.0f} ms", f"verify {float(step.get('verify_ms', 0)):.0f} ms"]
    return wrap(head, style.title_chars, ", ") + "<br>" + wrap([*times, *_folded_text(folds)], style.title_chars)


def _layout(title: str, lay: Layout, min_height: int, style: TreeStyle) -> dict:
    """Axes, legend and size: `style.row_px` per row, at least `min_height` tall (extra rows below)."""
    max_x = max(lay.x) if lay.x else 0
    lines = title.count("<br>") + 1
    margin = MARGIN | {"t": style.top_px(lines), "b": style.bottom_px}
    height, span = figure_height(lay.rows, style, lines), lay.rows
    if min_height > height:  # taller than the tree needs: the rows keep their spacing, from the top
        height, span = min_height, max(lay.rows, (min_height - margin["t"] - margin["b"]) / style.row_px)
    return dict(
        title={"text": title, "x": 0.01, "font": {"size": style.title_px}, "yref": "container", "y": 1,
               # Plotly sets a title anchored at its top about one font size above its pad, whatever its
               # lines (measured in Chromium: 13 px at 14 px, 18 at 19), so it starts at TITLE_TOP_PX and
               # its last line ends above the plot (top_px); more padding pushed a 3-line title onto the
               # tree's top nodes in presentation mode
               "yanchor": "top", "pad": {"t": TITLE_TOP_PX + style.title_px}},
        height=height, margin=margin, plot_bgcolor="white", paper_bgcolor="white",
        legend={"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom", "x": 0,
                "font": {"size": style.legend_px}},
        xaxis={"title": {"text": "depth (0 = root: the last token the target chose)",
                         "font": {"size": style.legend_px}},
               "range": [-0.5, max_x + 0.5], "dtick": 1, "showgrid": True, "gridcolor": "#f2f2f2",
               "zeroline": False, "fixedrange": True, "tickfont": {"size": style.legend_px}},
        yaxis={"range": [span - 0.5, -0.6], "visible": False, "fixedrange": True},
        hoverlabel={"font": {"family": "monospace", "size": style.legend_px + 2}},
        meta={"height": height, "plot_px": height - margin["t"] - margin["b"]},  # TREE_JS keeps the rows so tall
    )


def row_spacing_px(fig: go.Figure) -> float:
    """Pixels between two adjacent rows of a figure made by `tree_figure`."""
    lo, hi = fig.layout.yaxis.range
    plot_h = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    return plot_h / abs(hi - lo)


# Run on page load (the app's launch js), after each tree Plotly draws in `#tree-plot`:
# - on a narrow screen the legend wraps into more rows than the bottom margin holds and Plotly takes
#   them from the plot, squeezing the rows together: the figure grows back to its `meta.plot_px`;
# - a label that would overlap one already kept is hidden (hovering its node still shows its token).
#   Accepted nodes and the bonus token keep theirs first, then rejected, folded and never-reached
#   nodes, left to right: on a phone, or with presentation mode's large labels, neighbouring columns
#   would otherwise print over each other.
LABEL_RANK = {VERDICTS[ACCEPTED]: 0, BONUS_NAME: 0, VERDICTS[REJECTED]: 1, FOLDED_REJECTED_NAME: 2,
              VERDICTS[NEVER_REACHED]: 3, FOLDED_NAME: 3}  # which trace's labels stay first
TREE_JS = """
() => {
  const rank = LABEL_RANK;
  const overlap = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  // the pixels a figure gains stay for the next steps' figures of the run (the page does not jump)
  const grow = (gd) => {
    const full = gd._fullLayout || {}, meta = (gd.layout || {}).meta;
    const box = gd.closest('#tree-plot');  // outlives the plot, which Gradio may draw anew each step
    if (!meta || !full._size || !box || !window.Plotly) return false;
    if (box.feBase !== meta.height) { box.feBase = meta.height; box.feExtra = 0; }
    const need = full.height - meta.height + meta.plot_px - full._size.h;
    if (!Number.isFinite(need)) return false;
    box.feExtra = Math.max(box.feExtra, Math.ceil(need));
    if (Math.abs(full.height - (meta.height + box.feExtra)) < 1) return false;
    window.Plotly.relayout(gd, {height: meta.height + box.feExtra});
    return true;
  };
  const declutter = (gd) => {
    const labels = [];
    gd.querySelectorAll('.scatterlayer .trace').forEach((g) => {
      const name = (g.__data__ && g.__data__[0] && g.__data__[0].trace.name) || '';
      g.querySelectorAll('.textpoint text').forEach((t) => {
        t.style.visibility = '';
        delete t.dataset.feHidden;
        if (t.textContent) labels.push({t, r: rank[name] ?? 4, box: t.getBoundingClientRect()});
      });
    });
    labels.sort((a, b) => a.r - b.r || a.box.left - b.box.left);
    const kept = [];
    for (const {t, box} of labels) {
      if (kept.some((k) => overlap(box, k))) { t.style.visibility = 'hidden'; t.dataset.feHidden = 'overlap'; }
      else kept.push(box);
    }
  };
  const drawn = (gd) => { if (!grow(gd)) declutter(gd); };
  const hook = () => document.querySelectorAll('#tree-plot .js-plotly-plot').forEach((gd) => {
    if (gd.feTree || typeof gd.on !== 'function') return;
    gd.feTree = true;
    gd.on('plotly_afterplot', () => drawn(gd));
    drawn(gd);
  });
  new MutationObserver(hook).observe(document.body, {childList: true, subtree: true});
  hook();
}
""".replace("LABEL_RANK", json.dumps(LABEL_RANK))

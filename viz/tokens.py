"""Tokens as people read them: visible whitespace for tree labels, and the reply as spans that say
how each token was produced (the target's own bonus token, or a draft token accepted at depth d).

Everything here is pure: it takes token ids (from `StepTrace`s) and a `decode(ids) -> str`
callable, never a model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

Decode = Callable[[list[int]], str]

BONUS = "target (bonus)"
MAX_LABEL = 10  # characters of a tree label before it is cut with '…'
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}

# Span colours: the target's own tokens in a cool grey-blue, accepted drafts in greens that
# deepen with depth (a deeper accepted draft saved more target forwards).
BONUS_COLOR = "#cfd8e6"
DEPTH_COLORS = ["#d9f0d3", "#b8e3b0", "#93d18c", "#6fbf6a", "#4daa4d", "#34913a", "#22782d", "#135f22"]
# Presentation mode's palette, for the bonus token then depths 1, 2, ...: pale greens that deepen wash
# out on a projector, so there each depth gets its own hue (Okabe-Ito's colour-blind safe set), with
# black or white text, whichever contrasts more (`readable_text`).
PRESENT_COLORS = ["#bdbdbd", "#f0e442", "#e69f00", "#56b4e9", "#009e73", "#0072b2", "#d55e00", "#cc79a7", "#000000"]


def glyph_note() -> str:
    """One line saying what the glyphs in token labels stand for."""
    names = {" ": "a space", "\n": "a newline", "\t": "a tab"}  # (a carriage return is rare: left out)
    parts = [f"{_VISIBLE[c]} {name}" for c, name in names.items()]
    return "In token labels " + " · ".join(parts + ["∅ an empty token", "… a label cut short"]) + "."


def luminance(color: str) -> float:
    """Relative luminance of a #rrggbb colour (WCAG 2)."""
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(int(color[i:i + 2], 16) / 255) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two #rrggbb colours (1 to 21)."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def readable_text(background: str) -> str:
    """Black or white, whichever contrasts more with `background`."""
    return max(("#000000", "#ffffff"), key=lambda c: contrast(background, c))


def present_css(scope: str = "body.fe-present") -> str:
    """CSS that recolours reply tokens and legend chips (anything with `data-depth`) with
    `PRESENT_COLORS` under `scope`: depths past the palette take its last colour."""
    sel = ", ".join(f"{scope} .{c}[data-depth{{}}]" for c in ("fe-tok", "fe-chip", "fe-ptok"))
    rules = []
    for depth, bg in [(None, PRESENT_COLORS[-1]), *enumerate(PRESENT_COLORS)]:
        where = sel.replace("{}", "" if depth is None else f'="{depth}"')
        rules.append(f"{where} {{ background:{bg} !important; color:{readable_text(bg)} !important; }}")
    return "\n".join(rules)


def visible(text: str) -> str:
    """Whitespace made visible: ' ' -> '␣', newline -> '↵', tab -> '⇥'."""
    return "".join(_VISIBLE.get(c, c) for c in text)


def token_label(text: str, limit: int = MAX_LABEL) -> str:
    """A short, readable tree label for one token's text ('∅' for an empty one)."""
    label = visible(text) or "∅"
    return label if len(label) <= limit else label[: limit - 1] + "…"


def depth_category(depth: int) -> str:
    """The span category of a token: the bonus token (depth 0) or an accepted draft at depth d."""
    return BONUS if depth <= 0 else f"draft d{depth}"


def depth_color(depth: int) -> str:
    return BONUS_COLOR if depth <= 0 else DEPTH_COLORS[min(depth, len(DEPTH_COLORS)) - 1]


def text_color(depth: int) -> str:
    """Dark text on the light colours, white on the deep greens."""
    return "#ffffff" if depth >= 5 else "#111111"


def color_map(max_depth: int = len(DEPTH_COLORS)) -> dict[str, str]:
    """Category -> colour for `gr.HighlightedText` (the bonus first, then depths 1..max_depth)."""
    return {depth_category(d): depth_color(d) for d in range(0, max_depth + 1)}


def label_decoder(decode: Decode | Mapping[int, str]) -> Callable[[int], str]:
    """One-token text for labels, from a decode callable or a stored {token id: text} map."""
    if isinstance(decode, Mapping):
        table = {int(k): v for k, v in decode.items()}
        return lambda tid: table.get(int(tid), f"#{tid}")
    return lambda tid: decode([int(tid)])


@dataclass
class Span:
    text: str
    depth: int  # of the token that completed the text (0: bonus)
    step: int
    token_ids: list[int]

    @property
    def category(self) -> str:
        return depth_category(self.depth)


class SpanBuilder:
    """Incremental token -> text spans. Each token's text is the difference between decoding a
    short window ending at it and the same window without it, so a token that starts a word keeps
    its space whatever the tokenizer does at sequence starts. A token that ends inside a multi-byte
    character is merged into the span of the token that completes it."""

    WINDOW = 6

    def __init__(self, decode: Decode):
        self.decode = decode
        self.ids: list[int] = []
        self.pending = 0  # index of the first token not yet covered by a span
        self.spans: list[Span] = []

    def add(self, tokens: Iterable[int], depths: Iterable[int], step: int) -> list[Span]:
        new = []
        for tok, depth in zip(tokens, depths):
            self.ids.append(int(tok))
            end = len(self.ids)
            ctx = max(0, self.pending - self.WINDOW)
            before = self.decode(self.ids[ctx:self.pending]) if self.pending > ctx else ""
            full = self.decode(self.ids[ctx:end])
            if full.endswith("\ufffd"):
                continue  # an incomplete character: wait for the next token
            text = full[len(before):] if full.startswith(before) else self.decode(self.ids[self.pending:end])
            span = Span(text, int(depth), step, self.ids[self.pending:end])
            self.pending = end
            if text:
                new.append(span)
        self.spans.extend(new)
        return new

    def add_trace(self, trace: Mapping) -> list[Span]:
        return self.add(trace["tokens"], trace["token_depths"], int(trace.get("step", 0)))


def token_spans(traces: Iterable[Mapping], decode: Decode) -> list[Span]:
    """The reply of a whole decode as spans, one per token (empty texts such as a skipped
    end-of-turn token are dropped)."""
    b = SpanBuilder(decode)
    for tr in traces:
        b.add_trace(tr)
    return b.spans


def highlighted(spans: Iterable[Span]) -> list[tuple[str, str]]:
    """`gr.HighlightedText` value: (text, category) pairs."""
    return [(s.text, s.category) for s in spans]


def spans_to_json(spans: Iterable[Span]) -> list[dict]:
    return [{"text": s.text, "depth": s.depth, "step": s.step, "token_ids": s.token_ids} for s in spans]


def spans_from_json(rows: Iterable[Mapping]) -> list[Span]:
    return [Span(str(r["text"]), int(r["depth"]), int(r.get("step", 0)), [int(t) for t in r.get("token_ids", [])])
            for r in rows]


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def legend_html(max_depth: int = len(DEPTH_COLORS)) -> str:
    chips = " ".join(f'<span class="fe-chip" data-depth="{d}" style="background:{depth_color(d)};padding:1px 6px;'
                    f'margin-right:4px;border-radius:4px;font-size:0.8em;color:{text_color(d)};white-space:nowrap">'
                    f'{_esc(depth_category(d))}</span>' for d in range(max_depth + 1))
    return f'<div class="fe-legend" style="margin-bottom:6px;line-height:1.9">{chips}</div>'


def spans_html(spans: Iterable[Span], legend: bool = True, empty: str = "", clickable: bool = False) -> str:
    """The reply as running text: one <span> per token with its background colour by how it was
    made, `data-depth` / `data-step` attributes and a tooltip (`clickable`: which says that a click
    shows the token's step). Whitespace is kept (pre-wrap)."""
    spans = list(spans)
    parts = []
    for s in spans:
        how = "the target's own (bonus) token" if s.depth <= 0 else f"draft token accepted at depth {s.depth}"
        tip = f"{how} · step {s.step} · token id {', '.join(map(str, s.token_ids))}"
        tip += " · click: the tree of this step" if clickable else ""
        parts.append(f'<span class="fe-tok" data-depth="{s.depth}" data-step="{s.step}" '
                     f'style="background:{depth_color(s.depth)};border-radius:3px;color:{text_color(s.depth)}" '
                     f'title="{_esc(tip)}">{_esc(s.text)}</span>')
    body = "".join(parts) or f'<span class="fe-empty" style="color:#888">{_esc(empty)}</span>'
    deepest = min(max((s.depth for s in spans), default=0), len(DEPTH_COLORS))
    head = legend_html(max(4, deepest)) if legend else ""  # the legend lists depths 0..max(4, deepest)
    return head + f'<div class="fe-reply" style="white-space:pre-wrap;line-height:1.6;font-size:0.95em">{body}</div>'

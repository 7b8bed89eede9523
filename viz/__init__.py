"""Pure trace -> picture functions for the FastEagle app (no model, no Gradio, no torch); the
numbers the pictures show are `fasteagle.trace`'s."""

from viz.charts import (
    acceptance_histogram,
    batch_speedup_chart,
    depth_acceptance_chart,
    depth_acceptance_lines,
    time_split_chart,
)
from viz.explorer import EXPLORER_CSS, EXPLORER_JS, explorer_html
from viz.palette import palette_css
from viz.playback import PLAYBACK_JS, decode_seconds, playback_html
from viz.race import landing_step, race_html
from viz.stepper import STAGE_CSS, STAGE_JS, stage_html
from viz.tokens import (
    BONUS,
    Span,
    SpanBuilder,
    color_map,
    depth_category,
    glyph_note,
    highlighted,
    present_css,
    spans_html,
    token_label,
    token_spans,
    visible,
)
from viz.trace_io import TraceFileError, make_run_file, parse_run_file
from viz.tree import (
    ACCEPTED_PATH,
    LARGE,
    NORMAL,
    TREE_JS,
    VERDICT_COLORS,
    VERDICTS,
    TreeStyle,
    empty_figure,
    tree_figure,
    tree_height,
    tree_layout,
)
from viz.whatif import WHATIF_CSS, WHATIF_JS, whatif_html

__all__ = [
    "ACCEPTED_PATH", "BONUS", "LARGE", "NORMAL", "PLAYBACK_JS", "STAGE_CSS", "STAGE_JS", "Span", "SpanBuilder",
    "TREE_JS",
    "TraceFileError", "TreeStyle", "VERDICTS", "VERDICT_COLORS", "acceptance_histogram", "batch_speedup_chart",
    "color_map", "decode_seconds", "depth_acceptance_chart", "depth_acceptance_lines", "depth_category",
    "empty_figure", "glyph_note", "highlighted", "landing_step", "make_run_file", "palette_css", "parse_run_file",
    "playback_html", "present_css", "race_html", "spans_html", "stage_html",
    "time_split_chart", "token_label", "token_spans",
    "tree_figure", "tree_height", "tree_layout", "visible", "WHATIF_CSS", "WHATIF_JS", "whatif_html",
    "EXPLORER_CSS", "EXPLORER_JS", "explorer_html",
]

"""Side-by-side measurement of decoding methods on prompt sets.

Protocol: the same chat template and `max_new_tokens` for every method; one warmup run per method
(the longest prompt, all `max_new_tokens`, stop tokens ignored);
methods interleaved prompt by prompt (so drift hits all alike); device sync before each clock read.
Reported per method, overall and per category: tokens/s (pooled, median and spread over prompts),
speedup against our vanilla loop and against Hugging Face `generate`, tau (tokens per target
forward, bonus included), per-depth acceptance, draft and verify ms per step, peak GPU memory, and
how many greedy outputs are token-identical to vanilla (not checked under sampling).

JSON schema (`compare` + `result_document`): {"device", "target", "date", "torch", "settings",
"methods": {name: summary}, "per_category": {category: {name: summary}}, "rows": {name: [per prompt]},
"command"} (+ "partial" for a run stopped early, "snapshot" for one `--rerun` keeps as measured);
docs/results.md says what each field holds.

One module per job: `prompts` (prompt files), `timing` (timing decodes, `compare`), `costs` (a
verify forward and a draft step timed alone), `tune` (`--tree auto` and the budget curve),
`reports` (summaries, the result document, Markdown tables, the docs' result blocks) and `plots` (the
Plotly charts, `--redraw`). The metrics on traces (tau, per-depth acceptance, the replay at
smaller budgets) are `fasteagle.trace`'s.
"""

from fasteagle.bench.costs import SHAPES, draft_step_cost, verify_cost
from fasteagle.bench.plots import charts, draw, redraw
from fasteagle.bench.prompts import load_prompts, tuning_prompts
from fasteagle.bench.reports import (
    drafter_summary,
    markdown_table,
    per_prompt,
    read_result,
    render_docs,
    reply_digest,
    reply_match,
    result_block,
    result_document,
    summarize,
    update_docs,
)
from fasteagle.bench.timing import HF_METHODS, compare, cpu_model, device_name, time_one
from fasteagle.bench.tune import (
    AUTO_BUDGETS,
    GPU_AUTO_BUDGETS,
    auto_tree,
    budget_curve,
    lookup_nodes,
    node_paths,
    nondecreasing,
    token_paths,
)

__all__ = [
    "AUTO_BUDGETS", "GPU_AUTO_BUDGETS", "HF_METHODS", "SHAPES", "auto_tree",
    "budget_curve", "charts", "compare", "cpu_model", "device_name", "draw", "draft_step_cost", "drafter_summary",
    "load_prompts", "lookup_nodes", "markdown_table", "node_paths", "nondecreasing", "per_prompt", "read_result",
    "redraw", "render_docs", "reply_digest", "reply_match", "result_block", "result_document", "summarize",
    "time_one", "token_paths",
    "tuning_prompts", "update_docs", "verify_cost",
]

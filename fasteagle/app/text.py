"""The app's words: the explainers, and the Markdown and HTML lines a run puts on the page (stats,
the identical badge, the summary table, the comparison, a step, a waiting page's place in line).
Pure functions of their arguments; the numbers come from `fasteagle.trace`."""

from __future__ import annotations

import re
from collections.abc import Callable

import viz
from fasteagle import trace
from fasteagle.app.engine import MethodSpec, Request
from fasteagle.methods import PAPER_BUDGET

EXPLAINER = """
**Speculative decoding** makes a big *target* model emit several tokens per forward pass, with
exactly the output it would produce alone.

1. **Drafter.** A cheap model guesses the next few tokens. *FastEagle*'s drafter is a cascade of
   small layers that reads the target's hidden states and emits a guess for every depth 1..N in
   **one** pass (EAGLE-style drafters need one pass per depth). *Lookup* copies what followed the
   same words earlier in the prompt or reply (no training at all). *FastEagle + lookup* verifies
   both guesses at once: lookup's branches (diamonds in the tree) join the cascade's tree.
2. **Tree.** Instead of one guess per depth the drafter proposes a small **tree**: the most likely
   token continues the backbone, runners-up become side branches, and a runner-up likely enough
   grows its own branch (the paper's *backbone* shape keeps them as leaves). *top-k per depth*
   and the *node budget* bound its size.
3. **Verification.** The target reads every tree node in **one** forward (each node sees only its
   own ancestors). Walking from the root, a node is **accepted** (green) if the target would have
   produced it there (greedy: its argmax; sampling: an exact accept/reject rule); its siblings are
   then **rejected** (red) and nodes below a rejected node are **never reached** (grey). The
   target's own prediction after the last accepted node is the **bonus token** (blue star), so every
   step yields at least one token.
4. **τ (tau)** = tokens per target forward, bonus included: vanilla decoding has τ = 1. Speed-up is
   roughly τ divided by how much more a drafting+verifying step costs than a plain step.

Greedy speculative decoding is *lossless*: the reply must equal vanilla decoding token for token
(the badge checks it). On a small CPU the tree forward costs more than a one-token forward, so the
speed-up here is smaller than on a GPU.
"""


# the tree shapes as the page names them (the settings' choice, the comparison's line)
TREE_SHAPE_LABELS = {"product": "side branches continue", "backbone": "paper's backbone (side leaves)"}

# Below the explainer: speculative decoding inside a serving engine, the committed vLLM batch sweep.
BATCH_RESULT = "bench/results/cpu-smollm2-135m-vllm-batches-2026-11-28.json"  # relative to the repository
BATCH_NOTE = """
**In a serving engine, as the batch grows.** A server decodes many requests together, and one forward over
a batch costs little more than over one request only while the hardware has idle compute; a draft tree
multiplies the tokens each request feeds, so once the batch fills the hardware, verifying guesses costs
real time and speculation pays less, then nothing. Measured inside vLLM on a 2-core CPU (the repository's
docs/serving.md has the command and the table):
"""


def batch_chart():
    """The explainer's chart of the committed vLLM batch sweep (None where the checkout lacks the file)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / BATCH_RESULT
    return viz.batch_speedup_chart(json.loads(path.read_text())) if path.is_file() else None


# The short explainer beside the tree in presentation mode: how to read it, in the tree's colours.
def _dot(color: str) -> str:
    return f'<span style="color:{color}">●</span>'


SHORT_EXPLAINER = f"""
**Reading the tree.** The root (depth 0) is the last token the target chose. The drafter guessed
the tokens to its right; the target checked them all in **one** forward pass.

- {_dot(viz.VERDICT_COLORS[trace.ACCEPTED])} **accepted**: the target would have written it there
- {_dot(viz.VERDICT_COLORS[trace.REJECTED])} **rejected**: it would not, so nothing below it counts
- {_dot(viz.VERDICT_COLORS[trace.NEVER_REACHED])} **never reached**: below a rejected node, or after an
  accepted sibling
- <span style="color:{viz.tree.BONUS_COLOR}">★</span> **bonus**: the target's own next token, free with
  the same forward

Each step emits the accepted tokens plus the bonus: **τ** = tokens per target forward (vanilla: 1).
"""



def fmt_stats(side: str, tr: dict | None, spent: float, method: str = "") -> str:
    if tr is None:
        return f"**{side}** · waiting…"
    tokens = int(tr.get("generated", 0))
    tps = tokens / spent if spent > 0 else 0.0
    if side == "vanilla":
        return f"**vanilla** · {tokens} tokens · {spent:.2f} s · **{tps:.1f} tokens/s**"
    tau = trace.tau(tokens - 1, int(tr.get("forwards") or 0))  # the prefill's token has no verify step
    return (f"**{method}** · step {tr.get('step', 0)} · {tokens} tokens · τ {tau:.2f} · {spent:.2f} s · "
            f"**{tps:.1f} tokens/s**")


def modelled_stats(van: dict) -> str:
    """Vanilla's stats line when its decode was skipped under load: its time is a model, and says so."""
    return (f"**vanilla** · not decoded ({int(van.get('waiting', 0))} waiting) · **modelled**: {van['tokens']} "
            f"tokens in {van['wall_s']:.2f} s · {van['tokens_per_s']:.1f} tokens/s")


def modelled_badge(greedy: bool) -> str:
    """The badge of a run whose vanilla decode was skipped: nothing was compared, so no ✔."""
    why = ("greedy fp32 decoding gives vanilla's reply token for token by construction (the tests check every "
           "method)" if greedy else "sampling would draw a different reply anyway")
    return (f'<div class="badge info" data-identical="skipped">vanilla not decoded while other pages waited: '
            f"{why}; its time is modelled</div>")


def queue_line(ahead: int, wait_s: float) -> str:
    """A waiting page's place in line and its estimate (to the end of its own decode)."""
    if ahead <= 0:
        return f"decoding… (about {wait_s:.0f} s)"
    runs = "1 run" if ahead == 1 else f"{ahead} runs"
    return f"waiting: {runs} before yours · about {wait_s:.0f} s until your reply"


def replay_note(meta: dict) -> str:
    """Above a replayed example: where its numbers come from."""
    return (f"*An example: replayed from this machine's decode of {meta.get('time', 'earlier')}, with the "
            "timings measured then (change any setting to decode afresh).*\n\n")


def recorded_note(meta: dict) -> str:
    """Above the recorded run the first screen shows when this machine has decoded no example yet."""
    return (f"*A recorded run, shipped with the app: decoded on {meta.get('machine', 'another machine')} on "
            f"{meta.get('time', 'an earlier day')}, with the timings measured there. Press Run to decode it "
            "here.*\n\n")


def shared_note(replays: int) -> str:
    """Above a decoded run that example replays overlapped: they took no turn at the decoder, but their
    drawing shared the CPU, so this run's times may be a little longer than the machine's alone."""
    if replays <= 0:
        return ""
    what = "an example replay" if replays == 1 else f"{replays} example replays"
    return (f"*While this run decoded, the server also drew {what} (no decoding) on the same CPU: its times "
            "may be a little longer than this machine's alone.*\n\n")


def badge_html(spec_tokens: list[int], van_tokens: list[int], greedy: bool, dtype: str) -> str:
    first = trace.first_difference(spec_tokens, van_tokens)
    if first is None:
        return (f'<div class="badge ok" data-identical="true">✔ identical outputs: speculative = vanilla '
                f"({len(spec_tokens)} tokens)</div>")
    if greedy:
        why = ("in half precision a tree forward can flip near-tie argmaxes" if dtype in ("bfloat16", "float16")
               else "greedy decoding must match: this is a bug")
        return (f'<div class="badge bad" data-identical="false">✘ outputs differ from token {first} on '
                f"({why})</div>")
    return (f'<div class="badge info" data-identical="false">≠ outputs differ from token {first} on: expected when '
            "sampling (both are exact samples from the target, drawn with different random numbers)</div>")


def summary_markdown(method: str, spec: dict, van: dict | None, modelled: bool = False) -> str:
    """The run's table, speculative against vanilla; `modelled`: vanilla's column is the model of a
    decode that was skipped (`Engine.modelled_vanilla`), and says so."""
    def ms(x: float) -> str:
        return f"{x:.0f}"

    rows = [("tokens", spec["tokens"], van["tokens"] if van else "–"),
            ("target forwards (after prefill)", spec["forwards"], van["forwards"] if van else "–"),
            ("τ (tokens / forward)", f"{spec['tau']:.2f}", f"{van['tau']:.2f}" if van else "–"),
            ("wall time (s)", f"{spec['wall_s']:.2f}", f"{van['wall_s']:.2f}" if van else "–"),
            ("tokens / s", f"{spec['tokens_per_s']:.1f}", f"{van['tokens_per_s']:.1f}" if van else "–"),
            ("prefill / draft / verify / other (ms)",
             " / ".join(ms(spec[k]) for k in ("prefill_ms", "draft_ms", "verify_ms", "other_ms")),
             " / ".join(ms(van[k]) for k in ("prefill_ms", "draft_ms", "verify_ms", "other_ms")) if van else "–")]
    van_name = "vanilla (modelled)" if modelled else "vanilla"
    lines = [f"| | {method} | {van_name} |", "|---|---:|---:|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if van and van["tokens_per_s"] > 0:  # per token: the two replies may differ in length when sampling
        speed = spec["tokens_per_s"] / van["tokens_per_s"]
        head = f"### Speed-up: **{speed:.2f}×** (speculative tokens/s ÷ vanilla tokens/s)"
        if modelled:
            head = (f"### Speed-up: **{speed:.2f}×**, against vanilla *modelled* (not decoded: other pages were "
                    f"waiting) from this machine's measured plain step, {van.get('step_ms', 0):.0f} ms")
        if spec["tokens"] != van["tokens"]:
            head += f"\n\nThe replies differ in length ({spec['tokens']} and {van['tokens']} tokens)."
    else:
        head = "### Speculative decode only (no vanilla run in this trace)"
    return head + "\n\n" + "\n".join(lines)


def compare_settings(req: Request, n: int) -> str:
    """The line above the comparison: what every decode in it shared."""
    k = ",".join(map(str, req.tree_k)) or "each drafter's own"
    how = "greedy" if req.temperature <= 0 else f"sampling at temperature {req.temperature:g}, seed {req.seed}"
    return (f"{n} decodes of the prompt, {how}, at most {req.max_new_tokens} new tokens, node budget "
            f"{req.tree_budget}, top-k {k}, tree shape: {TREE_SHAPE_LABELS.get(req.tree_shape, req.tree_shape)}.")


def compare_markdown(runs: dict[str, tuple[list[dict], float]], greedy: bool) -> str:
    """One table of the decodes of one prompt ({name: (traces, decode seconds)}, vanilla among them):
    target forwards, τ and tokens/s from `trace.run_summary`, and whether each reply is vanilla's."""
    van_traces, van_s = runs["vanilla"]
    van = trace.run_summary(van_traces, van_s)
    van_toks = trace.reply_tokens(van_traces)
    lines = ["| method | target forwards | τ | tokens/s | × vanilla | identical to vanilla |",
             "|---|---:|---:|---:|---:|---|"]
    for name, (traces, secs) in runs.items():
        s = trace.run_summary(traces, secs)
        first = trace.first_difference(trace.reply_tokens(traces), van_toks)
        same = ("–" if name == "vanilla" else "✔ yes" if first is None
                else f"✘ no, from token {first}" + ("" if greedy else " (sampling: expected)"))
        speed = s["tokens_per_s"] / van["tokens_per_s"] if van["tokens_per_s"] > 0 else 0.0
        lines.append(f"| {name} | {s['forwards']} | {s['tau']:.2f} | {s['tokens_per_s']:.1f} | {speed:.2f}× | "
                     f"{same} |")
    return "\n".join(lines)


def _code(text: str) -> str:
    """`text` as a Markdown code span, also when it holds backticks (a fence longer than any run of them)."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def step_markdown(tr: dict, label_decode: Callable[[list[int]], str], n_steps: int) -> str:
    toks = tr.get("tokens") or []
    depths = tr.get("token_depths") or []
    parts = [_code(viz.token_label(label_decode([t]), 16)) + (" (bonus)" if d == 0 else f" (d{d})")
             for t, d in zip(toks, depths)]
    return (f"**Step {tr.get('step', 0)} of {n_steps - 1}** emitted {len(toks)} token(s): " + ", ".join(parts)
            + (f" · finished: {tr['finished']}" if tr.get("finished") else ""))



def paper_tree_note(m: MethodSpec, fast: int, on_gpu: bool) -> str:
    """What the paper's tree costs here: on a CPU the target's forward costs more the more tokens it
    verifies, so its ~60 tokens per step cost several one-token steps; on a GPU they are nearly free."""
    if on_gpu:
        text = (f"On a GPU a {PAPER_BUDGET}-token forward costs about as much as a one-token one, so the paper's "
                f"tree is nearly free here (the default here for {m.label}: {fast} nodes).")
    else:
        text = (f"**The paper's {PAPER_BUDGET}-node tree decodes slower on this machine.** Every step the target "
                f"verifies ~{PAPER_BUDGET} tokens in one forward, and on a CPU a forward costs more the more "
                f"tokens it reads (on a GPU, {PAPER_BUDGET} tokens cost about as much as one). Expect a higher τ "
                f"and fewer tokens/s than with the fast tree ({fast} nodes).")
    if m.key == "lookup":
        text += " Lookup drafts no tree: the node budget sizes FastEagle's and EAGLE-3's."
    return text

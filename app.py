"""FastEagle visualizer: watch speculative decoding draft a tree, verify it, and keep the accepted
path, step by step, next to plain (vanilla) decoding of the same prompt.

    python app.py                    # http://127.0.0.1:7860
    FASTEAGLE_TARGET=<hf id or dir> FASTEAGLE_DRAFTER=<drafter dir> python app.py
    python app.py --target meta-llama/Llama-3.1-8B-Instruct --drafter yuhuili/EAGLE3-LLaMA3.1-Instruct-8B

Environment: FASTEAGLE_TARGET (default: the embedded SmolLM2-135M-Instruct), FASTEAGLE_DRAFTER
(FastEagle drafter dir, default assets/drafters/smollm2-135m-fasteagle), FASTEAGLE_EAGLE3_DRAFTER,
FASTEAGLE_DEVICE / FASTEAGLE_DTYPE, FASTEAGLE_PRECOMPUTE=1 (decode first, then animate: what the
app does on ZeroGPU, which Spaces mark with SPACES_ZERO_GPU), GRADIO_SERVER_PORT / _NAME.

The app is thin: decoding is `fasteagle.generate.generate`, pictures are `viz`.
"""

from __future__ import annotations

import html
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
import torch  # noqa: E402

import viz  # noqa: E402
from fasteagle import files, trace  # noqa: E402
from fasteagle.env import env  # noqa: E402
from fasteagle.errors import FastEagleError  # noqa: E402
from fasteagle.generate import chat_prompt_ids, check_context, generate  # noqa: E402
from fasteagle.methods import (  # noqa: E402
    DEFAULT_DRAFTER,
    DEFAULT_EAGLE3,
    EQUAL_DRAFTER,
    MAX_BUDGET,
    PAPER_BUDGET,
    Settings,
    build,
    default_budget,
)
from fasteagle.target import Target, load_target  # noqa: E402
from fasteagle.tree import DEFAULT_TREE_SHAPE, TREE_SHAPES  # noqa: E402
from fasteagle.verify import SamplingParams  # noqa: E402
from viz.tokens import spans_from_json, spans_to_json  # noqa: E402

# Hugging Face ZeroGPU, where the GPU exists only inside functions decorated with spaces.GPU. Spaces
# set SPACES_ZERO_GPU there; `spaces` can be importable on other hardware too, where it must not count.
spaces = None
if os.environ.get("SPACES_ZERO_GPU", "").strip().lower() in ("1", "t", "true", "yes"):
    import spaces  # type: ignore  # noqa: E402

log = logging.getLogger("fasteagle.app")

ROOT = Path(__file__).resolve().parent
MAX_PROMPT_CHARS = 4000
MAX_PROMPT_TOKENS = 1024
MAX_NEW_TOKENS = 256
FRAME_S = 0.12  # at most one tree figure per this many seconds while streaming (the last step always)
ANIMATE_S = 6.0  # precomputed runs replay in about this long per side
PLAY_S = 1.2  # the play button's pace: one step per this many seconds
EAGLE3_DRAFTER = DEFAULT_EAGLE3

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

CSS = """
#identical-badge .badge { display:inline-block; padding:6px 12px; border-radius:14px; font-weight:600; }
#identical-badge .ok { background:#e3f4e1; color:#1b6e23; border:1px solid #8cc98f; }
#identical-badge .bad { background:#fde4e4; color:#9b1c1c; border:1px solid #e39a9a; }
#identical-badge .info { background:#eef2f8; color:#33475b; border:1px solid #b9c6d8; }
.stats p { margin:0; font-variant-numeric: tabular-nums; }
.fe-race { font-variant-numeric: tabular-nums; }
.fe-race-row { display:flex; align-items:center; gap:8px; margin:3px 0; }
.fe-race-name { width:150px; flex:none; text-align:right; font-size:90%; }
.fe-race-bar { height:14px; border-radius:3px; flex:none; max-width:calc(100% - 220px); }
.fe-race-note { font-size:85%; opacity:.8; margin-top:4px; }
#spec-reply .fe-tok { cursor:pointer; }
#spec-reply .fe-tok.fe-sel { outline:2px solid #1f4e9c; outline-offset:1px; }
.fe-play-bar { display:flex; flex-wrap:wrap; align-items:center; gap:8px; margin-bottom:6px; font-size:90%; }
.fe-play-bar button { padding:2px 10px; border:1px solid #b9c6d8; border-radius:6px; background:#eef2f8; }
.fe-play-note { opacity:.75; font-size:90%; }
.fe-play-bar select { padding:2px 6px; width:auto; min-width:11em; border:1px solid #b9c6d8; border-radius:6px; }
.fe-play-panes { display:grid; grid-template-columns:1fr 1fr; gap:10px; }
.fe-play-side { border:1px solid #dde3ea; border-radius:6px; padding:6px 8px; min-width:0; }
.fe-play-head { font-size:90%; margin-bottom:4px; font-variant-numeric:tabular-nums; }
.fe-play-text { white-space:pre-wrap; line-height:1.6; font-size:0.92em; max-height:12em; overflow-y:auto; }
.fe-play-empty { opacity:.7; font-size:90%; }
body.fe-present { overflow-anchor:none; }
body.fe-present .fe-reply, body.fe-present .fe-play-text { font-size:1.25em !important; }
body.fe-present .fe-chip { font-size:1.05em !important; }
body.fe-present #step-info, body.fe-present .fe-race, body.fe-present #glyphs, body.fe-present #tree-side {
  font-size:1.2em; }
""" + viz.present_css()


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

# js_on_load of the speculative reply: a click on a token asks for its step (the `token` event), and
# the tokens of the step on the replay slider are outlined again whenever the reply is redrawn.
REPLY_JS = """
const mark = () => {
  const box = document.querySelector('#step-slider input[type=number]');
  const step = box ? box.value : '';
  element.querySelectorAll('.fe-tok').forEach((t) => t.classList.toggle('fe-sel', t.dataset.step === step));
};
element.addEventListener('click', (e) => {
  const t = e.target.closest('.fe-tok');
  if (t) trigger('token', {step: Number(t.dataset.step)});
});
watch('value', mark);
"""
# the replay slider moved: outline that step's tokens in the speculative reply
MARK_STEP_JS = """(step) => {
  document.querySelectorAll('#spec-reply .fe-tok').forEach(
    (t) => t.classList.toggle('fe-sel', Number(t.dataset.step) === Number(step)));
}"""
# presentation mode on or off: the page's class, which the CSS's larger type and colours hang on
PRESENT_JS = "(on) => { document.body.classList.toggle('fe-present', Boolean(on)); }"
# Run in presentation mode: the race strip and the tree come into view while the run starts
SCROLL_JS = """() => {
  if (document.body.classList.contains('fe-present'))
    document.querySelector('#race')?.scrollIntoView({behavior: 'smooth', block: 'start'});
}"""
# All methods: their progress line and table come into view (they sit below the run's charts)
COMPARE_JS = "() => { document.querySelector('#compare-box')?.scrollIntoView({behavior: 'smooth', block: 'start'}); }"


# -- setup ------------------------------------------------------------------------------------------
@dataclass
class MethodSpec:
    label: str
    key: str  # a fasteagle.methods method name
    drafter_dir: Path | None  # None: needs no trained weights
    available: bool
    note: str = ""


def _has_weights(d: Path | None) -> bool:
    """A trained drafter folder: ours (config.json and safetensors), or an EAGLE-3 checkpoint."""
    from fasteagle import eagle3_format

    if d is None or not (d / "config.json").exists():
        return False
    return any(d.glob("model*.safetensors")) or (eagle3_format.is_checkpoint(d) and any(d.glob("*.bin")))


def _drafter_folders(drafter: str | Path | None, eagle3: str | Path | None) -> tuple[Path, Path, str]:
    """The FastEagle and EAGLE-3 drafter folders the app offers (a Hugging Face id fetched once), and how
    the EAGLE-3 one is named: a drafter given for FastEagle that is an EAGLE-3 drafter stands for EAGLE-3."""
    from fasteagle.eagle3_format import is_checkpoint, resolve
    from fasteagle.methods import drafter_kind

    fe = resolve(drafter or env().drafter or DEFAULT_DRAFTER)
    e3_given = eagle3 or env().eagle3_drafter
    if not e3_given and fe.is_dir() and drafter_kind(fe) == "eagle3":
        fe, e3_given = Path(DEFAULT_DRAFTER), drafter or env().drafter
    e3 = resolve(e3_given or EAGLE3_DRAFTER)
    return fe, e3, str(e3_given) if e3_given and is_checkpoint(e3) else ""  # a published one says its name


def _shown(p: Path) -> str:
    """A path as people type it: relative to the repository when inside it."""
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


EQUAL_LABEL = "FastEagle · equal training"  # the cascade trained as the shipped EAGLE-3 drafter was
EQUAL_INFO = (f"EAGLE-3 and {EQUAL_LABEL}: one recipe, the same training tokens; FastEagle: the shipped "
              "cascade, trained far longer")


def method_specs(drafter_dir: str | Path | None = None, eagle3_dir: str | Path | None = None) -> list[MethodSpec]:
    """Every method the app knows, with whether it can run here (trained weights present). The shipped
    EAGLE-3 drafter comes with its equal: a cascade trained on the same tokens (offered with it only)."""
    fe, e3, e3_name = _drafter_folders(drafter_dir, eagle3_dir)
    fe_s, e3_s = _shown(fe), _shown(e3)
    equal = ([MethodSpec(EQUAL_LABEL, "fasteagle", EQUAL_DRAFTER, True)]
             if e3.resolve() == DEFAULT_EAGLE3.resolve() and _has_weights(EQUAL_DRAFTER) else [])
    return [
        MethodSpec("FastEagle", "fasteagle", fe, _has_weights(fe),
                   f"no FastEagle drafter at `{fe_s}`: train one with `python -m fasteagle train --out {fe_s}` "
                   "(or set FASTEAGLE_DRAFTER). The lookup drafter works without training."),
        MethodSpec(f"EAGLE-3 · {Path(e3_name).name}" if e3_name else "EAGLE-3", "eagle3", e3, _has_weights(e3),
                   f"no EAGLE-3 drafter at `{e3_s}`: train one with `python -m fasteagle train --drafter eagle3 "
                   f"--out {e3_s}` (or set FASTEAGLE_EAGLE3_DRAFTER)."),
        *equal,
        MethodSpec("FastEagle + lookup", "fasteagle+lookup", fe, _has_weights(fe),
                   f"no FastEagle drafter at `{fe_s}` to join with lookup."),
        MethodSpec("lookup", "lookup", None, True),
    ]


@dataclass(frozen=True)
class Example:
    label: str  # what the example's button shows: short, never cut mid-word
    prompt: str
    temperature: float = 0.0


# Prompts on which the default target (SmolLM2-135M-Instruct) answers sensibly and the drafters
# accept long runs (greedy τ about 2 to 2.4 with FastEagle on CPU): lists, code, rewrites; the last
# one samples, where acceptance follows the exact accept/reject rule.
EXAMPLES = [
    Example("Months, one per line", "List the months of the year, one per line."),
    Example("Python: reverse a string", "Write a Python function that reverses a string."),
    Example("Python: factorial", "Write a Python function that returns the factorial of n."),
    Example("Three health tips", "Give three tips for staying healthy."),
    Example("Rewrite formally", "Rewrite this sentence more formally: hey, can u send me the report asap?"),
    Example("Rewrite in plain English",
            "Rewrite in plain English: The meeting has been postponed owing to unforeseen circumstances."),
    Example("Sampling (T 0.7): reverse a string", "Write a Python function that reverses a string.", 0.7),
]


def device_text(target: Target) -> str:
    dev = target.device
    dtype = str(target.dtype).replace("torch.", "")
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        return f"**Device:** CUDA · {name} · {dtype}" + (" · ZeroGPU" if spaces is not None else "")
    return f"**Device:** CPU (torch threads: {torch.get_num_threads()}) · {dtype}" + (
        " · ZeroGPU (decodes run on the GPU)" if spaces is not None else "")


# -- decoding ---------------------------------------------------------------------------------------
@dataclass
class Request:
    prompt: str
    method: MethodSpec
    temperature: float
    max_new_tokens: int
    tree_k: tuple[int, ...]  # per depth; empty: each drafter's own (what the benchmarks used)
    tree_budget: int
    seed: int
    tree_shape: str = DEFAULT_TREE_SHAPE  # FastEagle's tree (fasteagle.tree.TREE_SHAPES)


def _timed(gen: Iterator) -> Iterator[tuple[Any, float]]:
    """Items of `gen` with the seconds spent inside `gen` so far (consumer time excluded).

    Each step runs under torch.inference_mode in the *calling* thread: Gradio resumes a streaming
    handler on whichever worker thread is free, and inference mode is thread-local, so the mode
    `generate` entered on its first thread would be missing on the next one (its cache updates
    would then fail)."""
    spent = 0.0
    while True:
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                item = next(gen)
        except StopIteration:
            return
        spent += time.perf_counter() - t0
        yield item, spent


def _fits(m: MethodSpec, target: Target) -> MethodSpec:
    """The method, marked unavailable when its drafter was trained for another target (read from its
    config, no weights loaded): the app then says so once at startup, not at every run."""
    if not m.available or m.drafter_dir is None:
        return m
    from fasteagle.methods import check_fits

    try:
        check_fits(m.drafter_dir, target.model)
    except FastEagleError as exc:
        return MethodSpec(m.label, m.key, m.drafter_dir, False,
                          f"the {m.label} drafter at `{_shown(m.drafter_dir)}` does not fit {target.name}: {exc}. "
                          "Point FASTEAGLE_DRAFTER / FASTEAGLE_EAGLE3_DRAFTER at one trained for it, or train "
                          "one with `python -m fasteagle train`.")
    return m


class Engine:
    """The loaded target plus a cache of drafters; every decode goes through here."""

    def __init__(self, target: Target, drafter_dir: str | Path | None = None, eagle3_dir: str | Path | None = None):
        self.target = target
        self.methods = [_fits(m, target) for m in method_specs(drafter_dir, eagle3_dir)]
        self._drafters: dict[tuple, Any] = {}
        self._default_k: dict[tuple, Any] = {}  # each drafter's own top-k, for requests that leave it empty
        tok = target.tokenizer
        self._label_cache: dict[int, str] = {}
        self.decode_text: Callable[[list[int]], str] = lambda ids: tok.decode(ids, skip_special_tokens=True)
        self.warm = False

    @property
    def available(self) -> list[MethodSpec]:
        return [m for m in self.methods if m.available]

    def method(self, label: str) -> MethodSpec:
        for m in self.methods:
            if m.label == label or m.key == label:
                if not m.available:
                    raise FastEagleError(m.note or f"{m.label} is not available here (no trained drafter)")
                return m
        names = ", ".join(m.label for m in self.available)
        raise FastEagleError(f"unknown method {label!r}; choose one of {names}")

    def label(self, tid: int) -> str:
        """One token's text for tree labels (special tokens shown, partial bytes as the raw piece)."""
        tid = int(tid)
        if tid not in self._label_cache:
            tok = self.target.tokenizer
            if not 0 <= tid < len(tok):  # only a replayed file from another model holds these
                return f"⟨{tid}⟩"
            text = tok.decode([tid], skip_special_tokens=False)
            if "\ufffd" in text:
                text = str(tok.convert_ids_to_tokens(tid))
            self._label_cache[tid] = text
        return self._label_cache[tid]

    def label_decode(self, ids: list[int]) -> str:
        return "".join(self.label(i) for i in ids)

    def request(self, prompt: str | None, method: str, temperature: float, max_new_tokens: float, tree_k: str,
                tree_budget: float, seed: float, tree_shape: str | None = DEFAULT_TREE_SHAPE) -> Request:
        """Validate the inputs; every problem is a one-line FastEagleError."""
        prompt = prompt or ""
        if not prompt.strip():
            raise FastEagleError("the prompt is empty: type a question or pick an example")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise FastEagleError(f"the prompt is too long: {len(prompt)} characters (at most {MAX_PROMPT_CHARS})")
        try:
            max_new = int(max_new_tokens)
            budget = int(tree_budget)
            seed_i = int(seed or 0)
            temp = float(temperature or 0.0)
        except (TypeError, ValueError, OverflowError):
            raise FastEagleError("max new tokens, node budget and seed must be numbers") from None
        if not 0 <= seed_i < 2**63:
            raise FastEagleError("the seed must be between 0 and 2**63 - 1")
        if not 1 <= max_new <= MAX_NEW_TOKENS:
            raise FastEagleError(f"max new tokens must be between 1 and {MAX_NEW_TOKENS}")
        if not 0.0 <= temp <= 2.0:
            raise FastEagleError("temperature must be between 0 and 2")
        if not 2 <= budget <= 256:
            raise FastEagleError("the node budget must be between 2 and 256")
        k_text = str(tree_k or "").replace(" ", "")
        try:  # empty: each drafter's own k (the one the benchmarks used)
            ks = [int(x) for x in k_text.split(",")] if k_text else []
        except ValueError:
            raise FastEagleError(f"top-k per depth must be an integer or a comma list like 8,4,2 (got {tree_k!r})") \
                from None
        if any(not 1 <= k <= 64 for k in ks):
            raise FastEagleError("every top-k must be between 1 and 64")
        shape = tree_shape or DEFAULT_TREE_SHAPE
        if shape not in TREE_SHAPES:
            raise FastEagleError(f"unknown tree shape {shape!r}; choose one of {', '.join(TREE_SHAPES)}")
        return Request(prompt, self.method(method), temp, max_new, tuple(ks), budget, seed_i, shape)

    def prompt_ids(self, req: Request) -> torch.Tensor:
        """The prompt's token ids, checked against the app's and the model's limits before any work."""
        ids = chat_prompt_ids(self.target, req.prompt)
        if ids.numel() > MAX_PROMPT_TOKENS:
            raise FastEagleError(f"the prompt is too long: {ids.numel()} tokens (at most {MAX_PROMPT_TOKENS})")
        check_context(self.target, ids.numel(), req.max_new_tokens)
        return ids

    def drafter(self, req: Request):
        m = req.method
        if m.key == "lookup":
            from fasteagle.lookup import LookupDrafter

            return LookupDrafter()
        key = (m.key, str(m.drafter_dir))
        if key not in self._drafters:
            settings = Settings(tree_budget=req.tree_budget).with_drafter(m.key, m.drafter_dir)
            try:
                self._drafters[key] = build(m.key, self.target, settings)
                self._default_k[key] = getattr(self._drafters[key], "tree_k", None)
            except FastEagleError as exc:  # say which method's drafter, as the startup check does
                raise FastEagleError(f"the {m.label} drafter could not be loaded: {exc}") from None
            except Exception as exc:  # a corrupt or incompatible checkpoint: one line, not a traceback
                log.exception("loading the %s drafter failed", m.label)
                raise FastEagleError(f"the {m.label} drafter at {m.drafter_dir} failed to load: "
                                     f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        d = self._drafters[key]
        ks = list(req.tree_k)
        if hasattr(d, "tree_k"):  # one k per depth for FastEagle; EAGLE-3's dynamic tree takes one k
            d.tree_k = (self._default_k[key] if not ks
                        else ks[0] if len(ks) == 1 or m.key.startswith("eagle3") else ks)
        if hasattr(d, "tree_budget"):
            d.tree_budget = req.tree_budget
        if m.key.startswith("fasteagle"):
            d.tree_shape = req.tree_shape
        return d

    def steps(self, ids: torch.Tensor, drafter, req: Request) -> Iterator[tuple[dict, float]]:
        """(StepTrace dict, seconds spent decoding so far) per step."""
        gen = generate(self.target, ids, drafter=drafter, max_new_tokens=req.max_new_tokens,
                       sampling=SamplingParams(req.temperature), seed=req.seed)
        for tr, spent in _timed(gen):
            yield tr.to_dict(), spent

    def warmup(self, drafter=None) -> None:
        """One tiny decode so that lazy initialisation is not billed to the first timed run."""
        ids = chat_prompt_ids(self.target, "Hi")
        for d in (drafter, None) if drafter is not None else (None,):
            for _ in generate(self.target, ids, drafter=d, max_new_tokens=3):
                pass
        if self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)
        self.warm = True

    def decode_both(self, req: Request) -> dict:
        """Both decodes to the end, as plain data (what a ZeroGPU function may return); a user
        error comes back as {"error": message} rather than an exception across processes."""
        try:
            ids = self.prompt_ids(req)
            drafter = self.drafter(req)
            self.warmup(drafter)
            out = {}
            for side, d in (("speculative", drafter), ("vanilla", None)):
                rows = list(self.steps(ids, d, req))
                out[side] = {"traces": [r for r, _ in rows], "elapsed": [s for _, s in rows]}
            return out
        except FastEagleError as exc:
            return {"error": str(exc)}


ENGINE: Engine | None = None  # module-level so that a spaces.GPU function can reach it


def _decode_both_plain(req: Request) -> dict:
    return ENGINE.decode_both(req)


_decode_both_gpu = spaces.GPU(duration=120)(_decode_both_plain) if spaces is not None else _decode_both_plain


# -- presentation -----------------------------------------------------------------------------------
def _fmt_stats(side: str, tr: dict | None, spent: float, method: str = "") -> str:
    if tr is None:
        return f"**{side}** · waiting…"
    tokens = int(tr.get("generated", 0))
    tps = tokens / spent if spent > 0 else 0.0
    if side == "vanilla":
        return f"**vanilla** · {tokens} tokens · {spent:.2f} s · **{tps:.1f} tokens/s**"
    tau = trace.tau(tokens - 1, int(tr.get("forwards") or 0))  # the prefill's token has no verify step
    return (f"**{method}** · step {tr.get('step', 0)} · {tokens} tokens · τ {tau:.2f} · {spent:.2f} s · "
            f"**{tps:.1f} tokens/s**")


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


def summary_markdown(method: str, spec: dict, van: dict | None) -> str:
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
    lines = [f"| | {method} | vanilla |", "|---|---:|---:|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if van and van["tokens_per_s"] > 0:  # per token: the two replies may differ in length when sampling
        speed = spec["tokens_per_s"] / van["tokens_per_s"]
        head = f"### Speed-up: **{speed:.2f}×** (speculative tokens/s ÷ vanilla tokens/s)"
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
            f"{req.tree_budget}, top-k {k}, tree shape {req.tree_shape}.")


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


# -- the UI: layout ---------------------------------------------------------------------------------
@dataclass
class UI:
    """The page's components: a run's settings, then what a run shows, then the trace file buttons."""

    prompt: gr.Textbox
    method: gr.Radio
    tree_size: gr.Radio  # fast (this device's default budget) or the paper's tree; sets the budget
    tree_size_note: gr.Markdown
    temperature: gr.Slider
    max_new: gr.Slider
    tree_k: gr.Textbox
    budget: gr.Slider
    tree_shape: gr.Radio
    seed: gr.Number
    run_btn: gr.Button
    compare_btn: gr.Button
    spec_stats: gr.Markdown
    spec_reply: gr.HTML
    van_stats: gr.Markdown
    van_reply: gr.HTML
    badge: gr.HTML
    race: gr.HTML  # set from run_state (not an API output): a finished run's forwards, both ways
    playback: gr.HTML  # set from run_state: both replies played at their measured speeds (in the browser)
    tree_plot: gr.Plot
    step_slider: gr.Slider
    prev_btn: gr.Button
    next_btn: gr.Button
    play_btn: gr.Button
    play_timer: gr.Timer  # ticks only while playing
    step_info: gr.Markdown
    tree_side: gr.Column  # the short explainer beside the tree, shown in presentation mode
    summary: gr.Markdown
    hist_plot: gr.Plot
    depth_plot: gr.Plot
    time_plot: gr.Plot
    download: gr.DownloadButton
    upload: gr.UploadButton
    compare_box: gr.Accordion  # "All methods on this prompt", opened by its button
    compare_status: gr.Markdown
    compare_table: gr.Markdown
    compare_plot: gr.Plot
    present: gr.Checkbox  # presentation mode
    present_state: gr.State  # the same, for handlers (a State is no API parameter)
    run_state: gr.State  # the run on screen (its record, as `viz.make_run_file` makes it), or None

    @property
    def run_inputs(self) -> list:
        return [self.prompt, self.method, self.temperature, self.max_new, self.tree_k, self.budget, self.seed,
                self.tree_shape, self.run_state, self.present_state]

    @property
    def compare_inputs(self) -> list:
        """The run's settings but the method: the comparison runs every method."""
        return [self.prompt, self.temperature, self.max_new, self.tree_k, self.budget, self.seed, self.tree_shape]

    @property
    def compare_outputs(self) -> list:
        return [self.compare_status, self.compare_table, self.compare_plot, self.compare_box]

    @property
    def outputs(self) -> list:
        """Everything a finished run or a replayed file sets, in the order of the API's outputs."""
        return [self.spec_stats, self.spec_reply, self.van_stats, self.van_reply, self.badge, self.tree_plot,
                self.step_slider, self.step_info, self.summary, self.hist_plot, self.depth_plot, self.time_plot,
                self.download, self.run_state]


def layout(engine: Engine) -> UI:
    """Every component, in page order (inside a gr.Blocks): the title and presentation mode, a warning
    when FastEagle has no drafter, the settings beside the replies and the tree, the run's charts, the
    comparison of all methods, the trace file buttons and the explainer."""
    target = engine.target
    with gr.Row(equal_height=True):
        gr.Markdown("# FastEagle: speculative decoding, step by step\n"
                    f"Target **{target.name}** · " + device_text(target))
        present = gr.Checkbox(False, label="Presentation mode", elem_id="present", scale=0, min_width=200,
                              info="large type, projector colours, the explainer beside the tree")
    missing = [m for m in engine.methods if not m.available and m.key == "fasteagle"]
    if missing:
        gr.Markdown(f"⚠️ **FastEagle is not available:** {missing[0].note}", elem_id="drafter-warning")
    run_state, present_state = gr.State(None), gr.State(False)
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            settings = _settings(engine)
        with gr.Column(scale=3):
            shown = _run_view()
    summary = gr.Markdown("", elem_id="summary")
    with gr.Row():
        hist_plot = gr.Plot(value=viz.empty_figure("accepted length per step", 280), show_label=False,
                            elem_id="hist-plot")
        depth_plot = gr.Plot(value=viz.empty_figure("acceptance per depth", 280), show_label=False,
                             elem_id="depth-plot")
        time_plot = gr.Plot(value=viz.empty_figure("draft vs verify time", 280), show_label=False,
                            elem_id="time-plot")
    compare = _compare_view()
    with gr.Row():
        download = gr.DownloadButton("Download trace (JSON)", value=None, elem_id="download")
        upload = gr.UploadButton("Replay a trace file…", file_types=[".json"], type="filepath", elem_id="upload")
    with gr.Accordion("How it works (for students)", open=False):
        gr.Markdown(EXPLAINER)
    return UI(**settings, **shown, **compare, summary=summary, hist_plot=hist_plot, depth_plot=depth_plot,
              time_plot=time_plot, download=download, upload=upload, present=present, present_state=present_state,
              run_state=run_state)


def _compare_view() -> dict[str, Any]:
    """"All methods on this prompt": a progress line, then one table and one per-depth chart."""
    with gr.Accordion("All methods on this prompt", open=False, elem_id="compare-box") as box:
        status = gr.Markdown("**Run all methods** (beside Run) decodes the prompt with vanilla decoding and every "
                             "method here, with the same settings.", elem_id="compare-status")
        table = gr.Markdown("", elem_id="compare-table")
        plot = gr.Plot(value=viz.empty_figure("acceptance per depth, each method", 280), show_label=False,
                       elem_id="compare-plot")
    return {"compare_box": box, "compare_status": status, "compare_table": table, "compare_plot": plot}


def _settings(engine: Engine) -> dict[str, Any]:
    """The left column: the prompt with Run (and All methods) right under it, the examples, then
    every setting of a run."""
    on_gpu = engine.target.device.type == "cuda"
    methods = [m.label for m in engine.available]
    prompt = gr.Textbox(label="Prompt", lines=4, max_lines=12, elem_id="prompt",
                        placeholder="Ask something, or pick an example below")
    with gr.Row():
        run_btn = gr.Button("Run", variant="primary", elem_id="run", scale=2, min_width=100)
        compare_btn = gr.Button("Run all methods", elem_id="compare", scale=2, min_width=100)
    # created before the examples that set it, drawn below the method (its place on the page)
    temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0 = greedy)", render=False,
                            elem_id="temperature")
    gr.Examples(examples=[[e.prompt, e.temperature] for e in EXAMPLES], inputs=[prompt, temperature],
                example_labels=[e.label for e in EXAMPLES], label="Examples", examples_per_page=8, elem_id="examples")
    method = gr.Radio(methods, value=methods[0], label="Drafting method", elem_id="method",
                      info=EQUAL_INFO if EQUAL_LABEL in methods else None)
    tree_size = gr.Radio([("fast tree (this device's default)", "fast"),
                          (f"paper-size tree ({PAPER_BUDGET} nodes)", "paper")], value="fast",
                         label="Tree size (FastEagle / EAGLE-3)", elem_id="tree-size")
    tree_size_note = gr.Markdown("", elem_id="tree-size-note")
    temperature.render()
    max_new = gr.Slider(1, MAX_NEW_TOKENS, value=64 if not on_gpu else 128, step=1,
                        label="Max new tokens", elem_id="max-new")
    with gr.Accordion("Tree settings (FastEagle / EAGLE-3)", open=False):
        tree_k = gr.Textbox(value="", label="Top-k per depth",
                            placeholder="each drafter's own: FastEagle 32, EAGLE-3 10",
                            info="one number, or one per depth: 8,4,2; empty: each drafter's own "
                                 "(what the benchmarks used)")
        budget = gr.Slider(2, MAX_BUDGET, value=default_budget(engine.available[0].key, on_gpu), step=1,
                           label="Node budget", elem_id="budget",
                           info="tree nodes the drafter verifies per step, root included "
                                "(lookup's branches come on top)")
        tree_shape = gr.Radio([("side branches continue", "product"),
                               ("paper's backbone (side leaves)", "backbone")], value=DEFAULT_TREE_SHAPE,
                              label="Tree shape (FastEagle)", elem_id="tree-shape",
                              info="both keep the most probable nodes; the paper's lets nothing grow "
                                   "below a runner-up")
    seed = gr.Number(value=0, precision=0, label="Seed (sampling)")
    return {"prompt": prompt, "method": method, "tree_size": tree_size, "tree_size_note": tree_size_note,
            "temperature": temperature, "max_new": max_new, "tree_k": tree_k, "budget": budget,
            "tree_shape": tree_shape, "seed": seed, "run_btn": run_btn, "compare_btn": compare_btn}


def _run_view() -> dict[str, Any]:
    """The right column: both replies with their stats, the badge, the race strip, the replies played
    at their measured speeds, then the tree with its step controls (the short explainer beside it in
    presentation mode)."""
    with gr.Row(equal_height=False):
        with gr.Column():
            spec_stats = gr.Markdown("**speculative** · not run yet", elem_id="spec-stats", elem_classes="stats")
            spec_reply = gr.HTML(viz.spans_html([], empty="the reply appears here"), js_on_load=REPLY_JS,
                                 elem_id="spec-reply", container=True, padding=True)
        with gr.Column():
            van_stats = gr.Markdown("**vanilla** · not run yet", elem_id="vanilla-stats", elem_classes="stats")
            van_reply = gr.HTML(viz.spans_html([], legend=False, empty="every token is the target's own"),
                                elem_id="vanilla-reply", container=True, padding=True)
    badge = gr.HTML('<div class="badge info">run a prompt to compare the outputs</div>', elem_id="identical-badge")
    race = gr.HTML("", elem_id="race")
    playback = gr.HTML(viz.playback_html({}), js_on_load=viz.PLAYBACK_JS, elem_id="playback")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=300):
            steps = _step_view()
        with gr.Column(scale=1, min_width=220, visible=False, elem_id="tree-side") as tree_side:
            gr.Markdown(SHORT_EXPLAINER)
    return {"spec_stats": spec_stats, "spec_reply": spec_reply, "van_stats": van_stats, "van_reply": van_reply,
            "badge": badge, "race": race, "playback": playback, "tree_side": tree_side, **steps}


def _step_view() -> dict[str, Any]:
    """The tree, its step slider with previous / play / next, what the step emitted, and what the
    glyphs in its labels mean."""
    tree_plot = gr.Plot(value=viz.empty_figure(), show_label=False, elem_id="tree-plot")
    # The static maximum bounds what the server accepts; each run narrows the visible range.
    with gr.Row(equal_height=True):
        step_slider = gr.Slider(0, MAX_NEW_TOKENS, value=0, step=1, label="Replay step (after a run)",
                                interactive=False, elem_id="step-slider", scale=6)
        prev_btn = gr.Button("◀ prev", size="sm", elem_id="step-prev", scale=1, min_width=70)
        play_btn = gr.Button("▶ play", size="sm", elem_id="step-play", scale=1, min_width=70)
        next_btn = gr.Button("next ▶", size="sm", elem_id="step-next", scale=1, min_width=70)
    play_timer = gr.Timer(PLAY_S, active=False)
    step_info = gr.Markdown("", elem_id="step-info")
    gr.Markdown(viz.glyph_note() + " Click a token of the speculative reply to see the step that made it.",
                elem_id="glyphs")
    return {"tree_plot": tree_plot, "step_slider": step_slider, "prev_btn": prev_btn, "next_btn": next_btn,
            "play_btn": play_btn, "play_timer": play_timer, "step_info": step_info}


# -- the UI: handlers -------------------------------------------------------------------------------
class Handlers:
    """What the page does on each event, for one engine and one page's components. `precompute`:
    decode both sides to the end first (on ZeroGPU, in a GPU function), then animate the steps;
    otherwise each step is shown as it is decoded.

    The event handlers (on_*) have comments, not docstrings: Gradio publishes a handler's docstring
    as its API description."""

    def __init__(self, engine: Engine, ui: UI, precompute: bool):
        self.engine, self.ui, self.precompute = engine, ui, precompute

    # /run: decode the prompt both ways, streaming each side's steps; a user error is a warning with
    # the screen unchanged, a failure mid-decode a warning over the previous run.
    def on_run(self, prompt, method, temperature, max_new_tokens, tree_k, tree_budget, seed,
               shape=DEFAULT_TREE_SHAPE, previous=None, present=False):
        engine, ui = self.engine, self.ui
        style = _style(present)
        try:
            req = engine.request(prompt, method, temperature, max_new_tokens, tree_k, tree_budget, seed, shape)
            ids = engine.prompt_ids(req)
            drafter = engine.drafter(req)  # loaded here (cached) so that a bad checkpoint warns early
        except FastEagleError as exc:
            gr.Warning(str(exc))
            # every output kept as it is: a generator that yields nothing would blank them all (and the
            # slider's None would then break its change event)
            yield {c: gr.skip() for c in ui.outputs}
            return
        yield {ui.spec_stats: _fmt_stats("speculative", None, 0), ui.van_stats: _fmt_stats("vanilla", None, 0),
               ui.spec_reply: viz.spans_html([]), ui.van_reply: viz.spans_html([], legend=False), ui.summary: "",
               ui.step_info: "",
               ui.badge: '<div class="badge info">decoding…</div>',
               # the decode's own range (grown by _stream), not the static 0..MAX_NEW_TOKENS; the state is
               # empty meanwhile, so that the slider's change events draw nothing of the previous run
               ui.step_slider: gr.Slider(minimum=0, maximum=1, value=0, interactive=False), ui.run_state: None,
               ui.tree_plot: viz.empty_figure("prefill: the target reads the prompt…")}
        try:
            if self.precompute:
                result = _decode_both_gpu(req)
                if "error" in result:
                    raise FastEagleError(result["error"])
                events = _animate(result)
            else:
                events = self._live(ids, drafter, req)
            builders = {"speculative": viz.SpanBuilder(engine.decode_text),
                        "vanilla": viz.SpanBuilder(engine.decode_text)}
            record = {"speculative": {"traces": [], "elapsed": []}, "vanilla": {"traces": [], "elapsed": []}}
            yield from self._stream(events, builders, record, req.method.label, style)
            run, path = self._save(req, builders, record)
            yield self.finish(run, engine.label_decode, style) | {ui.download: str(path)}
        except Exception as exc:  # keep the app alive; a traceback goes to the server log only
            if isinstance(exc, FastEagleError):
                msg = str(exc)
            else:
                log.exception("decoding failed")
                msg = f"decoding failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            gr.Warning(msg)
            # the screen shows the previous run again (still replayable and downloadable), under the error
            restored = self.finish(previous, self._labeler(previous), style) if previous else {}
            yield restored | {ui.badge: f'<div class="badge bad">{html.escape(msg)}</div>'}

    # /compare: vanilla and every method here on the prompt, with the same settings, one after the
    # other (a progress line meanwhile); then one table and one per-depth chart. A user error is a
    # warning with the screen unchanged, a failure a line saying so over the last comparison.
    def on_compare(self, prompt, temperature, max_new_tokens, tree_k, tree_budget, seed, shape=DEFAULT_TREE_SHAPE):
        engine, ui = self.engine, self.ui
        try:
            reqs = [engine.request(prompt, m.label, temperature, max_new_tokens, tree_k, tree_budget, seed, shape)
                    for m in engine.available]
            ids = engine.prompt_ids(reqs[0])
        except FastEagleError as exc:
            gr.Warning(str(exc))
            yield {c: gr.skip() for c in ui.compare_outputs}
            return
        jobs = [("vanilla", reqs[0], False)] + [(r.method.label, r, True) for r in reqs]
        runs: dict[str, tuple[list[dict], float]] = {}
        try:
            for i, (name, req, drafted) in enumerate(jobs):
                done = " · ".join(f"{n} ✔" for n in runs)
                yield {ui.compare_box: gr.Accordion(open=True),
                       ui.compare_status: f"{done + ' · ' if done else ''}decoding with **{name}** "
                                          f"({i + 1} of {len(jobs)})…"}
                drafter = engine.drafter(req) if drafted else None
                engine.warmup(drafter)  # its first decode's lazy set-up not billed to its tokens/s
                rows = list(engine.steps(ids, drafter, req))
                runs[name] = ([r for r, _ in rows], rows[-1][1] if rows else 0.0)
        except Exception as exc:  # keep the last comparison on screen; say what failed, in one line
            if not isinstance(exc, FastEagleError):
                log.exception("comparing the methods failed")
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            gr.Warning(f"the comparison failed: {msg}")
            yield {ui.compare_status: f"⚠️ the comparison failed at {name}: {html.escape(msg)}",
                   ui.compare_table: gr.skip(), ui.compare_plot: gr.skip(), ui.compare_box: gr.skip()}
            return
        yield {ui.compare_status: compare_settings(reqs[0], len(jobs)),
               ui.compare_table: compare_markdown(runs, reqs[0].temperature <= 0),
               ui.compare_plot: viz.depth_acceptance_lines({n: tr for n, (tr, _) in runs.items() if n != "vanilla"}),
               ui.compare_box: gr.skip()}

    def _live(self, ids, drafter, req):
        for side, d in (("speculative", drafter), ("vanilla", None)):
            for tr, spent in self.engine.steps(ids, d, req):
                yield side, tr, spent

    def _stream(self, events, builders: dict, record: dict, mlabel: str, style: viz.TreeStyle) -> Iterator[dict]:
        """Each side's steps into `record` and its reply into `builders`; a frame on screen at most
        every FRAME_S seconds, and the last step's."""
        ui = self.ui
        last_frame, tree_height = 0.0, 0  # the tree's figure grows with the run, never shrinks
        for side, tr, spent in events:
            record[side]["traces"].append(tr)
            record[side]["elapsed"].append(spent)
            builders[side].add_trace(tr)
            now = time.perf_counter()
            if now - last_frame < FRAME_S and not tr.get("finished"):
                continue
            last_frame = now
            if side == "speculative":
                fig = viz.tree_figure(tr, self.engine.label_decode, min_height=tree_height, style=style)
                tree_height = fig.layout.height
                steps = len(record[side]["traces"]) - 1
                yield {ui.spec_stats: _fmt_stats("speculative", tr, spent, mlabel),
                       ui.spec_reply: viz.spans_html(builders[side].spans, clickable=True),
                       ui.tree_plot: fig,
                       ui.step_slider: gr.Slider(minimum=0, maximum=max(steps, 1), value=steps, interactive=False)}
            else:
                yield {ui.van_stats: _fmt_stats("vanilla", tr, spent),
                       ui.van_reply: viz.spans_html(builders[side].spans, legend=False)}

    def _save(self, req: Request, builders: dict, record: dict) -> tuple[dict, Path]:
        """The finished run as a run record, and the trace file it was written to (for download)."""
        engine, target = self.engine, self.engine.target
        sides = {}
        for side, rec in record.items():
            sides[side] = {"traces": rec["traces"], "elapsed": rec["elapsed"],
                           "spans": spans_to_json(builders[side].spans),
                           "summary": trace.run_summary(rec["traces"], rec["elapsed"][-1] if rec["elapsed"] else 0)}
        ids_seen = {t for rec in record.values() for tr in rec["traces"]
                    for t in tr["tokens"] + ((tr.get("tree") or {}).get("tokens") or [])}
        meta = {"prompt": req.prompt, "method": req.method.label, "method_key": req.method.key,
                "temperature": req.temperature, "max_new_tokens": req.max_new_tokens,
                "tree_k": ",".join(map(str, req.tree_k)),
                "tree_budget": req.tree_budget, "tree_shape": req.tree_shape, "seed": req.seed,
                "target": target.name,
                "device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
                "time": time.strftime("%Y-%m-%d %H:%M:%S")}
        run = viz.make_run_file(meta, sides, {i: engine.label(i) for i in sorted(ids_seen)})
        path = Path(tempfile.mkdtemp(prefix="fasteagle-")) / f"fasteagle-trace-{time.strftime('%H%M%S')}.json"
        files.write_text(path, viz.trace_io.dumps(run))
        return run, path

    def finish(self, run: dict, label: Callable[[int], str], style: viz.TreeStyle = viz.NORMAL) -> dict:
        """Every end-of-run output from a run record (a fresh run or an uploaded file), its tree drawn
        in `style`."""
        ui = self.ui
        meta, sides = run.get("meta", {}), run["sides"]
        spec, van = sides["speculative"], sides.get("vanilla")
        mlabel = meta.get("method", "speculative")
        s_sum = spec.get("summary") or trace.run_summary(spec["traces"])
        v_sum = (van.get("summary") or trace.run_summary(van["traces"])) if van else None
        traces = spec["traces"]
        n = len(traces)
        land = viz.landing_step(traces)  # the longest accepted path, not the lone bonus token at the end
        height = _run_tree_height(run, style)
        upd = {
            ui.spec_stats: _fmt_stats("speculative", traces[-1], s_sum["wall_s"], mlabel),
            ui.spec_reply: viz.spans_html(spans_from_json(spec.get("spans") or []), clickable=True),
            ui.summary: summary_markdown(mlabel, s_sum, v_sum),
            ui.hist_plot: viz.acceptance_histogram(traces),
            ui.depth_plot: viz.depth_acceptance_chart(traces),
            ui.time_plot: viz.time_split_chart({mlabel: s_sum} | ({"vanilla": v_sum} if v_sum else {})),
            ui.tree_plot: viz.tree_figure(traces[land], label, min_height=height, style=style),
            ui.step_slider: gr.Slider(minimum=0, maximum=max(n - 1, 1), value=land, step=1, interactive=True),
            ui.step_info: step_markdown(traces[land], label, n),
            ui.run_state: run,
        }
        if van:
            upd[ui.van_stats] = _fmt_stats("vanilla", van["traces"][-1], v_sum["wall_s"])
            upd[ui.van_reply] = viz.spans_html(spans_from_json(van.get("spans") or []), legend=False)
            upd[ui.badge] = badge_html(trace.reply_tokens(traces), trace.reply_tokens(van["traces"]),
                                       float(meta.get("temperature", 0)) <= 0, meta.get("dtype", ""))
        else:
            upd[ui.van_stats] = "**vanilla** · not in this trace"
            upd[ui.van_reply] = viz.spans_html([], legend=False, empty="no vanilla decode in this trace")
            upd[ui.badge] = '<div class="badge info">no vanilla decode in this trace</div>'
        return upd

    # /replay_step: the tree and the emitted tokens of one step of the run on screen.
    def on_step(self, step, run, present=False):
        if not run:
            return gr.skip(), gr.skip()
        traces = run["sides"]["speculative"]["traces"]
        try:
            i = min(max(int(step or 0), 0), len(traces) - 1)
        except (TypeError, ValueError):
            return gr.skip(), gr.skip()
        label = self._labeler(run)
        try:
            style = _style(present)
            return (viz.tree_figure(traces[i], label, min_height=_run_tree_height(run, style), style=style),
                    step_markdown(traces[i], label, len(traces)))
        except Exception as exc:  # an uploaded file odd in a way its check missed: say so, keep the app
            log.exception("drawing step %d failed", i)
            gr.Warning(f"cannot draw step {i}: {type(exc).__name__}")
            return gr.skip(), gr.skip()

    # the race strip above the tree, from the run on screen (empty while decoding)
    def on_race(self, run):
        if not isinstance(run, dict) or not run.get("sides"):
            return ""
        spec, van = run["sides"]["speculative"], run["sides"].get("vanilla")
        def wall(side):  # the run's own decode time, as its summary table shows it
            if (side.get("summary") or {}).get("wall_s") is not None:
                return float(side["summary"]["wall_s"])
            return float(side["elapsed"][-1]) if side.get("elapsed") else None

        try:
            return viz.race_html(spec["traces"], van["traces"] if van else None, wall(spec),
                                 wall(van) if van else None, (run.get("meta") or {}).get("method", "speculative"))
        except Exception:  # an odd replayed file: no strip rather than a broken page
            log.exception("drawing the race strip failed")
            return ""

    # both replies of the run on screen, to play at their measured speeds (a placeholder without one)
    def on_playback(self, run):
        if not isinstance(run, dict) or not run.get("sides"):
            return viz.playback_html({})
        try:
            return viz.playback_html(run["sides"], (run.get("meta") or {}).get("method", "speculative"))
        except Exception:  # an odd replayed file: the placeholder rather than a broken page
            log.exception("drawing the playback failed")
            return viz.playback_html({})

    # a click on a token of the speculative reply: the slider moves to the step that emitted it
    # (its change event then draws that step), unless it is there already
    def on_token(self, step, run, evt: gr.EventData):
        if not run:
            return gr.skip()
        try:
            want = int(evt.step)
            here = int(step or 0)
        except (AttributeError, TypeError, ValueError):
            return gr.skip()
        traces = run["sides"]["speculative"]["traces"]
        i = next((i for i, tr in enumerate(traces) if int(tr.get("step", i)) == want), None)
        return gr.skip() if i is None or i == here else i

    # presentation mode on or off: the tree redrawn in its sizes, the short explainer beside it
    def on_present(self, on, step, run):
        on = bool(on)
        tree = self.on_step(step, run, on)[0] if run else gr.skip()
        return on, tree, gr.Column(visible=on)

    # the tree size choice: the node budget it stands for, and what it costs on this device
    def on_tree_size(self, size, method):
        on_gpu = self.engine.target.device.type == "cuda"
        try:
            m = self.engine.method(method)
        except FastEagleError:
            return gr.skip(), ""
        fast = default_budget(m.key, on_gpu)
        if size != "paper":
            return fast, ""
        return PAPER_BUDGET, paper_tree_note(m, fast, on_gpu)

    # a new method: its own fast budget, or the paper's tree when that is chosen
    def on_method(self, method, size):
        try:
            key = self.engine.method(method).key
        except FastEagleError:
            return gr.skip()
        return PAPER_BUDGET if size == "paper" else default_budget(key, self.engine.target.device.type == "cuda")

    # /step_prev, /step_next: the step before / after the one on the slider (the slider's change
    # event then draws it); kept at the run's ends, and nothing without a run on screen.
    def on_prev(self, step, run):
        return self._move(step, run, -1)

    def on_next(self, step, run):
        return self._move(step, run, 1)

    def _move(self, step, run, by: int):
        if not run:
            return gr.skip()
        last = len(run["sides"]["speculative"]["traces"]) - 1
        try:
            return min(max(int(step or 0) + by, 0), last)
        except (TypeError, ValueError):
            return gr.skip()

    # play / pause: the timer steps through the run (from the start when at its end), until its end.
    def on_play(self, playing, step, run):
        if playing or not run:
            return False, gr.Timer(active=False), "▶ play", gr.skip()
        last = len(run["sides"]["speculative"]["traces"]) - 1
        start = 0 if int(step or 0) >= last else gr.skip()
        return True, gr.Timer(active=True), "⏸ pause", start

    def on_tick(self, step, run):
        nxt = self._move(step, run, 1)
        last = len(run["sides"]["speculative"]["traces"]) - 1 if run else 0
        if not run or nxt == last or int(step or 0) >= last:
            return nxt, False, gr.Timer(active=False), "▶ play"
        return nxt, True, gr.skip(), gr.skip()

    # /replay_file: a trace file replayed, the screen as its run left it.
    def on_upload(self, path, present=False):
        try:
            if not path:
                raise viz.TraceFileError("no file")
            p = Path(path if isinstance(path, str) else getattr(path, "name", path))
            if p.stat().st_size > viz.trace_io.MAX_BYTES:
                raise viz.TraceFileError(f"the file is larger than {viz.trace_io.MAX_BYTES >> 20} MB")
            run = viz.parse_run_file(p.read_bytes())
            for side in run["sides"].values():  # a file without stored spans: rebuild them here
                if not side.get("spans"):
                    side["spans"] = spans_to_json(viz.token_spans(side["traces"], self.engine.decode_text))
            run["_replayed"] = True  # on_replayed then loads its settings into the controls (once)
            # the download is what is shown
            return self.finish(run, self._labeler(run), _style(present)) | {self.ui.download: str(p)}
        except (viz.TraceFileError, OSError) as exc:
            gr.Warning(f"cannot replay this file: {exc}")
        except Exception as exc:  # a file that passed validation but is still odd
            log.exception("replaying an uploaded trace failed")
            gr.Warning(f"cannot replay this file: {type(exc).__name__}")
        return {c: gr.skip() for c in self.ui.outputs}

    # /replay_settings: after /replay_file, the replayed run's prompt and settings in the controls
    # (each one this app can take; the others keep their value), so that Run decodes it again.
    def on_replayed(self, run):
        ui = self.ui
        keep = {c: gr.skip() for c in self.settings_outputs}
        if not isinstance(run, dict) or not run.get("_replayed"):
            return keep
        run = {k: v for k, v in run.items() if k != "_replayed"}
        meta = run.get("meta") or {}
        upd = dict(keep) | {ui.run_state: run}

        def put(comp, key, convert, ok=lambda v: True):
            try:
                v = convert(meta[key])
            except (KeyError, TypeError, ValueError, OverflowError):
                return
            if ok(v):
                upd[comp] = v

        put(ui.prompt, "prompt", str)
        put(ui.method, "method", str, lambda v: v in [m.label for m in self.engine.available])
        put(ui.temperature, "temperature", float, lambda v: 0.0 <= v <= 1.5)
        put(ui.max_new, "max_new_tokens", int, lambda v: 1 <= v <= MAX_NEW_TOKENS)
        put(ui.tree_k, "tree_k", str)
        put(ui.budget, "tree_budget", int, lambda v: 2 <= v <= MAX_BUDGET)
        put(ui.tree_shape, "tree_shape", str, lambda v: v in TREE_SHAPES)
        put(ui.seed, "seed", int, lambda v: 0 <= v < 2**63)
        return upd

    @property
    def settings_outputs(self) -> list:
        ui = self.ui
        return [ui.prompt, ui.method, ui.temperature, ui.max_new, ui.tree_k, ui.budget, ui.tree_shape, ui.seed,
                ui.run_state]

    def _labeler(self, run):
        """Token labels from the run's own table (a file from another model), else the engine's."""
        table = run.get("token_labels") or {}
        return lambda ids: "".join(table[i] if i in table else self.engine.label(i) for i in ids)


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


def _animate(result):
    """A precomputed decode's steps, paced so that each side replays in about ANIMATE_S seconds."""
    for side in ("speculative", "vanilla"):
        traces, elapsed = result[side]["traces"], result[side]["elapsed"]
        pause = min(0.08, ANIMATE_S / max(len(traces), 1))
        for tr, spent in zip(traces, elapsed):
            yield side, tr, spent
            time.sleep(pause)


def _run_tree_height(run, style: viz.TreeStyle = viz.NORMAL) -> int:
    """The tallest step's tree height in `style`: every step of a run is drawn that tall, so the page
    below the tree stays put while the slider moves. Kept in the run state (not in its file)."""
    key = "_tree_height" if style == viz.NORMAL else "_tree_height_large"
    if type(run.get(key)) is not int:
        run[key] = max(viz.tree_height(tr, style) for tr in run["sides"]["speculative"]["traces"])
    return run[key]


def _style(present) -> viz.TreeStyle:
    """The tree's sizes: large in presentation mode."""
    return viz.LARGE if present else viz.NORMAL


def connect(ui: UI, handlers: Handlers) -> None:
    """The events: Run (and Enter in the prompt), the step controls, a trace file, the settings that
    set others, presentation mode and the comparison of all methods."""
    for trigger in (ui.run_btn.click, ui.prompt.submit):
        trigger(None, js=SCROLL_JS, api_name=False, queue=False)
    ui.run_btn.click(handlers.on_run, ui.run_inputs, ui.outputs,
                     api_name="run", concurrency_limit=1, concurrency_id="decode")
    ui.prompt.submit(handlers.on_run, ui.run_inputs, ui.outputs,
                     api_visibility="private", concurrency_limit=1, concurrency_id="decode")
    # queued: gr.Warning reaches the page only from a queued event (else only the server log)
    ui.upload.upload(handlers.on_upload, [ui.upload, ui.present_state], ui.outputs, api_name="replay_file").then(
        handlers.on_replayed, [ui.run_state], handlers.settings_outputs, api_name="replay_settings")
    ui.compare_btn.click(None, js=COMPARE_JS, api_name=False, queue=False)
    ui.compare_btn.click(handlers.on_compare, ui.compare_inputs, ui.compare_outputs, api_name="compare",
                         concurrency_limit=1, concurrency_id="decode")
    _connect_steps(ui, handlers)
    _connect_settings(ui, handlers)


def _connect_steps(ui: UI, handlers: Handlers) -> None:
    """The replay slider, its buttons and timer, a click on a reply token, and what follows the run
    on screen (the race strip, the playback)."""
    ui.step_slider.change(handlers.on_step, [ui.step_slider, ui.run_state, ui.present_state],
                          [ui.tree_plot, ui.step_info], api_name="replay_step", queue=False, show_progress="hidden")
    ui.step_slider.change(None, ui.step_slider, None, js=MARK_STEP_JS, api_name=False, queue=False)
    ui.prev_btn.click(handlers.on_prev, [ui.step_slider, ui.run_state], ui.step_slider, api_name="step_prev",
                      queue=False, show_progress="hidden")
    ui.next_btn.click(handlers.on_next, [ui.step_slider, ui.run_state], ui.step_slider, api_name="step_next",
                      queue=False, show_progress="hidden")
    ui.spec_reply.token(handlers.on_token, [ui.step_slider, ui.run_state], ui.step_slider, api_name=False,
                        queue=False, show_progress="hidden")
    ui.run_state.change(handlers.on_race, ui.run_state, ui.race, api_name=False, queue=False,
                        show_progress="hidden")
    ui.run_state.change(handlers.on_playback, ui.run_state, ui.playback, api_name=False, queue=False,
                        show_progress="hidden")
    playing = gr.State(False)
    ui.play_btn.click(handlers.on_play, [playing, ui.step_slider, ui.run_state],
                      [playing, ui.play_timer, ui.play_btn, ui.step_slider], api_name=False, queue=False,
                      show_progress="hidden")
    ui.play_timer.tick(handlers.on_tick, [ui.step_slider, ui.run_state],
                       [ui.step_slider, playing, ui.play_timer, ui.play_btn], api_name=False, queue=False,
                       show_progress="hidden")


def _connect_settings(ui: UI, handlers: Handlers) -> None:
    """Controls that set others: the method and the tree size set the node budget; presentation mode
    sets the page's look and redraws the tree."""
    # input, not change: a replayed file's method must not reset the node budget it also loads
    ui.method.input(handlers.on_method, [ui.method, ui.tree_size], ui.budget, api_name=False)
    ui.tree_size.input(handlers.on_tree_size, [ui.tree_size, ui.method], [ui.budget, ui.tree_size_note],
                       api_name=False)
    ui.present.change(None, ui.present, None, js=PRESENT_JS, api_name=False, queue=False)
    ui.present.change(handlers.on_present, [ui.present, ui.step_slider, ui.run_state],
                      [ui.present_state, ui.tree_plot, ui.tree_side], api_name=False, queue=False,
                      show_progress="hidden")


# -- the app ----------------------------------------------------------------------------------------
def build_app(target: Target | None = None, drafter_dir: str | Path | None = None,
              eagle3_dir: str | Path | None = None, precompute: bool | None = None) -> gr.Blocks:
    """The Gradio Blocks app. `target`: an already loaded Target (default: FASTEAGLE_TARGET or the
    embedded model); `precompute`: decode first, then animate (always on ZeroGPU)."""
    global ENGINE
    if target is None:
        e = env()
        target = load_target(e.target, e.device, e.dtype)
    engine = Engine(target, drafter_dir, eagle3_dir)
    ENGINE = engine
    if precompute is None:
        precompute = spaces is not None or env().precompute
    if spaces is None:
        engine.warmup()
    with gr.Blocks(title="FastEagle: speculative decoding, step by step") as demo:
        ui = layout(engine)
        connect(ui, Handlers(engine, ui, precompute))
    demo.queue(default_concurrency_limit=1)
    return demo


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="The FastEagle app (flags override the FASTEAGLE_* variables).")
    p.add_argument("--target", default=None, help="HF model id or folder (FASTEAGLE_TARGET)")
    p.add_argument("--drafter", default=None, help="FastEagle drafter folder or HF id; an EAGLE-3 checkpoint "
                   "here is shown as the EAGLE-3 method (FASTEAGLE_DRAFTER)")
    p.add_argument("--eagle3-drafter", default=None, help="EAGLE-3 drafter: ours, or a checkpoint of the EAGLE, "
                   "SpecForge or vLLM format, folder or HF id (FASTEAGLE_EAGLE3_DRAFTER)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        e = env()
        target = load_target(args.target or e.target, e.device, e.dtype)
        demo = build_app(target, args.drafter, args.eagle3_drafter)
    except FastEagleError as exc:
        raise SystemExit(f"error: {exc}") from None
    launch(demo, server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))


def launch(demo: gr.Blocks, **kwargs):
    """demo.launch with the app's theme, CSS and page script (Gradio 6 takes them at launch: the script
    keeps the tree's labels from overlapping); never share=True."""
    kwargs.setdefault("show_error", False)
    return demo.launch(theme=theme(), css=CSS, js=viz.TREE_JS, **kwargs)


def theme() -> gr.themes.Base:
    """System fonts only: no font download (the app must work offline)."""
    return gr.themes.Soft(font=["ui-sans-serif", "system-ui", "sans-serif"],
                          font_mono=["ui-monospace", "Consolas", "monospace"])


if __name__ == "__main__":
    main()

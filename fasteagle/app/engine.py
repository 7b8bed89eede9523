"""The app's engine glue: which methods the app offers (from the drafter folders given), the checked
request of a run, and the loaded target with its drafters, through which every decode of the app goes.

No Gradio here: the handlers (`fasteagle/app/handlers.py`) call this, and so do the example cache and
the load test's server.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fasteagle.env import env
from fasteagle.errors import FastEagleError
from fasteagle.generate import chat_prompt_ids, check_context, generate
from fasteagle.methods import DEFAULT_DRAFTER, DEFAULT_EAGLE3, EQUAL_DRAFTER, Settings, build
from fasteagle.target import Target
from fasteagle.tree import DEFAULT_TREE_SHAPE, TREE_SHAPES
from fasteagle.verify import SamplingParams

log = logging.getLogger("fasteagle.app")

ROOT = Path(__file__).resolve().parents[2]  # the repository (paths inside it are shown relative to it)
MAX_PROMPT_CHARS = 4000
MAX_PROMPT_TOKENS = 1024
MAX_NEW_TOKENS = 256
EAGLE3_DRAFTER = DEFAULT_EAGLE3


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
    """The loaded target plus a cache of drafters; every decode goes through here. It also keeps what
    decodes cost on this machine: one plain decode step (measured at start-up, then by every plain
    decode), which models vanilla's time when the app skips that decode, and each method's seconds
    per token, which the queue's estimates use."""

    def __init__(self, target: Target, drafter_dir: str | Path | None = None, eagle3_dir: str | Path | None = None):
        self.target = target
        self.methods = [_fits(m, target) for m in method_specs(drafter_dir, eagle3_dir)]
        self._drafters: dict[tuple, Any] = {}
        self._default_k: dict[tuple, Any] = {}  # each drafter's own top-k, for requests that leave it empty
        self._loading = threading.Lock()  # pages load drafters before they queue: once each
        tok = target.tokenizer
        self._label_cache: dict[int, str] = {}
        self.decode_text: Callable[[list[int]], str] = lambda ids: tok.decode(ids, skip_special_tokens=True)
        self.warm = False
        self._warmed: set[int] = set()  # id() of each drafter that ran its warm-up decode
        self.step_s = 0.0  # one plain decode step (a one-token target forward), measured
        self.s_per_token: dict[str, float] = {}  # a method's decode seconds per token, the latest run's

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

    def load(self, m: MethodSpec):
        """The method's drafter, loaded once (None for lookup, which keeps no state between runs); a
        checkpoint that fails to load is a one-line FastEagleError."""
        if m.key == "lookup":
            return None
        key = (m.key, str(m.drafter_dir))
        with self._loading:
            if key not in self._drafters:
                settings = Settings().with_drafter(m.key, m.drafter_dir)
                try:
                    self._drafters[key] = build(m.key, self.target, settings)
                    self._default_k[key] = getattr(self._drafters[key], "tree_k", None)
                except FastEagleError as exc:  # say which method's drafter, as the startup check does
                    raise FastEagleError(f"the {m.label} drafter could not be loaded: {exc}") from None
                except Exception as exc:  # a corrupt or incompatible checkpoint: one line, not a traceback
                    log.exception("loading the %s drafter failed", m.label)
                    first = str(exc).splitlines()[0] if str(exc) else ""
                    raise FastEagleError(f"the {m.label} drafter at {m.drafter_dir} failed to load: "
                                         f"{type(exc).__name__}: {first}") from exc
        return self._drafters[key]

    def default_cascade(self):
        """The FastEagle drafter, loaded (None if it is not available): whose costs the what-if panel measures."""
        m = next((m for m in self.available if m.key == "fasteagle"), None)
        return None if m is None else self.load(m)

    def drafter(self, req: Request):
        """The request's drafter, set to its tree settings. The drafters are shared, so call this only
        while holding the decoder's turn (`fasteagle.app.turns`)."""
        m = req.method
        if m.key == "lookup":
            from fasteagle.lookup import LookupDrafter

            return LookupDrafter()
        d, key = self.load(m), (m.key, str(m.drafter_dir))
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
        """(StepTrace dict, seconds spent decoding so far) per step; at the end the decode's cost is
        noted for the estimates and for the vanilla model."""
        gen = generate(self.target, ids, drafter=drafter, max_new_tokens=req.max_new_tokens,
                       sampling=SamplingParams(req.temperature), seed=req.seed)
        traces: list[dict] = []
        spent = 0.0
        for tr, spent in _timed(gen):
            traces.append(tr.to_dict())
            yield traces[-1], spent
        self.note(req.method.key if drafter is not None else "vanilla", traces, spent)

    def note(self, key: str, traces: list[dict], spent: float) -> None:
        """Remember what a finished decode cost: seconds per token for `key`, and for a plain decode
        its median step (the one-token forward the vanilla model multiplies)."""
        tokens = int(traces[-1].get("generated", 0)) if traces else 0
        if tokens > 0 and spent > 0:
            self.s_per_token[key] = spent / tokens
        if key == "vanilla":
            steps = [float(tr.get("verify_ms", 0)) / 1e3 for tr in traces if int(tr.get("step", 0)) > 0]
            if len(steps) >= 4:
                self.step_s = statistics.median(steps)

    def estimate(self, req: Request, vanilla: bool = False) -> float:
        """Seconds a decode of `req` should take here (with the plain decode too when `vanilla`), from
        the latest measured costs: what the queue tells a waiting page."""
        plain = self.s_per_token.get("vanilla") or self.step_s or 0.1
        spec = self.s_per_token.get(req.method.key, plain)
        return req.max_new_tokens * (spec + (plain if vanilla else 0.0))

    def modelled_vanilla(self, spec_traces: list[dict]) -> dict:
        """Vanilla's summary for a run whose plain decode was skipped, modelled from this machine's
        measured costs: the speculative run's own prefill (the same forward over the prompt) plus one
        measured plain step per further token. Greedy fp32 output would be the same tokens."""
        tokens = int(spec_traces[-1].get("generated", 0)) if spec_traces else 0
        prefill_ms = sum(float(tr.get("verify_ms", 0)) for tr in spec_traces if int(tr.get("step", 0)) == 0)
        verify_ms = max(tokens - 1, 0) * self.step_s * 1e3
        wall_s = (prefill_ms + verify_ms) / 1e3
        return {"tokens": tokens, "forwards": max(tokens - 1, 0), "steps": max(tokens - 1, 0), "tau": 1.0,
                "prefill_ms": prefill_ms, "draft_ms": 0.0, "verify_ms": verify_ms, "other_ms": 0.0,
                "wall_s": wall_s, "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0, "finished": None,
                "step_ms": self.step_s * 1e3}

    def warmup(self, drafter=None) -> None:
        """One tiny decode so that lazy initialisation is not billed to the first timed run; the first
        time, also a short plain decode that measures one decode step for the vanilla model."""
        ids = chat_prompt_ids(self.target, "Hi")
        if drafter is not None and self.warm and (id(drafter) in self._warmed or not drafter.feature_layers):
            return  # warmed before, or prompt lookup (nothing lazy to set up)
        for d in (drafter, None) if drafter is not None else (None,):
            for _ in generate(self.target, ids, drafter=d, max_new_tokens=3):
                pass
        if drafter is not None:
            self._warmed.add(id(drafter))
        if not self.warm:
            req = Request("Count from one to twenty.", MethodSpec("vanilla", "vanilla", None, True), 0.0, 17, (),
                          2, 0)
            for _ in self.steps(chat_prompt_ids(self.target, req.prompt), None, req):
                pass
        if self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)
        self.warm = True

    def decode_both(self, req: Request, vanilla: bool = True) -> dict:
        """Both decodes to the end (only the speculative one unless `vanilla`), as plain data (what a
        ZeroGPU function may return); a user error comes back as {"error": message} rather than an
        exception across processes."""
        try:
            ids = self.prompt_ids(req)
            drafter = self.drafter(req)
            self.warmup(drafter)
            out = {}
            for side, d in (("speculative", drafter), ("vanilla", None))[:2 if vanilla else 1]:
                rows = list(self.steps(ids, d, req))
                out[side] = {"traces": [r for r, _ in rows], "elapsed": [s for _, s in rows]}
            return out
        except FastEagleError as exc:
            return {"error": str(exc)}

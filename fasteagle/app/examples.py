"""The page's example prompts, and their runs decoded once per machine and kept on disk.

An example's answer under the default settings never changes on a given machine, so the app decodes
each example with every method once (in the background at start-up, or on first use) and replays the
stored run: its traces and the timings this machine measured. A replay takes no turn at the decoder
(`fasteagle.app.turns`), so it never waits behind a running decode. Any other setting decodes afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import viz
from fasteagle import files, trace
from fasteagle.app.engine import Engine, Request
from fasteagle.app.turns import Turns
from fasteagle.methods import default_budget
from fasteagle.tree import DEFAULT_TREE_SHAPE

log = logging.getLogger("fasteagle.app")

# the first screen's run when the cache has none yet (a Space whose disk was wiped): recorded by
# `python -m fasteagle.app.examples --record`, on the machine its meta names
FIRST_RUN = Path(__file__).resolve().parents[2] / "assets" / "first-run.json"


@dataclass(frozen=True)
class Example:
    label: str  # what the example's button shows: short, never cut mid-word
    prompt: str
    temperature: float = 0.0


# Prompts on which the default target (SmolLM2-135M-Instruct) answers sensibly: lists, code and rewrites,
# where the drafters accept long runs, and a short summary and a translation, requests as visitors type
# them, where they accept less (docs/results.md, "Beyond chat"); the last one samples, where acceptance
# follows the exact accept/reject rule.
EXAMPLES = [
    Example("Months, one per line", "List the months of the year, one per line."),
    Example("Python: reverse a string", "Write a Python function that reverses a string."),
    Example("Python: factorial", "Write a Python function that returns the factorial of n."),
    Example("Three health tips", "Give three tips for staying healthy."),
    Example("Rewrite formally", "Rewrite this sentence more formally: hey, can u send me the report asap?"),
    Example("Rewrite in plain English",
            "Rewrite in plain English: The meeting has been postponed owing to unforeseen circumstances."),
    Example("Summarize a paragraph",
            "Summarize in two sentences: The town library opened a repair cafe last spring. Once a month, "
            "volunteers with tools and patience sit at long tables and fix what neighbours bring in: lamps, "
            "toasters, torn jackets, wobbly chairs and bicycles with flat tyres. Nothing is sold and no one is "
            "paid. Visitors watch and learn how their things work, and most leave with the item mended. In "
            "its first year the cafe kept more than eight hundred objects out of the rubbish, and the library "
            "now lends out a tool kit as it lends books."),
    Example("Translate into French",
            "Translate into French: The train to the coast leaves at nine o'clock. Please buy your tickets "
            "at the station and keep them until the end of the journey."),
    Example("Sampling (T 0.7): reverse a string", "Write a Python function that reverses a string.", 0.7),
]


def default_max_new(on_gpu: bool) -> int:
    """The page's default number of new tokens: fewer on a CPU, where each costs more."""
    return 128 if on_gpu else 64


def run_record(engine: Engine, req: Request, record: dict, spans: dict | None = None,
               vanilla_modelled: dict | None = None) -> dict:
    """A finished run as a run file's dict (`viz.make_run_file`): each side's traces, step times,
    reply spans (`spans`, else rebuilt from the traces) and summary, with the request in its meta;
    `vanilla_modelled`: vanilla's modelled summary when its decode was skipped."""
    sides = {}
    for side, rec in record.items():
        sp = spans[side] if spans else viz.token_spans(rec["traces"], engine.decode_text)
        sides[side] = {"traces": rec["traces"], "elapsed": rec["elapsed"], "spans": viz.tokens.spans_to_json(sp),
                       "summary": trace.run_summary(rec["traces"], rec["elapsed"][-1] if rec["elapsed"] else 0)}
    ids_seen = {t for rec in record.values() for tr in rec["traces"]
                for t in tr["tokens"] + ((tr.get("tree") or {}).get("tokens") or [])}
    target = engine.target
    meta = {"prompt": req.prompt, "method": req.method.label, "method_key": req.method.key,
            "temperature": req.temperature, "max_new_tokens": req.max_new_tokens,
            "tree_k": ",".join(map(str, req.tree_k)), "tree_budget": req.tree_budget, "tree_shape": req.tree_shape,
            "seed": req.seed, "target": target.name, "device": str(target.device),
            "dtype": str(target.dtype).replace("torch.", ""), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    if vanilla_modelled:
        meta["vanilla_modelled"] = vanilla_modelled
    return viz.make_run_file(meta, sides, {i: engine.label(i) for i in sorted(ids_seen)})


def machine_text() -> str:
    """This machine in a few words: its CPU or GPU, cores and torch threads."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
    return f"{name}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


_RECORDED: dict[tuple, dict] = {}  # (path, mtime) -> the parsed run: one object, whose drawing replays reuse


def recorded_run(engine: Engine, path: Path = FIRST_RUN) -> dict | None:
    """The shipped recorded run, when it is this target's and its method is offered here (else None).
    Read and checked once per version of the file: every page that opens on it gets the same run."""
    try:
        key = (str(path), path.stat().st_mtime_ns)
        if key not in _RECORDED:
            _RECORDED[key] = viz.parse_run_file(path.read_bytes())
        run = _RECORDED[key]
    except (OSError, viz.TraceFileError):
        return None
    meta = run.get("meta") or {}
    if meta.get("target") != engine.target.name or meta.get("method") not in [m.label for m in engine.available]:
        return None
    return run


class ExampleCache:
    """Example runs on disk under `folder`, one file per example, method and machine."""

    def __init__(self, engine: Engine, turns: Turns, folder: Path, examples: list[Example] = EXAMPLES):
        self.engine, self.turns, self.folder, self.examples = engine, turns, Path(folder), examples
        self._runs: dict[str, dict] = {}  # what was read or written, by key
        self.filling: threading.Thread | None = None

    def defaults(self, example: Example, method_label: str) -> Request:
        """The request the page makes for `example` with `method_label` and every other setting at
        its default."""
        on_gpu = self.engine.target.device.type == "cuda"
        key = self.engine.method(method_label).key
        return self.engine.request(example.prompt, method_label, example.temperature, default_max_new(on_gpu), "",
                                   default_budget(key, on_gpu), 0, DEFAULT_TREE_SHAPE)

    def key(self, req: Request) -> str | None:
        """The file name of `req`'s stored run, or None when `req` is no example at its defaults."""
        ex = next((e for e in self.examples if (e.prompt, e.temperature) == (req.prompt, req.temperature)), None)
        if ex is None or req != self.defaults(ex, req.method.label):
            return None
        target, m = self.engine.target, req.method
        weights = sorted((p.name, p.stat().st_size, int(p.stat().st_mtime))
                         for p in (m.drafter_dir.glob("*") if m.drafter_dir and m.drafter_dir.is_dir() else []))
        what = {"request": [req.prompt, m.key, str(m.drafter_dir), req.temperature, req.max_new_tokens,
                            req.tree_budget, req.seed, req.tree_shape],
                "target": [target.name, str(target.device), str(target.dtype)], "drafter": weights,
                "machine": [platform.machine(), platform.processor(), os.cpu_count(), torch.get_num_threads(),
                            torch.__version__], "format": viz.trace_io.VERSION}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]

    def get(self, req: Request) -> dict | None:
        """The stored run of `req`, or None (not an example at its defaults, or not decoded yet)."""
        key = self.key(req)
        if key is None:
            return None
        if key not in self._runs:
            path = self.folder / f"{key}.json"
            try:
                self._runs[key] = viz.parse_run_file(path.read_bytes())
            except (OSError, viz.TraceFileError):
                return None
        return self._runs[key]

    def put(self, req: Request, run: dict) -> None:
        """Keep a finished run of an example at its defaults (only one whose vanilla was decoded)."""
        key = self.key(req)
        if key is None or "vanilla" not in run["sides"]:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        files.write_text(self.folder / f"{key}.json", viz.trace_io.dumps(run))
        self._runs[key] = viz.parse_run_file(viz.trace_io.dumps(run))

    def start(self) -> None:
        """Decode every missing example run in a background thread, one decode per turn, each turn
        after any page's waiting request."""
        self.filling = threading.Thread(target=self.fill, name="example-cache", daemon=True)
        self.filling.start()

    def fill(self) -> None:
        """Every example with every method (the default method first), the vanilla decode of each
        example once; what is stored already is skipped."""
        vanilla: dict[tuple, dict] = {}
        t0 = time.perf_counter()
        for m in self.engine.available:
            for ex in self.examples:
                req = self.defaults(ex, m.label)
                if self.get(req) is not None:
                    continue
                try:
                    self._decode(req, vanilla)
                except Exception:  # the app goes on; this example then decodes on first use
                    log.exception("caching the example %r with %s failed", ex.label, m.label)
        log.info("example cache: complete, %d runs in %s (%.0f s)", len(self.examples) * len(self.engine.available),
                 self.folder, time.perf_counter() - t0)

    def _decode(self, req: Request, vanilla: dict[tuple, dict]) -> None:
        """One example decoded in a background turn (`Turns.background`: pages first); its record is built
        and written inside the turn too, so nothing of it runs beside a page's decode."""
        plain_key = (req.prompt, req.temperature, req.max_new_tokens, req.seed)
        with self.turns.background(self.engine.estimate(req, vanilla=plain_key not in vanilla)):
            result = self.engine.decode_both(req, vanilla=plain_key not in vanilla)
            if "error" in result:
                log.warning("caching an example failed: %s", result["error"])
                return
            vanilla.setdefault(plain_key, result.get("vanilla"))
            self.put(req, run_record(self.engine, req, {"speculative": result["speculative"],
                                                        "vanilla": vanilla[plain_key]}))


def record(engine: Engine, path: Path = FIRST_RUN) -> dict:
    """Decode the first example with the page's default method and settings, as the first screen shows
    it, and write it to `path` with the machine that made it in its meta."""
    cache = ExampleCache(engine, Turns(), path.parent)
    req = cache.defaults(EXAMPLES[0], engine.available[0].label)
    result = engine.decode_both(req)
    if "error" in result:
        raise RuntimeError(result["error"])
    run = run_record(engine, req, {"speculative": result["speculative"], "vanilla": result["vanilla"]})
    run["meta"] |= {"machine": machine_text(), "recorded": True}
    files.write_text(path, viz.trace_io.dumps(run))
    return run


def main(argv: list[str] | None = None) -> None:
    import argparse

    from fasteagle.env import env
    from fasteagle.target import load_target

    p = argparse.ArgumentParser(description="The app's example runs.")
    p.add_argument("--record", action="store_true", help=f"record the first screen's run into {FIRST_RUN}")
    p.add_argument("--out", type=Path, default=FIRST_RUN)
    args = p.parse_args(argv)
    if not args.record:
        p.error("nothing to do: pass --record")
    e = env()
    engine = Engine(load_target(e.target, e.device, e.dtype), None, None)
    engine.warmup()
    run = record(engine, args.out)
    side = run["sides"]["speculative"]["summary"]
    print(f"recorded {run['meta']['method']} on {run['meta']['machine']}: tau {side['tau']:.2f} -> {args.out}")


if __name__ == "__main__":
    main()

"""Our engine against vLLM (`bench --engine vllm`): the same prompts, greedy, each speculative method
drafting a chain of k tokens, vLLM's plain decoding as the reference output.

Per method and engine: whether each reply is token-identical to vLLM's plain decoding, tau (tokens per
target forward, bonus included), the acceptance rate at each chain position, and tokens/s (vLLM at each
asked batch size, the prompts repeated to fill a batch; ours at batch 1). vLLM's CPU worker runs on one
thread, so ours is timed on one thread too. Our drafters are exported for vLLM first
(`fasteagle.eagle3_format`): an EAGLE-3-style one to the EAGLE-3 format, a cascade to the checkpoint our
vLLM plugin loads (`fasteagle.vllm_cascade`); an EAGLE-3 checkpoint is read by both as it is.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from fasteagle.errors import FastEagleError
from fasteagle.generate import chat_prompt_ids, run
from fasteagle.vllm_engine import DRAFTED, METHODS


def vllm_drafter(path: Path, target, out: Path, kind: str = "eagle3", full_vocab: bool = False) -> Path:
    """The checkpoint vLLM loads for the drafter at `path`: an EAGLE-3 checkpoint as it is, else ours
    exported into `out` (a cascade for the plugin, over the draft vocab our engine drafts with on a CPU
    unless `full_vocab`: `Settings.wants_full_vocab`)."""
    from fasteagle import eagle3_format
    from fasteagle.methods import load_drafter

    if eagle3_format.is_checkpoint(path):
        return path
    drafter = load_drafter(path, target.model, int8=False, kind=kind)
    if kind in ("fasteagle", "dflash", "peagle") and not full_vocab and drafter.compact_vocab is not None:
        drafter.shrink_vocab()
    return eagle3_format.export(drafter, out, target.name)


def vllm_drafters(target, settings, methods: list[str], folder: Path) -> dict[str, Path]:
    """Each drafting method's checkpoint for vLLM (on this CPU), exported into `folder`."""
    from fasteagle.methods import canonical

    full = settings.wants_full_vocab(torch.device("cpu"))
    return {m: vllm_drafter(settings.drafter_dir(m), target, folder / m, canonical(m), full)
            for m in methods if m in DRAFTED}


def cycled(prompts: list, b: int) -> list:
    """A batch of b prompts: the first b, the list repeated where it is shorter."""
    return [prompts[i % len(prompts)] for i in range(b)]


def chain_rates(traces_per_prompt: list[list], k: int) -> dict:
    """tau and per-position acceptance of our chains, counted as vLLM counts them: over verify steps
    that had a draft (prefill excluded), position i accepted when the accepted path reached it."""
    steps, accepted = 0, [0] * k
    for traces in traces_per_prompt:
        for t in traces[1:]:
            steps += 1
            for i in range(min(len(t.path) - 1, k)):
                accepted[i] += 1
    return {"drafts": steps, "tau": 1 + sum(accepted) / steps if steps else 1.0,
            "per_position": [a / steps if steps else 0.0 for a in accepted]}


def run_ours(target, method: str, settings, prompts: list[torch.Tensor], k: int, max_new: int) -> dict:
    """Our engine, batch 1, one thread: replies, tokens/s and (speculative methods) chain acceptance."""
    from fasteagle.methods import build

    drafter = None if method == "vanilla" else build(method, target, settings)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run(target, prompts[0], drafter=drafter, max_new_tokens=8)  # warm-up
        replies, traces, t0 = [], [], time.perf_counter()
        for p in tqdm(prompts, desc=f"ours {method}", leave=False):
            reply, tr = run(target, p, drafter=drafter, max_new_tokens=max_new)
            replies.append(reply)
            traces.append(tr)
        seconds = time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
    out = {"replies": replies, "tokens_per_s": {"1": sum(map(len, replies)) / seconds}}
    return out | (chain_rates(traces, k) if drafter is not None else {})


def run_vllm(target_name, method: str, drafter: Path | None, prompts: list[list[int]], k: int, max_new: int,
             batch_sizes: list[int]) -> dict:
    """vLLM, one engine per method: replies at batch 1 (whose counters give the acceptance), then tokens/s
    at each batch size."""
    from fasteagle import vllm_engine as ve

    llm = ve.engine(target_name, method, drafter, k, detailed=True, max_model_len=ve.context_for(prompts, max_new, k))
    try:
        ve.generate(llm, prompts[:1], 8)  # warm-up
        before = ve.counters(llm)
        replies, requests, t0 = [], [], time.perf_counter()
        for p in tqdm(prompts, desc=f"vLLM {method}", leave=False):
            out = ve.generate_outputs(llm, [p], max_new)[0]
            replies.append(ve.reply(out))
            requests.append((replies[-1], *ve.steps_of(out), ve.latency(out)))
        speed = {"1": sum(map(len, replies)) / (time.perf_counter() - t0)}
        rates = ve.acceptance(ve.since(ve.counters(llm), before))
        for b in (b for b in batch_sizes if b > 1):
            t0 = time.perf_counter()
            n = sum(map(len, ve.generate(llm, cycled(prompts, b), max_new)))
            speed[str(b)] = n / (time.perf_counter() - t0)
    finally:
        ve.close(llm)
    return {"replies": replies, "requests": requests, "tokens_per_s": speed} | (rates if method != "vanilla" else {})


def compare_engines(target, settings, methods: list[str], texts: list[str], k: int, max_new: int,
                    batch_sizes: list[int], target_name: str | None, traces: Path | None = None) -> dict:
    """Both engines over `methods` (vanilla first, as the reference); replies compared with vLLM's vanilla.
    `traces`: a folder for vLLM's decode of each prompt by each drafting method, as app trace files."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise FastEagleError(f"--engine vllm runs {', '.join(METHODS)}, not {unknown[0]!r}")
    methods = ["vanilla", *[m for m in methods if m != "vanilla"]]
    settings = replace(settings, tree_k=(1,), tree_budget=k + 1, draft_int8=False)  # a chain, fp32 as vLLM
    prompts = [chat_prompt_ids(target, t) for t in texts]
    lists = [p.tolist() for p in prompts]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        drafters = vllm_drafters(target, settings, methods, Path(tmp))
        for m in methods:
            rows[m] = {"vllm": run_vllm(target_name, m, drafters.get(m), lists, k, max_new, batch_sizes)}
            if m != "ngram":  # vLLM's n-gram proposer has no twin here (our lookup drafts trees)
                rows[m]["ours"] = run_ours(target, m, settings, prompts, k, max_new)
    if traces is not None:
        write_traces(target, rows, texts, k, max_new, Path(traces))
    reference = rows["vanilla"]["vllm"]["replies"]
    for engines in rows.values():
        for r in engines.values():
            r["identical"] = sum(a == b for a, b in zip(r.pop("replies"), reference))
            r.pop("requests", None)
    return {"k": k, "max_new_tokens": max_new, "prompts": len(texts), "batch_sizes": batch_sizes, "methods": rows,
            "drafters": {m: _shown(settings.drafter_dir(m)) for m in methods if m in DRAFTED}}


def write_traces(target, rows: dict, texts: list[str], k: int, max_new: int, folder: Path) -> None:
    """One app trace file per prompt and drafting method of vLLM's (`fasteagle.vllm_traces`):
    FOLDER/<method>-<prompt index>.json, beside vLLM's plain decoding of the same prompt."""
    import json

    import vllm

    from fasteagle.files import write_text
    from fasteagle.vllm_traces import run_file

    folder.mkdir(parents=True, exist_ok=True)
    vanilla = rows["vanilla"]["vllm"]["requests"]
    meta = {"target": target.name, "device": "cpu", "dtype": "float32", "vocab_size": target.model.config.vocab_size,
            "max_new_tokens": max_new, "vllm": vllm.__version__}
    def label(i: int) -> str:
        return target.tokenizer.decode([i], skip_special_tokens=False)

    for m, engines in rows.items():
        if m == "vanilla":
            continue
        for i, (text, spec, van) in enumerate(zip(texts, engines["vllm"]["requests"], vanilla)):
            request = {"prompt": text, "vanilla": (van[0], van[3]), "spec": spec}
            write_text(folder / f"{m}-{i:03d}.json", json.dumps(run_file(request, m, k, label, meta)))


def _shown(path: Path) -> str:
    """A path as typed in this repository (relative to the working folder when inside it)."""
    try:
        return Path(path).resolve().relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)


def markdown(result: dict) -> str:
    """The comparison as a Markdown table, one row per method and engine."""
    sizes = result["batch_sizes"]
    drafters = result.get("drafters") or ({"eagle3": result["eagle3_drafter"]} if result.get("eagle3_drafter") else {})
    title = (f"**{result.get('device', '')}**, vLLM {result.get('vllm', '')} (its worker on one thread) against "
             f"ours on one thread, target `{result.get('target', '')}`, {result['prompts']} prompts of "
             f"{result.get('prompt_files', '')}, {result['max_new_tokens']} new tokens, greedy, fp32, chains of "
             f"{result['k']} drafted tokens" + "".join(f"; {m} drafter `{d}`" for m, d in drafters.items()) + "\n\n")
    head = ["method", "engine", "identical", "tau", "acceptance per position",
            *[f"tokens/s at batch {b}" for b in sizes]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, engines in result["methods"].items():
        for engine, r in engines.items():
            speeds = [f"{r['tokens_per_s'][str(b)]:.1f}" if str(b) in r["tokens_per_s"] else "–" for b in sizes]
            per = " ".join(f"{v:.3f}" for v in r.get("per_position", [])) or "–"
            tau = f"{r['tau']:.3f}" if "tau" in r else "1.000"
            lines.append(f"| {m} | {engine} | {r['identical']}/{result['prompts']} | {tau} | {per} | "
                         + " | ".join(speeds) + " |")
    return title + "\n".join(lines) + "\n"

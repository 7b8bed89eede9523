"""Hand-made traces shared by the `viz` tests: a token table, one backbone step and its decoder."""

from __future__ import annotations

from viz.tree import ACCEPTED, REJECTED

NAMES = {7: "The", 8: " cat", 9: " dog", 10: " sat", 11: "\n", 12: " ran", 13: " on", 14: "\t", 15: " the"}


def decode(ids):
    return "".join(NAMES.get(i, f"<{i}>") for i in ids)


def backbone_step() -> dict:
    """root(7) -> 8 -> 10 -> 13 is the backbone; 9 (depth 1), 11 and 12 (depth 2, under 8) and 14
    (depth 3, under 10) are side leaves. Accepted: 8 then 10; 13 rejected with 14; bonus 15."""
    parents = [-1, 0, 0, 1, 1, 1, 3, 3]
    toks = [7, 8, 9, 10, 11, 12, 13, 14]
    depths = [0, 1, 1, 2, 2, 2, 3, 3]
    status = [ACCEPTED, ACCEPTED, REJECTED, ACCEPTED, REJECTED, REJECTED, REJECTED, REJECTED]
    return {
        "step": 3, "tokens": [8, 10, 15], "token_depths": [1, 2, 0], "text": " cat sat the",
        "draft_ms": 4.0, "verify_ms": 20.0,
        "tree": {"tokens": toks, "parents": parents, "depths": depths,
                 "draft_probs": [1, .9, .05, .8, .1, .05, .7, .2], "sources": depths},
        "status": status, "target_probs": [1, .95, .02, .9, .05, .01, .1, .3],
        "path": [0, 1, 3], "generated": 9, "forwards": 3, "finished": None,
    }


def node_traces(fig):
    return {t.name: t for t in fig.data}

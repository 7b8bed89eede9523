"""The run file the app downloads and replays: both decodes' traces plus what is needed to draw
them without the model (token labels, reply spans, settings, timings). Plain JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from fasteagle.trace import (  # noqa: F401  (the file's format and writer live with the traces)
    ACCEPTED,
    FORMAT,
    NEVER_REACHED,
    READS,
    REJECTED,
    SUMMARY_NUMBERS,
    VERSION,
    make_run_file,
)

MAX_BYTES = 50 * 2**20


class TraceFileError(ValueError):
    """An uploaded trace file that cannot be replayed (the message says why, in one line)."""


MAX_TOKEN_ID = 2**31 - 1


def _ints(values: Any, lo: int = 0, hi: int = MAX_TOKEN_ID) -> bool:
    return isinstance(values, list) and all(type(v) is int and lo <= v <= hi for v in values)


def _numbers(values: Any) -> bool:
    return isinstance(values, list) and all(type(v) in (int, float) and math.isfinite(v) for v in values)


def _check_trace(tr: Any, where: str) -> None:
    """Every field the app draws from, with its type: a file that passes replays every step."""
    if not isinstance(tr, dict):
        raise TraceFileError(f"{where} is not an object")
    for key in ("step", "tokens", "token_depths"):
        if key not in tr:
            raise TraceFileError(f"{where} has no {key!r}")
    if not _ints(tr["tokens"]) or not _ints(tr["token_depths"]) or len(tr["tokens"]) != len(tr["token_depths"]):
        raise TraceFileError(f"{where}: 'tokens' and 'token_depths' must be lists of token ids and depths, "
                             "of equal length")
    for key in ("step", "generated", "forwards"):
        if key in tr and type(tr[key]) is not int:
            raise TraceFileError(f"{where}: {key!r} must be an integer")
    for key in ("draft_ms", "verify_ms"):
        if key in tr and not _numbers([tr[key]]):
            raise TraceFileError(f"{where}: {key!r} must be a number")
    tree = tr.get("tree")
    if tree is None:
        return
    if not isinstance(tree, dict) or not all(isinstance(tree.get(k), list) for k in ("tokens", "parents", "depths")):
        raise TraceFileError(f"{where}: 'tree' needs lists 'tokens', 'parents' and 'depths'")
    n = len(tree["tokens"])
    if n == 0 or len(tree["parents"]) != n or len(tree["depths"]) != n:
        raise TraceFileError(f"{where}: the tree's lists differ in length")
    if not _ints(tree["tokens"]) or not _ints(tree["depths"]):
        raise TraceFileError(f"{where}: the tree's 'tokens' and 'depths' must be non-negative integers")
    for key, ok in (("draft_probs", _numbers), ("sources", lambda v: _ints(v, -MAX_TOKEN_ID))):
        if tree.get(key) is not None and (not ok(tree[key]) or len(tree[key]) != n):
            raise TraceFileError(f"{where}: the tree's {key!r} must be {n} numbers")
    if tr.get("target_probs") is not None and not _numbers(tr["target_probs"]):
        raise TraceFileError(f"{where}: 'target_probs' must be numbers")
    if any(not isinstance(p, int) or p >= i or (p < 0 and i > 0) for i, p in enumerate(tree["parents"])):
        raise TraceFileError(f"{where}: every tree node's parent must precede it")
    for key in ("status", "target_probs"):
        if tr.get(key) and len(tr[key]) != n:
            raise TraceFileError(f"{where}: {key!r} has {len(tr[key])} entries for {n} tree nodes")
    if any(s not in (NEVER_REACHED, ACCEPTED, REJECTED) for s in tr.get("status") or []):
        raise TraceFileError(f"{where}: 'status' values must be 0, 1 or 2")
    if any(not isinstance(i, int) or not 0 <= i < n for i in tr.get("path") or []):
        raise TraceFileError(f"{where}: 'path' points outside the tree")
    _check_v2(tr, where, n)


def _check_v2(tr: dict, where: str, n: int) -> None:
    """The fields version 2 added (each optional: a version-1 step has none of them)."""
    if tr.get("draft_passes") is not None and not _numbers(tr["draft_passes"]):
        raise TraceFileError(f"{where}: 'draft_passes' must be numbers (ms)")
    top = tr.get("layer_top") or []
    if not isinstance(top, list) or not all(isinstance(d, list) and all(
            isinstance(c, list) and len(c) == 2 and _ints(c[:1]) and _numbers(c[1:]) for c in d) for d in top):
        raise TraceFileError(f"{where}: 'layer_top' must hold [token, prob] pairs per depth")
    if tr.get("bonus_kind", "bonus") not in ("bonus", "resampled"):
        raise TraceFileError(f"{where}: 'bonus_kind' must be 'bonus' or 'resampled'")
    draws = tr.get("draws") or []
    if draws and (not _numbers(draws) or len(draws) != n):
        raise TraceFileError(f"{where}: 'draws' must be {n} numbers")
    for d in tr.get("dists") or []:
        if not (isinstance(d, list) and len(d) == 4 and _ints(d[:1]) and d[0] < n and _ints(d[1])
                and _numbers(d[2]) and len(d[1]) == len(d[2]) and _numbers(d[3:])):
            raise TraceFileError(f"{where}: each of 'dists' must be [node, ids, probs, rest]")


def parse_run_file(data: bytes | str) -> dict:
    """Parse and validate a run file; raises TraceFileError with a one-line reason."""
    if isinstance(data, bytes):
        if len(data) > MAX_BYTES:
            raise TraceFileError(f"the file is larger than {MAX_BYTES >> 20} MB")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceFileError("the file is not UTF-8 text") from None
    try:
        run = json.loads(data)
    except json.JSONDecodeError as exc:
        raise TraceFileError(f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(run, dict) or run.get("format") != FORMAT:
        raise TraceFileError(f"not a {FORMAT} file (download one from the app after a run)")
    if run.get("version") not in READS:
        raise TraceFileError(f"unsupported trace file version {run.get('version')!r} (this app reads "
                             f"{', '.join(map(str, READS))})")
    sides = run.get("sides")
    if not isinstance(sides, dict) or not isinstance(sides.get("speculative"), dict):
        raise TraceFileError("the file has no speculative decode to replay")
    for name, side in sides.items():
        if not isinstance(side, dict):
            raise TraceFileError(f"side {name!r} is not an object")
        traces = side.get("traces")
        if not isinstance(traces, list) or not traces:
            raise TraceFileError(f"side {name!r} has no traces")
        for i, tr in enumerate(traces):
            _check_trace(tr, f"{name} step {i}")
        spans = side.get("spans") or []
        if not isinstance(spans, list) or not all(
                isinstance(sp, dict) and isinstance(sp.get("text"), str) and _ints([sp.get("depth")])
                and _ints([sp.get("step", 0)]) and _ints(sp.get("token_ids", [])) for sp in spans):
            raise TraceFileError(f"side {name!r}: 'spans' must be a list of {{text, depth, step, token_ids}}")
        summary = side.get("summary")
        if summary is not None and not (isinstance(summary, dict) and all(
                _numbers([summary.get(k)]) for k in SUMMARY_NUMBERS)):
            raise TraceFileError(f"side {name!r}: 'summary' needs the numbers {', '.join(SUMMARY_NUMBERS)}")
        if side.get("elapsed") is not None and not _numbers(side["elapsed"]):
            raise TraceFileError(f"side {name!r}: 'elapsed' must be numbers")
    labels = run.get("token_labels", {})
    if not isinstance(labels, dict):
        raise TraceFileError("'token_labels' must be an object")
    try:
        run["token_labels"] = {int(k): str(v) for k, v in labels.items()}
    except ValueError:
        raise TraceFileError("'token_labels' keys must be token ids") from None
    run.setdefault("meta", {})
    if not isinstance(run["meta"], dict):
        raise TraceFileError("'meta' must be an object")
    return run


def dumps(run: Mapping) -> str:
    return json.dumps(run, ensure_ascii=False, separators=(",", ":"))

"""The run file the app downloads and replays: both decodes' traces plus what is needed to draw
them without the model (token labels, reply spans, settings, timings). Plain JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

FORMAT = "fasteagle-trace"
VERSION = 1
MAX_BYTES = 50 * 2**20


class TraceFileError(ValueError):
    """An uploaded trace file that cannot be replayed (the message says why, in one line)."""


def make_run_file(meta: Mapping[str, Any], sides: Mapping[str, Mapping[str, Any]],
                  token_labels: Mapping[int, str]) -> dict:
    """`sides`: {"speculative": {...}, "vanilla": {...}}, each with "traces" (StepTrace dicts),
    "spans" (viz.tokens.spans_to_json), "summary" (viz.charts.summarize)."""
    return {"format": FORMAT, "version": VERSION, "meta": dict(meta),
            "sides": {k: dict(v) for k, v in sides.items()},
            "token_labels": {str(k): v for k, v in token_labels.items()}}


def _check_trace(tr: Any, where: str) -> None:
    if not isinstance(tr, dict):
        raise TraceFileError(f"{where} is not an object")
    for key in ("step", "tokens", "token_depths"):
        if key not in tr:
            raise TraceFileError(f"{where} has no {key!r}")
    if not isinstance(tr["tokens"], list) or not isinstance(tr["token_depths"], list) \
            or len(tr["tokens"]) != len(tr["token_depths"]):
        raise TraceFileError(f"{where}: 'tokens' and 'token_depths' must be lists of equal length")
    tree = tr.get("tree")
    if tree is None:
        return
    if not isinstance(tree, dict) or not all(isinstance(tree.get(k), list) for k in ("tokens", "parents", "depths")):
        raise TraceFileError(f"{where}: 'tree' needs lists 'tokens', 'parents' and 'depths'")
    n = len(tree["tokens"])
    if n == 0 or len(tree["parents"]) != n or len(tree["depths"]) != n:
        raise TraceFileError(f"{where}: the tree's lists differ in length")
    if any(not isinstance(p, int) or p >= i or (p < 0 and i > 0) for i, p in enumerate(tree["parents"])):
        raise TraceFileError(f"{where}: every tree node's parent must precede it")
    for key in ("status", "target_probs"):
        if tr.get(key) and len(tr[key]) != n:
            raise TraceFileError(f"{where}: {key!r} has {len(tr[key])} entries for {n} tree nodes")
    if any(s not in (0, 1, 2) for s in tr.get("status") or []):
        raise TraceFileError(f"{where}: 'status' values must be 0, 1 or 2")
    if any(not isinstance(i, int) or not 0 <= i < n for i in tr.get("path") or []):
        raise TraceFileError(f"{where}: 'path' points outside the tree")


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
    if run.get("version") != VERSION:
        raise TraceFileError(f"unsupported trace file version {run.get('version')!r} (this app reads {VERSION})")
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
        if not isinstance(side.get("spans", []), list):
            raise TraceFileError(f"side {name!r}: 'spans' must be a list")
    labels = run.get("token_labels", {})
    if not isinstance(labels, dict):
        raise TraceFileError("'token_labels' must be an object")
    try:
        run["token_labels"] = {int(k): str(v) for k, v in labels.items()}
    except ValueError:
        raise TraceFileError("'token_labels' keys must be token ids") from None
    run.setdefault("meta", {})
    return run


def dumps(run: Mapping) -> str:
    return json.dumps(run, ensure_ascii=False, separators=(",", ":"))

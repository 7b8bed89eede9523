"""`inspect --server` end to end against real vLLM servers on localhost, one per method (vLLM's n-gram,
EAGLE-3 with our exported drafter, our cascade through the plugin), each started by `fasteagle serve`,
a few short prompts each. Every request is checked against sources independent of the per-request
fields it reads: the stream's tokens decode to the reply's text, and at concurrency 1 the summary's
drafted and accepted totals equal the deltas of vLLM's Prometheus counters over the run."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import viz
from fasteagle import inspection
from fasteagle.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
ROOT = Path(__file__).resolve().parents[1]
COUNTERS = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=["ngram", "eagle3", "fasteagle"])
def served(request, tmp_path_factory):
    """One vLLM server at a time, as `python -m fasteagle serve --method M` starts it."""
    port, log = _port(), tmp_path_factory.mktemp("vllm") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fasteagle", "serve", "--method", request.param,
                                 "--port", str(port), "--max-model-len", "1024"], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"the {request.param} server exited: {log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{url}/version", timeout=2).read()
                break
            except OSError:
                time.sleep(2)
        else:
            pytest.fail(f"the {request.param} server did not start: {log.read_text()[-2000:]}")
        yield request.param, url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _counters(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def test_each_request_against_the_servers_own_counts(served, tmp_path):
    from transformers import AutoTokenizer

    from fasteagle.vllm_engine import target_dir

    method, url = served
    rows = [json.loads(x) for x in (ROOT / "assets" / "prompts" / "mix_heldout.jsonl").read_text().splitlines()]
    prompts = tmp_path / "p.jsonl"
    picked = [next(r for r in rows if r["category"] == c) for c in ("qa", "math", "translation")]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in picked))
    before = _counters(url)
    out = tmp_path / "out"
    assert main(["inspect", "--server", url, "--prompts", str(prompts), "--out", str(out),
                 "--max-new-tokens", "24"]) == 0
    after = _counters(url)
    doc = inspection.read_summary(out / "summary.json")
    assert len(doc["rows"]) == 3 and doc["source"]["vllm"].startswith("0.32")
    tok = AutoTokenizer.from_pretrained(target_dir(None))
    for row in doc["rows"]:
        assert sum(row["drafted"]) == row["num_draft_tokens"], (method, row)
        assert sum(row["accepted"]) == row["num_accepted_draft_tokens"], (method, row)
        assert row["drafted_steps"] == row["num_spec_steps"]
        tau = (row["tokens"] - 1) / row["forwards"]  # the row's tau, unrounded
        assert abs(tau - row["tau"]) < 1e-4 and tau <= row["mean_acceptance_length"] + 1e-9
        # tau = 1 + A / (S + U) against the server's 1 + A / S: equal exactly when every step drafted (U = 0) or
        # no draft was accepted (A = 0), and the server counted nothing past the reply's end (a trimmed last step)
        every = (row["drafted_steps"] == row["forwards"] or row["num_accepted_draft_tokens"] == 0) \
            and row["counted_past_end"] == 0
        assert (abs(tau - row["mean_acceptance_length"]) < 1e-9) == every
        run = viz.parse_run_file((out / row["trace"]).read_bytes())
        ids = [t for s in run["sides"]["speculative"]["traces"] for t in s["tokens"]]
        assert len(ids) == row["tokens"] and tok.decode(ids, skip_special_tokens=True) == run["meta"]["response_text"]
    drafted = sum(r["num_draft_tokens"] for r in doc["rows"])
    accepted = sum(r["num_accepted_draft_tokens"] for r in doc["rows"])
    assert after[COUNTERS[0]] - before[COUNTERS[0]] == drafted, (method, before, after)
    assert after[COUNTERS[1]] - before[COUNTERS[1]] == accepted, (method, before, after)
    assert drafted > 0

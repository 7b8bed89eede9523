"""`python -m fasteagle inspect`: acceptance prompt by prompt, from a server that speaks vLLM 0.32's
OpenAI API (here a stand-in on localhost that streams as vLLM does: one chunk per engine step with its
token ids, the per-request metrics on the last chunk), from our engine, and from a bench result; the
summary's counts against the server's own, and every bad input in one line."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import viz
from fasteagle import inspection, vllm_inspect
from fasteagle.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _reply(chunks: list[int], accepted: list[int], drafted: list[int], start: int = 100) -> dict:
    """A streamed reply: `chunks` token counts (the first: the prefill's token), the server's step lists."""
    ids = list(range(start, start + sum(chunks)))
    return {"chunks": chunks, "ids": ids, "accepted": accepted, "drafted": drafted}


class FakeVLLM(BaseHTTPRequestHandler):
    """Answers as vLLM 0.32's server does, for the replies queued in `server.replies` (one per request)."""

    def log_message(self, *a):
        pass

    def _json(self, doc, code=200):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        s = self.server
        if self.path == "/version":
            return self._json({"version": s.version})
        if self.path == "/v1/models":
            return self._json({"object": "list", "data": [{"id": "smollm2", "object": "model", "root": "/nowhere"}]})
        self._json({"detail": "Not Found"}, 404)

    def do_POST(self):
        s = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["model"] != "smollm2":
            return self._json({"error": {"message": f"The model `{body['model']}` does not exist."}}, 404)
        with s.lock:
            r = s.replies[s.served % len(s.replies)]
            s.served += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

        def send(doc):
            self.wfile.write(f"data: {json.dumps(doc)}\n\n".encode())
            self.wfile.flush()

        send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "prompt_token_ids": [1, 2]})
        pos = 0
        for n, chunk in enumerate(r["chunks"]):
            if r.get("drop") is not None and n == r["drop"]:
                return  # the connection goes away mid-stream
            ids = r["ids"][pos:pos + chunk]
            pos += chunk
            send({"choices": [{"index": 0, "delta": {"content": "".join(f"<{t}>" for t in ids)}, "token_ids": ids,
                               "finish_reason": "length" if pos == len(r["ids"]) else None}]})
        metrics = {"time_to_first_token_ms": 12.5, "tokens_per_second": 40.0}
        if s.metrics:
            k = max(r["drafted"], default=3)
            hist = [r["accepted"].count(j) for j in range(k + 1)]
            metrics["speculative_decoding"] = {
                "mean_acceptance_length": 1 + sum(r["accepted"]) / len(r["accepted"]) if r["accepted"] else 1.0,
                "acceptance_histogram": hist, "num_spec_steps": len(r["accepted"]),
                "num_accepted_draft_tokens": sum(r["accepted"]), "num_draft_tokens": sum(r["drafted"]),
                "num_spec_tokens": k, **({"per_step_accepted": r["accepted"], "per_step_drafted": r["drafted"]}
                                         if r["accepted"] else {})}
        send({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": len(r["ids"])}, "metrics": metrics})
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
    srv.version, srv.metrics, srv.served, srv.lock = "0.32.0", True, 0, threading.Lock()
    srv.replies = [_reply([1, 3, 1, 1, 2], [2, 0, 1], [3, 3, 3]), _reply([1, 1, 1, 4], [3], [3], start=200),
                   _reply([1, 2, 2, 2], [1, 1, 1], [3, 3, 3], start=300)]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _prompts(tmp_path, n=3) -> Path:
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"id": f"q{i}", "category": "qa" if i % 2 else "math", "text": f"question {i}"})
                         + "\n" for i in range(n)))
    return p


def test_the_stream_places_the_steps_the_server_did_not_record():
    """Chunks of one engine step each: a chunk the server's step list explains is that drafted step; a
    one-token chunk it does not is a step that drafted nothing; several steps in one chunk are split by
    the step list and marked merged."""
    rep = vllm_inspect.Reply(token_ids=list(range(8)), chunks=[(0.1 * i, n) for i, n in enumerate([1, 3, 1, 1, 2])],
                             spec={"per_step_accepted": [2, 0, 1], "per_step_drafted": [3, 3, 3]})
    records, merged = vllm_inspect.place(rep)
    assert [(n, d, a) for n, d, a, _ in records] == [(3, 3, 2), (1, 3, 0), (1, 0, 0), (2, 3, 1)] and not merged
    assert all(abs(ms - 100.0) < 1e-6 for *_, ms in records)
    rep.chunks = [(0.0, 1), (0.1, 4), (0.2, 1)]
    rep.token_ids = list(range(6))
    rep.spec = {"per_step_accepted": [2, 0], "per_step_drafted": [3, 3]}
    records, merged = vllm_inspect.place(rep)
    assert [(n, d, a) for n, d, a, _ in records] == [(3, 3, 2), (1, 3, 0), (1, 0, 0)] and merged
    rep.chunks, rep.token_ids = [(0.0, 1), (0.1, 2)], [0, 1, 2]  # the last step cut by max_tokens
    rep.spec = {"per_step_accepted": [3], "per_step_drafted": [3]}
    assert vllm_inspect.place(rep) == ([(2, 3, 3, pytest.approx(100.0))], False)


def test_inspect_a_server_request_by_request(server, tmp_path, capsys):
    """Against the stand-in: a summary row per request whose drafted and accepted totals equal what the
    server reported, tau at most the server's mean acceptance length (equal where every step drafted),
    every trace replayable in the app and its tokens the reply's, and the report written."""
    srv, url = server
    out = tmp_path / "out"
    assert main(["inspect", "--server", url, "--prompts", str(_prompts(tmp_path)), "--out", str(out)]) == 0
    doc = inspection.read_summary(out / "summary.json")
    assert doc["source"]["vllm"] == "0.32.0" and doc["source"]["model"] == "smollm2"
    for row, r in zip(doc["rows"], srv.replies):
        assert sum(row["drafted"]) >= 0 and row["num_accepted_draft_tokens"] == sum(r["accepted"])
        assert sum(row["accepted"]) == sum(r["accepted"]) and row["tokens"] == len(r["ids"])
        assert row["tau"] <= row["mean_acceptance_length"] + 1e-9
        every = (row["drafted_steps"] == row["forwards"] or row["num_accepted_draft_tokens"] == 0) \
            and row["counted_past_end"] == 0
        assert (abs(row["tau"] - row["mean_acceptance_length"]) < 1e-9) == every
        run = viz.parse_run_file((out / row["trace"]).read_bytes())
        steps = run["sides"]["speculative"]["traces"]
        assert [t for s in steps for t in s["tokens"]] == r["ids"]
        assert run["meta"]["response_text"] == "".join(f"<{t}>" for t in r["ids"])
    assert doc["rows"][1]["drafted_steps"] == 1 and doc["rows"][1]["forwards"] == 3  # two steps drafted nothing
    assert doc["aggregates"]["by_category"]["math"]["requests"] == 2
    assert "Acceptance by prompt" in (out / "report.html").read_text()
    assert "3 requests" in capsys.readouterr().out


def test_what_cannot_be_inspected_says_why_in_one_line(server, tmp_path, capsys):
    srv, url = server
    prompts = _prompts(tmp_path)
    base = ["inspect", "--prompts", str(prompts), "--out", str(tmp_path / "o")]

    def fails(argv, said):
        assert main(argv) == 2
        err = capsys.readouterr().err
        said_lines = [line for line in err.splitlines() if line.startswith("error:")]  # beside the progress bar
        assert "Traceback" not in err and len(said_lines) == 1 and said in said_lines[0], err

    fails(["inspect", "--server", "http://127.0.0.1:9", "--prompts", str(prompts), "--out", str(tmp_path / "o")],
          "cannot reach the vLLM server")
    fails(base + ["--server", url, "--model", "llama"], "serves smollm2, not 'llama'")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    fails(["inspect", "--server", url, "--prompts", str(bad), "--out", str(tmp_path / "o")], "no prompt")
    srv.version = "0.31.2"
    fails(base + ["--server", url], "runs vLLM 0.31.2")
    srv.version, srv.metrics = "0.32.0", False
    fails(base + ["--server", url], "--per-request-spec-decode-metrics detailed --enable-per-request-metrics")
    srv.metrics = True
    srv.replies, srv.served = [_reply([1, 3, 1], [2, 0], [3, 3]), _reply([1, 3, 1], [2, 0], [3, 3]) | {"drop": 2}], 0
    fails(base + ["--server", url], "dropped the connection")
    kept = inspection.read_summary(tmp_path / "o" / "summary.json")
    assert len(kept["rows"]) == 1 and kept["source"]["partial"] == "1 of 3"  # what finished is kept
    fails(["inspect", "--result", str(tmp_path / "nothing.json"), "--out", str(tmp_path / "o")], "nothing.json")


def test_inspect_a_bench_result_and_our_engine(tiny, tmp_path, monkeypatch):
    """A committed bench result's rows as a summary (its pooled tau is the result's), and our engine's own
    decodes with their full trees: rejected tokens known, the traces replayable."""
    result = ROOT / "bench" / "results" / "cpu-smollm2-135m-whatif-b6-2026-12-02.json"
    out = tmp_path / "r"
    assert main(["inspect", "--result", str(result), "--out", str(out)]) == 0
    doc = inspection.read_summary(out / "summary.json")
    bench = json.loads(result.read_text())
    assert doc["source"]["method"] == "fasteagle" and len(doc["rows"]) == bench["methods"]["fasteagle"]["prompts"]
    assert doc["aggregates"]["tau"] == pytest.approx(bench["methods"]["fasteagle"]["tau"], abs=1e-3)
    assert set(doc["aggregates"]["by_category"]) == {"writing", "translation", "summarization", "qa", "math", "rag"}
    import fasteagle.target

    monkeypatch.setattr(fasteagle.target, "load_target", lambda *a, **k: tiny)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "text": "one two three one two three one two"}) + "\n")
    out = tmp_path / "e"
    assert main(["inspect", "--method", "lookup", "--prompts", str(prompts), "--out", str(out),
                 "--max-new-tokens", "12"]) == 0
    row = inspection.read_summary(out / "summary.json")["rows"][0]
    assert row["tokens"] == 12 or row["tokens"] < 12
    run = viz.parse_run_file((out / row["trace"]).read_bytes())
    assert run["meta"]["method_key"] == "lookup" and row["forwards"] == len(run["sides"]["speculative"]["traces"]) - 1
    cmp = inspection.compare(doc["rows"], [r | {"tau": r["tau"] + 0.5 * (i == 3)} for i, r in enumerate(doc["rows"])])
    assert cmp[-1]["delta"] == 0.5 and cmp[0]["delta"] == 0.0


def test_the_explorer_lists_the_operators_summaries_and_opens_only_their_traces(tmp_path):
    """The explorer's data: each summary's rows and aggregates, two compared who loses most first; only
    summaries in the listed folders are offered, and a request opens only a trace file beside its summary."""
    from types import SimpleNamespace

    from fasteagle.app.explorer import Explorer
    from viz import explorer

    rows = [{"id": f"p{i}", "category": "qa", "tokens": 10, "forwards": 5 + i, "tau": round(9 / (5 + i), 4),
             "drafted": [3], "accepted": [1], "accepted_histogram": [2, 3], "trace": f"traces/{i}.json"}
            for i in range(3)]
    for name, shift in (("before", 0.0), ("after", -0.2)):
        (tmp_path / "inspect" / name / "traces").mkdir(parents=True)
        doc = inspection.summary([r | {"tau": r["tau"] + shift * (r["id"] == "p1")} for r in rows], {"kind": "engine"})
        (tmp_path / "inspect" / name / "summary.json").write_text(json.dumps(doc))
    (tmp_path / "inspect" / "before" / "traces" / "0.json").write_text("{}")
    ex = Explorer([tmp_path / "inspect"])
    assert set(ex.found()) == {"inspect/before", "inspect/after"}
    page, state = ex.on_pick("inspect/before", "inspect/after")
    assert 'data-ex="' in page and state == {"dir": str(tmp_path / "inspect" / "before")}
    data = explorer.explorer_data(inspection.read_summary(tmp_path / "inspect" / "before" / "summary.json"),
                                  inspection.read_summary(tmp_path / "inspect" / "after" / "summary.json"))
    assert data["compare"][0]["id"] == "p1" and data["compare"][0]["delta"] == pytest.approx(-0.2)
    assert data["a"]["rows"][0]["trace"] is None  # an uploaded summary's traces are not on this machine
    opened = []
    ex.screen = SimpleNamespace(ui=SimpleNamespace(outputs=[]), on_upload=lambda path, present: opened.append(path))
    ex.on_open(state, False, SimpleNamespace(trace="traces/0.json"))
    ex.on_open(state, False, SimpleNamespace(trace="../after/summary.json"))  # outside the summary's folder: no
    assert opened == [str((tmp_path / "inspect" / "before" / "traces" / "0.json").resolve())]
    assert "Load an inspect summary" in explorer.explorer_html(None)

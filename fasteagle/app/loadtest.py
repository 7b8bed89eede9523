"""A classroom at once: N pages call the app's HTTP API (`/run`) together, some on the page's example
prompts, the rest on fresh chat prompts, and the closing note says what each kind of page saw.

    python -m fasteagle.app.loadtest --out bench/results/cpu-app-load-30.json   # starts `python app.py`
    python -m fasteagle.app.loadtest --url http://127.0.0.1:7860/                # an app already running
    python -m fasteagle.app.loadtest --first-run 3 --out bench/results/cpu-app-first-run.json

`--first-run N`: N fresh starts, each with the example cache emptied; one page runs a fresh prompt as
soon as the app answers (the first run a Space's visitor sees, while the cache would fill), then, once
the cache is complete, the same prompt again on the idle app. Each run's wall-clock speed-up is read
from its summary; the medians are compared.

Bounded on purpose: at most 64 clients, every request and the whole run under `--timeout` seconds,
and only an app on this machine (localhost). Without --url it starts the app on a free port, waits
until its example cache is complete (so that the measurement is of serving, not of the start-up),
sends each example once (what a teacher's first click does), then the burst, then stops the app.

Per page it records the seconds to the first frame that draws a tree and to the last frame, and
whether the run completed: a finished run's badge (identical; or vanilla skipped under load; or, when
sampling, replies that differ as expected). A
page fails on an HTTP error, an error event, a run without a finished badge, or the timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

from fasteagle import files
from fasteagle.app.examples import EXAMPLES, default_max_new
from fasteagle.bench.prompts import load_prompts
from fasteagle.cli_args import module_command
from fasteagle.errors import FastEagleError, Parser, run_command
from fasteagle.methods import default_budget

ROOT = Path(__file__).resolve().parents[2]
MAX_CLIENTS = 64
TREE, BADGE, SUMMARY = 5, 4, 8  # /run's outputs: the tree figure, the badge, the summary (app.UI.outputs)


def fresh_prompts(n: int, path: Path = ROOT / "assets/prompts/sharegpt_holdout.jsonl") -> list[str]:
    """The first `n` chat prompts of the holdout file short enough to be typed in class (500 chars)."""
    out = [p["text"] for p in load_prompts(path) if len(p["text"]) <= 500]
    if len(out) < n:
        raise FastEagleError(f"{path} has only {len(out)} short prompts; use at most that many fresh clients")
    return out[:n]


def has_tree(frame: list) -> bool:
    """Whether a /run frame draws a tree (a figure with data, not the empty placeholder)."""
    fig = frame[TREE] if len(frame) > TREE else None
    if isinstance(fig, dict) and fig.get("type") == "plotly":
        return bool(json.loads(fig["plot"]).get("data"))
    return False


def one_page(url: str, args: list, timeout: float, http: httpx.Client | None = None) -> dict:
    """One page's /run through Gradio's HTTP API, streamed: seconds to its first tree and last frame.
    `http`: a client made beforehand (a page's browser is connected already; making one costs tens of
    milliseconds of the tester's own CPU, which is no part of the app's answer)."""
    own = http is None
    http = http or httpx.Client(base_url=url, timeout=timeout)
    out = {"first_tree_s": None, "last_frame_s": None, "ok": False, "vanilla": None, "error": ""}
    t0 = time.perf_counter()
    try:
        event = http.post("gradio_api/call/run", json={"data": args}).raise_for_status().json()["event_id"]
        last, kind = None, ""
        with http.stream("GET", f"gradio_api/call/run/{event}") as stream:
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and kind in ("generating", "complete"):
                    if out["first_tree_s"] is None and "plotly" in line and has_tree(json.loads(line[5:])):
                        out["first_tree_s"] = time.perf_counter() - t0
                    last = line
                elif line.startswith("data:") and kind == "error":
                    raise RuntimeError(f"error event: {line[5:].strip()[:200]}")
                if time.perf_counter() - t0 > timeout:
                    raise TimeoutError(f"no last frame after {timeout:.0f} s")
        out["last_frame_s"] = time.perf_counter() - t0
        frame = json.loads(last[5:]) if last else []
        badge = str(frame[BADGE]) if len(frame) > BADGE else ""
        sampled = 'data-identical="false"' in badge and "badge info" in badge  # sampling: replies may differ
        out["ok"] = 'data-identical="true"' in badge or 'data-identical="skipped"' in badge or sampled
        out["vanilla"] = "skipped" if "skipped" in badge else "decoded"
        out["speedup"] = speedup_of(str(frame[SUMMARY]) if len(frame) > SUMMARY else "")
        if not out["ok"]:
            out["error"] = f"no finished run: {badge[:200]}"
    except Exception as exc:  # a failed page is a result, not a crash of the test
        out["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        if own:
            http.close()
    return out


def speedup_of(summary: str) -> float | None:
    """The wall-clock speed-up a run's summary (app.text.summary_markdown) states, None if it states none."""
    found = re.search(r"Speed-up: \**([0-9.]+)×", summary)
    return float(found.group(1)) if found else None


def burst(url: str, pages: list[tuple[str, list]], timeout: float) -> list[dict]:
    """Every page at once (released together by a barrier), each in its own thread with its own
    connection, made before the barrier."""
    results: list[dict] = [{} for _ in pages]
    gate = threading.Barrier(len(pages))

    def go(i: int, kind: str, args: list) -> None:
        with httpx.Client(base_url=url, timeout=timeout) as http:
            http.get("config").raise_for_status()  # connected, as an open page is
            gate.wait()
            results[i] = {"kind": kind, "prompt": args[0][:60]} | one_page(url, args, timeout, http)

    threads = [threading.Thread(target=go, args=(i, k, a)) for i, (k, a) in enumerate(pages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return results


def run_args(prompt: str, temperature: float, method: str, max_new: int) -> list:
    """/run's inputs with the page's defaults: the method's own tree budget and top-k, seed 0."""
    return [prompt, method, temperature, max_new, "", default_budget(method_key(method), False), 0, "product"]


def method_key(label: str) -> str:
    return {"FastEagle": "fasteagle", "FastEagle + lookup": "fasteagle+lookup", "lookup": "lookup"}.get(
        label, "eagle3" if label.startswith("EAGLE-3") else "fasteagle")


def summarize(results: list[dict]) -> dict:
    """The closing numbers: failures, every example page's first tree, the fresh pages' last frames."""
    ex = [r for r in results if r.get("kind") == "example"]
    fresh = [r["last_frame_s"] for r in results if r.get("kind") == "fresh" and r.get("ok")]
    q = statistics.quantiles(fresh, n=10) if len(fresh) >= 2 else [float("nan")] * 9
    return {"clients": len(results), "failures": sum(not r.get("ok") for r in results),
            "example_first_tree_s_max": max((r["first_tree_s"] or float("inf") for r in ex), default=None),
            "fresh_last_frame_s_median": statistics.median(fresh) if fresh else None, "fresh_last_frame_s_p90": q[8],
            "fresh_vanilla_skipped": sum(r.get("vanilla") == "skipped" for r in results if r.get("kind") == "fresh")}


def start_app(port: int, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port))
    return subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env,
                            stdout=log_path.open("w"), stderr=subprocess.STDOUT)


def launch(kind: str) -> tuple[subprocess.Popen, str, Path]:
    """`python app.py` on a free port: the process, its URL and its log ($TMPDIR/fasteagle-<kind>-<port>.log)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"fasteagle-{kind}-{port}.log"
    return start_app(port, log_path), f"http://127.0.0.1:{port}/", log_path


def wait_ready(url: str, log_path: Path, timeout: float, cache: bool = True) -> None:
    """Until the app answers and (`cache`) its log says the example cache is complete."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = log_path.read_text() if log_path.exists() else ""
        if "example cache: complete" in text or not cache:
            try:
                httpx.get(url + "config", timeout=5).raise_for_status()
                return
            except httpx.HTTPError:
                pass
        time.sleep(2)
    raise FastEagleError(f"the app was not ready after {timeout:.0f} s (see {log_path})")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="an app already running on this machine (default: start one)")
    p.add_argument("--clients", type=int, default=30, help=f"pages at once (at most {MAX_CLIENTS})")
    p.add_argument("--examples", type=int, default=10, help="of them, pages on the example prompts")
    p.add_argument("--method", default="FastEagle", help="the method every page runs (the page's default)")
    p.add_argument("--max-new-tokens", type=int, default=default_max_new(False))
    p.add_argument("--timeout", type=float, default=900, help="seconds for the start-up, and for the burst")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--first-run", type=int, default=0, metavar="N",
                   help="instead of a burst: N fresh starts, the first run against the idle app's (see above)")
    args = p.parse_args(argv)
    if not 1 <= args.clients <= MAX_CLIENTS or not 0 <= args.examples <= args.clients:
        raise FastEagleError(f"--clients must be 1..{MAX_CLIENTS} and --examples 0..--clients")
    if args.url and urlparse(args.url).hostname not in ("127.0.0.1", "localhost"):
        raise FastEagleError("the load test drives only an app on this machine (http://127.0.0.1:PORT/)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    return run_command(lambda: first_runs(args) if args.first_run else _main(args))


def first_runs(args: argparse.Namespace) -> int:
    """The first run after each of `args.first_run` fresh starts (example cache emptied) against the
    same prompt on the idle app once its cache is complete: their speed-ups, and the medians' ratio."""
    from fasteagle.paths import cache_dir

    prompt = fresh_prompts(1)[0]
    run = run_args(prompt, 0.0, args.method, args.max_new_tokens)
    rows = []
    for i in range(args.first_run):
        shutil.rmtree(cache_dir() / "app-examples", ignore_errors=True)  # the cache empty, as on a wiped Space
        server, url, log_path = launch("firstrun")
        try:
            wait_ready(url, log_path, args.timeout, cache=False)
            first = one_page(url, run, args.timeout)
            wait_ready(url, log_path, args.timeout)
            idle = one_page(url, run, args.timeout)
        finally:
            server.terminate()
            server.wait(30)
        rows.append({"start": i, "first": first, "idle": idle})
        print(f"start {i + 1}: first run {first.get('speedup')}x, idle {idle.get('speedup')}x "
              f"(last frame {first.get('last_frame_s') or 0:.1f} s / {idle.get('last_frame_s') or 0:.1f} s)")
    ok = [r for r in rows if r["first"].get("speedup") and r["idle"].get("speedup")]
    if not ok:
        raise FastEagleError("no start gave both speed-ups (see the app logs in $TMPDIR)")
    med_first = statistics.median(r["first"]["speedup"] for r in ok)
    med_idle = statistics.median(r["idle"]["speedup"] for r in ok)
    print(f"median speed-up: first run after a fresh start {med_first:.2f}x, idle {med_idle:.2f}x "
          f"(ratio {med_first / med_idle:.3f}, {len(ok)} starts, {args.method}, {args.max_new_tokens} tokens)")
    if args.out:
        files.write_text(args.out, json.dumps({
            "command": module_command("fasteagle.app.loadtest"),
            "summary": {"first_speedup_median": med_first, "idle_speedup_median": med_idle,
                        "ratio": med_first / med_idle, "starts": len(ok)},
            "settings": {"method": args.method, "max_new_tokens": args.max_new_tokens, "prompt": prompt,
                         "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S")},
            "starts": rows}, indent=1) + "\n")
    return 0


def _main(args: argparse.Namespace) -> int:
    examples = [EXAMPLES[i % len(EXAMPLES)] for i in range(args.examples)]
    pages = ([("example", run_args(e.prompt, e.temperature, args.method, args.max_new_tokens)) for e in examples]
             + [("fresh", run_args(p, 0.0, args.method, args.max_new_tokens))
                for p in fresh_prompts(args.clients - args.examples)])
    server, url = None, args.url
    if url is None:
        server, url, log_path = launch("loadtest")
    url = url.rstrip("/") + "/"
    try:
        if server is not None:
            wait_ready(url, log_path, args.timeout)
        for e in EXAMPLES:  # each example once: the teacher's first click (a replay once cached)
            one_page(url, run_args(e.prompt, e.temperature, args.method, args.max_new_tokens), args.timeout)
        t0 = time.perf_counter()
        results = burst(url, pages, args.timeout)
        wall = time.perf_counter() - t0
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
    report(args, results, wall)
    return 1 if summarize(results)["failures"] else 0


def report(args: argparse.Namespace, results: list[dict], wall: float) -> None:
    s = summarize(results)
    for r in results:
        if not r.get("ok"):
            print(f"FAILED {r.get('kind')} {r.get('prompt')!r}: {r.get('error')}")
    print(f"{s['clients']} clients ({args.examples} on examples), {s['failures']} failed, all done in {wall:.1f} s; "
          f"example pages' first tree within {s['example_first_tree_s_max']:.2f} s (the slowest); the other "
          f"runs' last frame: median {s['fresh_last_frame_s_median']:.1f} s, p90 {s['fresh_last_frame_s_p90']:.1f} s "
          f"({s['fresh_vanilla_skipped']} of {args.clients - args.examples} skipped vanilla under load)")
    if args.out:
        load = os.getloadavg()
        files.write_text(args.out, json.dumps({
            "command": module_command("fasteagle.app.loadtest"), "summary": s,
            "settings": {"clients": args.clients, "examples": args.examples, "method": args.method,
                         "max_new_tokens": args.max_new_tokens, "cpus": os.cpu_count(),
                         "load_average_after": [round(x, 2) for x in load],
                         "time": time.strftime("%Y-%m-%d %H:%M:%S")},
            "wall_s": wall, "pages": results}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""Talking to the app in tests: a demo served in-process on a free port, /run's outputs by name,
and what a complete run must show."""

from __future__ import annotations

import html
import json
import re
import socket
from contextlib import contextmanager
from pathlib import Path

import gradio as gr
from gradio_client import Client

import viz

# Outputs of /run and /replay_file, in order.
OUT = ["spec_stats", "spec_reply", "van_stats", "van_reply", "badge", "tree", "slider", "step_info", "summary",
       "hist", "depth", "time", "download"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(demo: gr.Blocks, timeout: float | None = None):
    """A client of `demo` launched on a free port; `timeout`: its requests' (httpx's default is 5 s, which a
    loaded CI machine can miss on a cancel, which waits for the handler's next frame)."""
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, show_error=False)
    try:
        yield Client(f"http://127.0.0.1:{port}/", verbose=False,
                     httpx_kwargs=None if timeout is None else {"timeout": timeout})
    finally:
        demo.close()




def call_run(client: Client, prompt: str, method: str = "lookup", max_new: int = 8, temperature: float = 0.0,
             tree_k: str = "4", budget: int = 8, seed: int = 0, shape: str = "product") -> dict:
    out = client.predict(prompt, method, temperature, max_new, tree_k, budget, seed, shape, api_name="/run")
    return dict(zip(OUT, out))


def reply_text(html_: str) -> str:
    """The reply's text from the token spans of viz.spans_html."""
    return "".join(html.unescape(t) for t in re.findall(r'<span class="fe-tok"[^>]*>(.*?)</span>', html_, re.S))


def unchanged(value) -> bool:
    """An output the event left as it was (None, or an update without a value)."""
    return value is None or (isinstance(value, dict) and value.get("__type__") == "update" and "value" not in value)


def kept(value) -> bool:
    """An output the event explicitly kept (an update without a value): None would blank it in a browser."""
    return isinstance(value, dict) and value.get("__type__") == "update" and "value" not in value


def plot_data(value) -> list[dict]:
    assert value and value.get("type") == "plotly"
    return json.loads(value["plot"])["data"]


def check_complete_run(res: dict, max_new: int) -> dict:
    """The end state of a greedy run: identical outputs, a tree with an accepted path, timings."""
    assert 'data-identical="true"' in res["badge"], res["badge"]
    assert "tokens/s" in res["spec_stats"] and "tokens/s" in res["van_stats"]
    assert "Speed-up" in res["summary"]
    names = [t.get("name") for t in plot_data(res["tree"])]
    assert viz.ACCEPTED_PATH in names and "accepted" in names
    spec_text, van_text = reply_text(res["spec_reply"]), reply_text(res["van_reply"])
    assert spec_text == van_text and spec_text.strip()
    assert set(re.findall(r'data-depth="(\d+)"', res["van_reply"])) == {"0"}  # vanilla: only the target's own
    for key in ("hist", "depth", "time"):
        assert plot_data(res[key])
    run = viz.parse_run_file(Path(res["download"]).read_bytes())
    spec = run["sides"]["speculative"]
    assert spec["summary"]["tokens"] <= max_new and run["sides"]["vanilla"]["summary"]["tokens"] <= max_new
    traces = spec["traces"]
    assert res["slider"]["maximum"] == len(traces) - 1
    # it lands on the first step with the longest accepted path (not the last, often a lone bonus token)
    land = res["slider"]["value"]
    lengths = [len(tr.get("path") or [0]) - 1 if tr["step"] > 0 else -1 for tr in traces]
    assert lengths[land] == max(lengths) and land == lengths.index(max(lengths))
    assert f"**Step {traces[land]['step']} of" in res["step_info"]
    assert json.loads(res["tree"]["plot"])["layout"]["title"]["text"].startswith(f"step {traces[land]['step']}:")
    return run

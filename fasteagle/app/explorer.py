"""The app's prompt-set explorer: inspect summaries (`python -m fasteagle inspect`), one request per row,
sorted and filtered in the browser (viz/explorer.py), two side by side, and a click on a request opening
its steps in the main view.

Summaries come from the folders the operator lists in FASTEAGLE_INSPECT_DIRS (each folder's
summary.json and its subfolders'), whose requests' trace files then open, or from an uploaded
summary.json (table and charts only: its trace files stay on the machine that made it). Nothing here
contacts a server: a summary is made by the command line, where the operator runs it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import gradio as gr

from fasteagle.errors import FastEagleError
from fasteagle.inspection import read_summary
from viz.explorer import EXPLORER_JS, explorer_html

log = logging.getLogger("fasteagle.app")

NONE = "(none)"
# the main view comes into sight when a request opens there
SHOW_JS = "() => { document.querySelector('#stage')?.scrollIntoView({behavior: 'smooth', block: 'start'}); }"


class Explorer:
    """The explorer for one app: the summaries found in `folders`, its components, their events."""

    def __init__(self, folders=()):
        self.folders = [Path(f) for f in folders]

    def found(self) -> dict[str, Path]:
        """Label -> summary.json, for every summary in the listed folders and one level below them."""
        out = {}
        for folder in self.folders:
            for path in [folder / "summary.json", *sorted(folder.glob("*/summary.json"))]:
                if path.is_file():
                    out[str(path.parent.relative_to(folder.parent))] = path
        return out

    def layout(self) -> dict:
        """The explorer's accordion: the summary to show and one to compare with, an upload, the view."""
        choices = list(self.found())
        with gr.Accordion("Explore a prompt set: acceptance request by request", open=False, elem_id="explorer-box"):
            gr.Markdown("A summary written by `python -m fasteagle inspect` (a vLLM server's requests, our engine's, "
                        "or a bench result's): every request in one table (click a header to sort, a request to open "
                        "its steps in the view above), tau by kind, acceptance by position, and a second summary "
                        "compared prompt by prompt." + ("" if choices else " This app lists no folders of summaries "
                                                        "(`FASTEAGLE_INSPECT_DIRS`): load one."))
            with gr.Row():
                pick_a = gr.Dropdown(choices, value=None, label="Summary", elem_id="explore-a",
                                     interactive=bool(choices))
                pick_b = gr.Dropdown([NONE, *choices], value=NONE, label="Compare with", elem_id="explore-b",
                                     interactive=bool(choices))
                upload = gr.UploadButton("Load a summary.json…", file_types=[".json"], type="filepath",
                                         elem_id="explore-upload")
            view = gr.HTML(explorer_html(None), js_on_load=EXPLORER_JS, elem_id="explorer")
        return {"pick_a": pick_a, "pick_b": pick_b, "upload": upload, "view": view, "state": gr.State(None)}

    def connect(self, c: dict, screen, ui) -> None:
        """Picking or loading a summary draws it; opening a request replays its trace in the main view."""
        c["pick_a"].change(self.on_pick, [c["pick_a"], c["pick_b"]], [c["view"], c["state"]], api_name=False)
        c["pick_b"].change(self.on_pick, [c["pick_a"], c["pick_b"]], [c["view"], c["state"]], api_name=False)
        c["upload"].upload(self.on_load, [c["upload"]], [c["view"], c["state"]], api_name=False)
        c["view"].open(None, js=SHOW_JS, api_name=False, queue=False)
        self.screen = screen
        c["view"].open(self.on_open, [c["state"], ui.present_state], ui.outputs, api_name=False).then(
            screen.on_replayed, [ui.run_state], screen.settings_outputs, api_name=False)

    # a summary from the listed folders (and maybe a second to compare): its requests' traces open
    def on_pick(self, a, b):
        found = self.found()
        if not a or a not in found:
            return explorer_html(None), None
        try:
            doc_a = read_summary(found[a])
            doc_b = read_summary(found[b]) if b and b != NONE and b in found else None
        except FastEagleError as exc:
            gr.Warning(str(exc))
            return gr.skip(), gr.skip()
        names = (a, b if doc_b is not None else "")
        return (explorer_html(doc_a, doc_b, names, (True, False)),
                {"dir": str(found[a].parent)})

    # an uploaded summary: its table and charts (its trace files are on the machine that made it)
    def on_load(self, path):
        try:
            doc = read_summary(path)
        except FastEagleError as exc:
            gr.Warning(f"cannot show this file: {exc}")
            return gr.skip(), gr.skip()
        note = ("Loaded from a file: its requests' trace files stay where it was made (replay one with the button "
                "above).")
        return explorer_html(doc, None, (Path(path).name, ""), (False, False), note), None

    # a click on a request: its trace file, from the summary's own folder only, in the main view
    def on_open(self, state, present, evt: gr.EventData):
        screen = self.screen
        rel = getattr(evt, "trace", None)
        if not state or not rel:
            return {c: gr.skip() for c in screen.ui.outputs}
        base = Path(state["dir"]).resolve()
        path = (base / rel).resolve()
        if base not in path.parents or not path.is_file():
            gr.Warning(f"no trace file {rel} beside this summary")
            return {c: gr.skip() for c in screen.ui.outputs}
        return screen.on_upload(str(path), present)


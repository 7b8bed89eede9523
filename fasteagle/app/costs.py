"""The costs the what-if panel predicts with (`fasteagle.whatif.Costs`): this machine's, measured once
while no page decodes and kept on disk, and the committed measurements of other devices, each for the
target it was measured with.

Until this machine's are measured, its first preset is the committed CPU measurement of the same
target, labelled as such (the panel moves it through the run's own step either way, so the level is
this machine's and only the curve's shape is borrowed)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import torch

from fasteagle import files, whatif
from fasteagle.app.turns import Turns
from fasteagle.bench.costs import draft_cost, verify_cost
from fasteagle.generate import chat_prompt_ids

log = logging.getLogger("fasteagle.app")

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
CPU_RECORD = RESULTS / "cpu-smollm2-135m-whatif-b6-2026-12-02.json"  # `bench --what-if`: a 2-core CPU's costs
GPU_RECORD = RESULTS / "gpu-h200-smollm2-135m-chat30-2026-11-27.json"  # `bench --tree auto` on an H200
SIZES = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def committed(target_name: str) -> tuple[whatif.Costs | None, whatif.Costs | None]:
    """The committed CPU and GPU costs measured with this target (None where there are none)."""
    cpu = gpu = None
    try:
        doc = json.loads(CPU_RECORD.read_text(encoding="utf-8"))
        entry = (doc.get("what_if") or {}).get("fasteagle")
        if doc.get("target") == target_name and entry:
            cpu = whatif.Costs.from_dict(entry["costs"])
            cpu.label = f"{doc.get('device', 'a CPU')}, measured {doc.get('date', '')}"
            cpu.source = f"committed: {CPU_RECORD.name}"
    except (OSError, ValueError, KeyError):
        log.warning("the committed CPU costs %s could not be read", CPU_RECORD)
    try:
        doc = json.loads(GPU_RECORD.read_text(encoding="utf-8"))
        if doc.get("target") == target_name:
            gpu = whatif.costs_from_auto(doc)
            if gpu is not None:
                gpu.source = f"committed: {GPU_RECORD.name}; no per-step rest measured"
    except (OSError, ValueError, KeyError):
        log.warning("the committed GPU costs %s could not be read", GPU_RECORD)
    return cpu, gpu


class CostBook:
    """The panel's presets for one engine: this machine (measured, or the committed CPU's until then),
    then the committed GPU's."""

    def __init__(self, engine, folder: Path | None):
        self.engine, self.folder = engine, Path(folder) if folder is not None else None
        self.cpu, self.gpu = committed(engine.target.name)
        self.mine: whatif.Costs | None = self._read()

    @property
    def path(self) -> Path | None:
        t = self.engine.target
        name = f"costs-{t.name}-{t.device.type}-{torch.get_num_threads()}threads.json".replace("/", "_")
        return None if self.folder is None else self.folder / name

    def _read(self) -> whatif.Costs | None:
        if self.path is None or not self.path.exists():
            return None
        try:
            return whatif.Costs.from_dict(json.loads(self.path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError):
            return None

    def presets(self) -> list[whatif.Costs]:
        first = self.mine or self.cpu
        if first is not None and self.mine is None:  # borrowed: say so
            first = whatif.Costs(f"this machine (curve of {first.label})", first.verify_ms, first.draft_ms,
                                 first.step_ms, first.other_ms, first.source + "; this machine's own costs are "
                                 "measured once the app has been idle")
        return [c for c in (first, self.gpu) if c is not None]

    def start(self, turns: Turns) -> None:
        """Measure this machine's costs in a background thread, in a quiet turn, unless kept already."""
        if self.mine is None and self.folder is not None and self.engine.default_cascade() is not None:
            threading.Thread(target=self.measure, args=(turns,), name="what-if-costs", daemon=True).start()

    def measure(self, turns: Turns) -> whatif.Costs | None:
        """This machine's verify cost against tree tokens (256 tokens of context) and the cascade's draft
        step against the budget, measured in one background turn and kept on disk."""
        d = self.engine.default_cascade()
        with turns.background(30.0):
            try:
                return self._measure(d)
            except Exception:  # the panel keeps the committed curve
                log.exception("measuring this machine's what-if costs failed")
                return None

    def _measure(self, d) -> whatif.Costs:
        t0 = time.perf_counter()
        timed = whatif.nondecreasing(verify_cost(self.engine.target, SIZES, prefix=256, reps=6)["ms"])
        ids = chat_prompt_ids(self.engine.target, "Explain how a bicycle's gears work, in a few sentences.")
        layers = d.cfg.num_layers
        drafts = draft_cost(self.engine.target, d, ids, sorted({*range(2, layers + 2), 16, 32, 64}))
        dev = self.engine.target.device
        label = f"this machine ({'GPU' if dev.type == 'cuda' else f'CPU, {torch.get_num_threads()} threads'})"
        self.mine = whatif.Costs(label, {int(k): v for k, v in timed.items()}, drafts, timed["1"],
                                 source=f"measured {time.strftime('%Y-%m-%d')} at a 256-token context")
        if self.path is not None:
            files.write_text(self.path, json.dumps(self.mine.to_dict(), indent=2))
        log.info("what-if costs: measured in %.0f s -> %s", time.perf_counter() - t0, self.path)
        return self.mine

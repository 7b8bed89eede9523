"""The step profiler: every decode step split into phases whose times add up to the step, ops
counted per phase (a drafter's phases only where there is a drafter), the same replies as plain
generation, and the table the bench prints."""

from __future__ import annotations

import pytest
import torch

from fasteagle import bench
from fasteagle.errors import FastEagleError
from fasteagle.generate import run
from fasteagle.profile import PHASES, markdown, profile_steps
from tests.test_drafter import make


def test_phases_add_up_and_ops_are_counted(tiny):
    d = make(tiny)
    d.tree_k, d.tree_budget = 4, 12
    prompts = [torch.tensor([5, 7, 9, 11, 7, 9]), torch.tensor([12, 13, 14, 12, 13])]
    prof = profile_steps(tiny, {"vanilla": None, "fasteagle": d}, prompts, max_new=16)
    van, fe = prof["vanilla"], prof["fasteagle"]
    assert set(van["phases"]) == {"target", "rest"} and set(fe["phases"]) == set(PHASES)
    assert van["steps"] == 2 * 15 and van["tau"] == 1.0  # 16 tokens: the prefill's, then 15 steps
    want_steps = sum(len(run(tiny, p, drafter=d, max_new_tokens=16)[1]) - 1 for p in prompts)
    assert fe["steps"] == want_steps and fe["tau"] == pytest.approx(2 * 15 / want_steps, abs=1e-3)
    for m in (van, fe):
        assert sum(p["ms"] for p in m["phases"].values()) == pytest.approx(m["step_ms"], rel=0.02, abs=0.01)
        assert sum(p["ops"] for p in m["phases"].values()) == pytest.approx(m["step_ops"], abs=0.5)
        assert m["phases"]["target"]["ops"] > 20 and m["phases"]["target"]["ms"] > 0
    # the drafter's work is counted where it happens, and only with a drafter
    assert fe["phases"]["extend"]["ops"] > 10 and fe["phases"]["draft"]["ops"] > 2
    assert fe["phases"]["target"]["ops"] == pytest.approx(van["phases"]["target"]["ops"], rel=0.2)
    doc = {"profile": True, "device": "cpu", "target": tiny.name, "methods": prof,
           "settings": {"prompts_desc": "2 prompts,", "max_new_tokens": 16}}
    table = bench.markdown_table(doc)
    assert table == markdown(doc) and "| fasteagle |" in table and "| vanilla | 1.00 |" in table
    assert "| - | - |" in table.splitlines()[-2]  # vanilla has no draft or extend phase


def test_no_decode_step_is_a_clear_error(tiny):
    """One new token is the prefill's alone: nothing to profile, said plainly (it divided by zero)."""
    with pytest.raises(FastEagleError, match="no decode step"):
        profile_steps(tiny, {"vanilla": None}, [torch.tensor([5, 7, 9])], max_new=1)

"""The sampling inspector's "draw 1,000 times" (viz/sampling.js), run in Node: its histogram passes
the chi-square test of tests/test_verify.py against the target's distribution, as the engine's own rule
(fasteagle.verify.verify_sampling) does on the same distribution and drafts, and a broken rule
(accept every draft) fails it."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch
from scipy.stats import chi2

from fasteagle.tree import make_tree
from fasteagle.verify import SamplingParams, verify_sampling
from tests.test_verify import ALPHA, MIN_EXPECTED

NODE = shutil.which("node")
SCRIPT = Path(__file__).resolve().parents[1] / "viz" / "sampling.js"
DRAWS = 1000


def _p_and_drafts(seed: int = 3, vocab: int = 40):
    """A target's distribution as a trace keeps it (top tokens, the rest as one outcome) and three
    drafts among its likely tokens, tried in an order that is not p's."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(vocab, generator=g) * 1.6, -1)
    likely = p.argsort(descending=True)[:6].tolist()
    return p.tolist(), [likely[2], likely[0], likely[4]]


def chi_square(counts: list[int], p: list[float]) -> tuple[float, float]:
    """(statistic, critical value at ALPHA): bins expected under MIN_EXPECTED merged, as in test_verify."""
    n = sum(counts)
    keep = [i for i, q in enumerate(p) if q * n >= MIN_EXPECTED]
    rest = [i for i in range(len(p)) if i not in keep]
    exp = [p[i] * n for i in keep] + ([sum(p[i] for i in rest) * n] if rest else [])
    obs = [counts[i] for i in keep] + ([sum(counts[i] for i in rest)] if rest else [])
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    return stat, float(chi2.isf(ALPHA, len(exp) - 1))


def _node(expr: str):
    code = SCRIPT.read_text(encoding="utf-8") + f"\nconsole.log(JSON.stringify({expr}));\n"
    out = subprocess.run([NODE, "-e", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(NODE is None, reason="Node.js is needed to run the page's script outside a browser")
def test_the_pages_draws_keep_the_targets_distribution_and_a_broken_rule_does_not():
    p, drafts = _p_and_drafts()
    counts = _node(f"drawMany({json.dumps(p)}, {json.dumps(drafts)}, {DRAWS}, 7)")
    assert sum(counts) == DRAWS
    stat, crit = chi_square(counts, p)
    assert stat < crit, (stat, crit)
    args = f"{json.dumps(p)}, {json.dumps(drafts)}, r, true"
    broken = _node(f"(() => {{ const r = seeded(7), c = new Array({len(p)}).fill(0); "
                   f"for (let k = 0; k < {DRAWS}; k++) c[sampleOnce({args})]++; return c; }})()")
    stat, crit = chi_square(broken, p)
    assert stat > crit, (stat, crit)


@pytest.mark.skipif(NODE is None, reason="Node.js is needed to run the page's script outside a browser")
def test_the_pages_outcomes_keep_a_draft_outside_the_top_tokens():
    """A draft below the kept top tokens is an outcome of its own, its p taken out of the rest."""
    got = _node("outcomes([['a', 'b'], [0.5, 0.3], 0.2], [['b', 0.3], ['z', 0.05]])")
    assert got["labels"] == ["a", "b", "z", "other"]
    assert got["p"] == pytest.approx([0.5, 0.3, 0.05, 0.15])


def test_the_engines_rule_on_the_same_distribution_passes_the_same_test():
    """fasteagle.verify's sampling rule, on a one-level tree of the same drafts and this p as the target's:
    what it emits (the accepted draft, else the token drawn from the residual) follows p."""
    p, drafts = _p_and_drafts()
    logits = torch.log(torch.tensor(p))[None].expand(1 + len(drafts), -1).contiguous()
    tree = make_tree(torch.tensor([0, *drafts]), torch.tensor([-1] + [0] * len(drafts)))
    g = torch.Generator().manual_seed(11)
    emitted = Counter()
    for _ in range(DRAWS):
        v = verify_sampling(logits, tree, SamplingParams(temperature=1.0), g)
        emitted[int(tree.tokens[v.path[1]]) if len(v.path) > 1 else v.bonus] += 1
    stat, crit = chi_square([emitted.get(i, 0) for i in range(len(p))], p)
    assert stat < crit, (stat, crit)

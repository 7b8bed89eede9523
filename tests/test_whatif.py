"""The what-if model (`fasteagle.whatif`): the tree builders' order, a run replayed at other budgets
(exact against the trees the builders make and the target's own continuation), why a sampled run
replays too, the costs and the formula, and the runs it refuses."""

from __future__ import annotations

import random

import pytest
import torch

from fasteagle import tree as T
from fasteagle import treeorder, whatif
from fasteagle.drafter import CascadedDrafter
from fasteagle.generate import chat_prompt_ids, generate
from fasteagle.hybrid import WithLookup
from fasteagle.methods import DEFAULT_DRAFTER
from fasteagle.tree import make_tree
from fasteagle.verify import SamplingParams, verify_sampling

PROMPT = "List the planets of the solar system in order from the sun, one per line."


def _rows(seed: int, depths: int = 5, k: int = 6) -> list[list[float]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(depths):
        raw = sorted((rng.random() ** 3 for _ in range(k)), reverse=True)
        total = sum(raw) * rng.uniform(1.0, 3.0)  # a top-k holds part of the mass
        rows.append([r / total for r in raw])
    return rows


def _paths(order) -> set[tuple[int, ...]]:
    """Each node of a (depth index, rank, parent) order as its rank path."""
    paths: list[tuple[int, ...]] = [()]
    for _, r, parent in order:
        paths.append(paths[parent] + (r,))
    return set(paths[1:])


def _tree_paths(tr, rows) -> set[tuple[int, ...]]:
    """A built tree's nodes as rank paths (a node's rank: the index of its prob in its depth's row)."""
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tr.size):
        d = int(tr.depths[i]) - 1
        r = min(range(len(rows[d])), key=lambda j: abs(rows[d][j] - float(tr.draft_probs[i])))
        paths.append(paths[int(tr.parents[i])] + (r,))
    return set(paths[1:])


@pytest.mark.parametrize("shape", treeorder.SHAPES)
def test_the_order_is_the_tree_builders_at_every_budget(shape):
    for seed in range(20):
        rows = _rows(seed)
        k_at = [6, 4, 3, 2, 2]
        ids = torch.arange(30).view(5, 6) + 1
        order = treeorder.ORDERS[shape](rows, k_at, 40)
        for budget in (2, 3, 6, 12, 25):
            built = T.TREE_BUILDERS[shape](0, ids, torch.tensor(rows), k_at, budget)
            assert _paths(order[:budget - 1]) == _tree_paths(built, rows), (shape, seed, budget)


def test_an_order_ends_where_the_candidates_do():
    order = treeorder.product_order([[0.5, 0.3], [0.9]], [2, 1], 100)
    assert len(order) == 4  # a, b, a>x, b>x
    assert treeorder.product_order([[0.5]], [1], 0) == []


def _walk(tr, continuation: list[int]) -> int:
    """Depths a tree accepts against a known continuation: follow the child holding each next token."""
    node, depth = 0, 0
    for tok in continuation:
        kids = [i for i in range(1, tr.size) if int(tr.parents[i]) == node and int(tr.tokens[i]) == tok]
        if not kids:
            break
        node, depth = kids[0], depth + 1
    return depth


@pytest.fixture(scope="module")
def cascade(smollm):
    d = CascadedDrafter.load(DEFAULT_DRAFTER, smollm.model)
    d.state.all_layers = True  # a small tree's run lists every depth's candidates
    return d


def test_a_small_run_replays_the_trees_of_bigger_budgets_exactly(smollm, cascade):
    """Greedy: from a 4-node run, each step's tree at 8 and 24 nodes (rebuilt by `tree.product` from the
    step's candidate lists) accepts what the target's own continuation says; the grid counts the same."""
    ids = chat_prompt_ids(smollm, PROMPT)
    cascade.tree_budget = 4
    steps = [s.to_dict() for s in generate(smollm, ids, drafter=cascade, max_new_tokens=40, stop_ids=set())]
    rep = whatif.replay(steps, "product", cascade.max_k, 4)
    g = whatif.grid(rep, [1, 4, 8, 24])
    reply = [t for s in steps for t in s["tokens"]]
    decode = steps[1:]
    expected = {8: 0, 24: 0, 4: 0}
    counted, start = 0, 1  # reply index after each step's root
    for s in decode:
        top = s["layer_top"]
        truth = reply[start:start + len(top)]
        start += len(s["tokens"])
        if len(truth) < len(top):
            continue
        counted += 1
        tids = torch.tensor([[t for t, _ in d] for d in top])
        tps = torch.tensor([[p for _, p in d] for d in top])
        for b in expected:
            expected[b] += _walk(T.product(s["tree"]["tokens"][0], tids, tps, cascade.max_k, b), truth)
    assert g.steps == counted > 20
    for b, hits in expected.items():
        assert g.tau[len(decode[0]["layer_top"])][b] == pytest.approx(1 + hits / counted, abs=1e-4)
    # at the run's own budget the replay is the run (its whole steps): what the trees accepted
    whole = [len(s["tokens"]) for s in decode][:counted]
    assert g.tau[max(g.depths)][4] == pytest.approx(sum(whole) / counted, abs=1e-4)
    assert g.tau[max(g.depths)][1] == 1.0 and g.tau[max(g.depths)][24] >= g.tau[max(g.depths)][8]
    assert g.chain[1] <= g.chain[3] and g.chain[max(g.depths)] <= g.tau[max(g.depths)][24]
    table = whatif.rank_table(rep)
    assert all(abs(sum(row) - 1) < 1e-3 for row in table) and len(table) == rep.depths
    assert whatif.Grid.from_dict(g.to_dict()) == g


def test_a_sampled_tree_accepts_the_longest_prefix_of_what_it_emits():
    """Why a sampled run replays: the verifier accepts a child exactly when the token it emits there is
    that child's, so any tree's accepted path is the longest prefix of the emitted draw the tree holds."""
    gen = torch.Generator().manual_seed(0)
    vocab = 12
    for trial in range(300):
        n = 2 + trial % 9
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        tokens, seen = [int(torch.randint(vocab, (1,), generator=gen))], set()
        for i in range(1, n):  # siblings keep distinct tokens, as every tree builder's do
            tok = int(torch.randint(vocab, (1,), generator=gen))
            while (parents[i], tok) in seen:
                tok = (tok + 1) % vocab
            seen.add((parents[i], tok))
            tokens.append(tok)
        tr = make_tree(torch.tensor(tokens), torch.tensor(parents))
        logits = torch.randn(n, vocab, generator=gen) * 2
        v = verify_sampling(logits, tr, SamplingParams(0.8), gen)
        emitted = [tokens[i] for i in v.path.tolist()[1:]] + [v.bonus]
        assert _walk(tr, emitted) == len(v.path) - 1


def test_the_formula_and_the_costs():
    c = whatif.Costs("cpu", {1: 40.0, 8: 48.0, 64: 120.0}, {2: 2.0, 7: 7.0, 64: 8.0}, step_ms=40.0, other_ms=1.0)
    assert whatif.tokens_per_s(2.0, 8.0, 91.0, 1.0) == pytest.approx(20.0)
    assert c.verify(36) == pytest.approx(84.0) and c.verify(0.5) == 40.0
    assert c.verify(120) == pytest.approx(120.0 + 72.0 * 56 / 56) and c.largest == 64  # on along the last line
    assert c.draft(60, depth=3) == pytest.approx(4.0)  # a depth cap of 3 runs the layers a budget of 4 does
    moved = c.anchored(8, 8.0, draft_ms=9.0, verify_ms=50.0, other_ms=2.0)
    assert moved.verify(8) == pytest.approx(50.0, abs=0.01) and moved.draft(8) == pytest.approx(9.0, abs=0.01)
    assert moved.other_ms == 2.0
    assert whatif.Costs.from_dict(c.to_dict()) == c
    g = whatif.Grid([1, 8, 64], {3: {1: 1.0, 8: 2.0, 64: 2.5}}, {3: {1: 1.0, 8: 8.0, 64: 40.0}}, {3: 1.8}, 10, 8, 2.0)
    p = whatif.predict(g, c, 64)
    assert p["tau"] == 2.5 and p["tree_size"] == 40.0
    # every depth the run drafted: no cap, the draft as measured at the budget
    assert p["tokens_per_s"] == pytest.approx(1e3 * 2.5 / (c.draft(64) + c.verify(40) + 1.0), rel=1e-3)
    assert whatif.predict(g, c, 20)["tau"] == 2.0  # between the replayed budgets: the one below
    chain = whatif.predict(g, c, 0, depth=3, chain=True)
    assert chain["budget"] == 4 and chain["tau"] == 1.8
    assert whatif.nondecreasing({"1": 5.0, "2": 4.0, "4": 6.0}) == {"1": 4.5, "2": 4.5, "4": 6.0}


def test_runs_it_cannot_replay_say_why(smollm, cascade):
    ids = chat_prompt_ids(smollm, PROMPT)
    cascade.tree_budget = 4
    joined = [s.to_dict() for s in generate(smollm, ids, drafter=WithLookup(cascade), max_new_tokens=12)]
    plain = [s.to_dict() for s in generate(smollm, ids, drafter=cascade, max_new_tokens=3, stop_ids=set())]
    no_lists = [s | {"layer_top": []} for s in plain]
    lookup_tree = [s if not s.get("tree") else s | {"tree": s["tree"] | {"sources": [0, -1]}} for s in joined]
    for steps, said in ((no_lists, "candidates"), (plain[:1], "no decode step"), (plain, "enough of the reply"),
                        (lookup_tree, "lookup")):
        with pytest.raises(whatif.WhatIfError, match=said):
            whatif.replay(steps)
    with pytest.raises(whatif.WhatIfError, match="replays the"):
        whatif.replay(plain, "dynamic")


def test_bench_keeps_a_what_if_record_and_predict_reads_it(tiny, tmp_path, monkeypatch, capsys):
    """`bench --what-if` keeps each cascade's grid, rank table, cost curves and own step; `--predict` prints
    the model at budgets, with a measured run beside its budget's row; what cannot be done says so in one line."""
    import json

    import fasteagle.target
    from fasteagle.cli import main
    from fasteagle.drafter import DrafterConfig

    CascadedDrafter(DrafterConfig.for_target(tiny.model, tiny.name, num_layers=3, intermediate=32)).save(tmp_path / "c")
    monkeypatch.setattr(fasteagle.target, "load_target", lambda *a, **k: tiny)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "chat", "text": "count one two three one two three"}) + "\n")
    out = tmp_path / "r.json"
    base = ["bench", "--prompts", str(prompts), "--max-new-tokens", "12", "--device", "cpu", "--tree-budget", "3"]
    assert main(base + ["--methods", "vanilla,small", "--drafters", f"small={tmp_path / 'c'}", "--what-if",
                        "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rec = doc["what_if"]["small"]
    assert set(rec) == {"grid", "rank_table", "costs", "run"} and rec["run"]["budget"] == 3
    g = whatif.Grid.from_dict(rec["grid"])
    assert g.depths == [1, 2, 3] and max(g.budgets) == 192 and g.tau[3][3] >= 1.0
    assert "replay" not in doc["rows"]["small"][0] and doc["settings"]["what_if"]["all_layers"]
    capsys.readouterr()
    pred = tmp_path / "pred.json"
    assert main(["bench", "--predict", str(out), "--against", str(out), "--out", str(pred)]) == 0
    shown = capsys.readouterr().out
    assert "| 3 |" in shown and "| 60 |" in shown and "costs: this machine" in shown
    rows = {r["budget"]: r for r in json.loads(pred.read_text())["methods"]["small"]["rows"]}
    assert rows[3]["measured_tau"] == doc["methods"]["small"]["tau"] and "tokens_per_s_error" in rows[3]
    # the run's own step is on the curve: the anchored costs give back its draft and verify ms
    assert rows[3]["verify_ms"] == pytest.approx(rec["run"]["verify_ms"], abs=0.05)
    assert main(["bench", "--predict", str(out), "--tree-budget", "16", "--tree-depth", "1"]) == 0
    assert "| 16 |" in capsys.readouterr().out
    plain = tmp_path / "plain.json"
    assert main(base + ["--methods", "vanilla,lookup", "--out", str(plain)]) == 0
    capsys.readouterr()
    assert main(["bench", "--predict", str(plain)]) == 2
    assert "holds no what-if record" in capsys.readouterr().err
    assert main(base + ["--methods", "vanilla,lookup", "--what-if"]) == 2
    assert "--what-if replays a cascade" in capsys.readouterr().err
    assert main(["bench", "--predict", str(out), "--costs", str(plain)]) == 2
    assert "holds no `--tree auto` costs" in capsys.readouterr().err


def _run_record(target, drafter, budget=6, method="fasteagle", max_new=40):
    from fasteagle import trace

    ids = chat_prompt_ids(target, PROMPT)
    drafter.tree_budget = budget
    spec = [s.to_dict() for s in generate(target, ids, drafter=drafter, max_new_tokens=max_new, stop_ids=set())]
    van = [s.to_dict() for s in generate(target, ids, drafter=None, max_new_tokens=max_new, stop_ids=set())]
    meta = {"method": "FastEagle", "method_key": method, "tree_budget": budget, "tree_k": "", "tree_shape": "product"}
    return {"meta": meta, "sides": {"speculative": {"traces": spec, "summary": trace.run_summary(spec)},
                                    "vanilla": {"traces": van, "summary": trace.run_summary(van)}}}


def test_the_panel_answers_every_slider_from_the_model(smollm):
    """viz.whatif: every preset's numbers for every depth and budget, from the model; the first preset
    (this machine) passes through the run's own step; a run it cannot replay gets its reason, in a line."""
    import viz
    from fasteagle.app.costs import committed
    from viz import whatif as panel

    d = CascadedDrafter.load(DEFAULT_DRAFTER, smollm.model)
    run = _run_record(smollm, d)
    cpu, gpu = committed(smollm.name)
    assert cpu is not None and gpu is not None and "H200" in gpu.label
    data = panel.whatif_data(run, [cpu, gpu])
    assert data["depths"] == [1, 2, 3, 4, 5] and data["run"]["budget"] == 6  # a 6-node tree drafts 5 depths
    mine, h200 = data["presets"]
    assert max(mine["budgets"]) == 64 and max(h200["budgets"]) > 64
    row = mine["by_depth"]["5"]
    at = mine["budgets"].index(6)
    decode = run["sides"]["speculative"]["traces"][1:]
    draft = sum(s["draft_ms"] for s in decode) / len(decode)
    verify = sum(s["verify_ms"] for s in decode) / len(decode)
    assert row["draft_ms"][at] == pytest.approx(draft, abs=0.02)
    assert row["verify_ms"][at] == pytest.approx(verify, rel=0.015)  # the run's last trees were cut shorter
    assert row["tau"][-1] >= row["tau"][at] >= row["tau"][0] == 1.0
    assert data["run"]["speedup"] > 0 and len(data["ranks"]) == 5
    html = viz.whatif_html(run, [cpu, gpu])
    assert 'data-wi="' in html and "drawing" in html
    for broken, said in ((run | {"meta": run["meta"] | {"method_key": "eagle3", "method": "EAGLE-3"}},
                          "EAGLE-3 drafts without them"),
                         ({"meta": run["meta"], "sides": {"speculative": {"traces": [
                             s | {"layer_top": []} for s in run["sides"]["speculative"]["traces"]]}}}, "candidates")):
        out = viz.whatif_html(broken, [cpu])
        assert said in out and "data-wi" not in out
    assert panel.EMPTY in viz.whatif_html(None)
    assert "no measured costs" in viz.whatif_html(run, [])


def test_this_machines_costs_are_measured_once_and_kept(tiny, tmp_path):
    """The app measures this machine's costs in a background turn and keeps them on disk; a new engine
    reads them instead of measuring again; until then the first preset borrows the committed CPU curve."""
    from fasteagle.app.costs import CostBook
    from fasteagle.app.engine import Engine
    from fasteagle.app.turns import Turns

    d = CascadedDrafter(_tiny_config(tiny))
    d.save(tmp_path / "fe")
    engine = Engine(tiny, tmp_path / "fe", None)
    book = CostBook(engine, tmp_path)
    assert book.mine is None and book.presets() == []  # the tiny target has no committed costs
    turns = Turns()
    mine = book.measure(turns)
    assert mine is not None and book.path.exists() and mine.step_ms == mine.verify_ms[1]
    assert set(mine.draft_ms) >= {2, 3, 16, 64} and book.presets()[0].label.startswith("this machine")
    assert CostBook(engine, tmp_path).mine == mine


def _tiny_config(target):
    from fasteagle.drafter import DrafterConfig

    return DrafterConfig.for_target(target.model, target.name, num_layers=2, intermediate=32)

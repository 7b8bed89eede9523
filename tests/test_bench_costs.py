"""What the benchmark measures of a step's cost, and the tree sizes it picks from it: the target's verify
cost by tree size, the drafters' step at a model's shape, `--tree auto`, the budget replay and the budget
curve, on the tiny target."""

from __future__ import annotations

import copy
import statistics

import pytest
import torch

from fasteagle import bench, packing, trace, whatif
from fasteagle.drafter import CascadedDrafter, DrafterConfig
from fasteagle.errors import FastEagleError
from fasteagle.generate import chat_prompt_ids, generate
from fasteagle.lookup import LookupDrafter
from fasteagle.target import Target
from tests.test_bench import PROMPTS

TINY_SHAPE = dict(target_hidden=32, vocab_size=200, width=32, intermediate=64, num_heads=4, num_kv_heads=2,
                  head_dim=8, rope_theta=10000.0, draft_vocab=0)


class OracleDrafter:
    """A test double that drafts the target's own greedy continuation (known beforehand) as every
    depth's top candidate, with one wrong sibling per depth: acceptance then depends on the budget only."""

    feature_layers: tuple[int, ...] = ()

    def __init__(self, replies: dict[int, list[int]], depths: int = 3):
        self.replies, self.depths, self.tree_budget = replies, depths, 16
        self.want, self.generated = [], 0

    def reset(self, capacity: int) -> None:
        self.generated = 0

    def extend(self, tokens, features, next_token: int) -> None:
        if self.generated == 0:  # the prompt: its length tells which reply follows
            self.want, self.generated = self.replies[tokens.numel()], 1
        else:
            self.generated += tokens.numel()  # the root and the accepted tokens; the bonus is the next root

    def draft(self, root: int):
        from fasteagle.tree import product

        true = [self.want[min(self.generated + d, len(self.want) - 1)] for d in range(self.depths)]
        ids = torch.tensor([[t, (t + 1) % 300 + 4] for t in true])
        probs = torch.tensor([[0.6, 0.3]] * self.depths)
        return product(root, ids, probs, 2, self.tree_budget)


def test_verify_cost_reports_every_size(tiny):
    cost = bench.verify_cost(tiny, sizes=(1, 4, 8), prefix=16, reps=2)
    assert set(cost["ms"]) == set(cost["relative"]) == {"1", "4", "8"} and cost["relative"]["1"] == 1.0
    assert cost["prefix"] == 16 and all(ms > 0 for ms in cost["ms"].values())
    for t in ("4", "8"):  # each size's time over the one-token step's
        assert cost["relative"][t] == pytest.approx(cost["ms"][t] / cost["ms"]["1"], rel=0.05, abs=0.02)


@pytest.mark.skipif(not packing.available(), reason="this PyTorch build has no oneDNN linear ops")
def test_verify_cost_times_prepacked_and_stock_linears_side_by_side(tiny):
    model = copy.deepcopy(tiny.model)
    assert packing.pack_linears(model) > 0
    packed = Target(model=model, tokenizer=tiny.tokenizer, name=tiny.name, packed=1)
    cost = bench.verify_cost({"prepacked": packed, "stock": tiny}, sizes=(1, 4), prefix=8, reps=2)
    assert cost["ms"] == cost["variants"]["prepacked"]["ms"]
    stock = cost["variants"]["stock"]
    for t in ("1", "4"):
        assert stock["over_prepacked"][t] == pytest.approx(stock["ms"][t] / cost["ms"][t], abs=0.02)
    table = bench.markdown_table(cost | {"device": "cpu"})
    assert "prepacked and stock linear layers timed interleaved" in table
    assert "| ms (stock linears) | " in table and "| stock / prepacked | " in table
    assert table.count("\n|") == 7  # header, rule, 2 rows per variant, one ratio row


def test_auto_tree_picks_the_budget_with_the_best_expected_rate(tiny):
    torch.manual_seed(0)
    d = CascadedDrafter(DrafterConfig.for_target(tiny.model, tiny.name, num_layers=3, intermediate=64))
    d.attach(tiny.model).eval()
    choice = bench.auto_tree(tiny, d, PROMPTS[:1], budgets=(8, 4), max_new=8)
    rate = choice["tokens_per_s"]
    assert set(rate) == {"4", "8"} and choice["budget"] == int(max(rate, key=rate.get)) == d.tree_budget
    per_step = choice["tokens_per_step"]
    assert 1.0 <= per_step["4"] <= per_step["8"] and choice["replayed_steps"] > 0
    for b in ("4", "8"):  # the rate is the model it claims to be
        expected = 1e3 * per_step[b] / (choice["draft_ms"][b] + choice["verify_ms"][b])
        assert rate[b] == pytest.approx(expected, rel=0.01)
        speedup = rate[b] * choice["decode_step_ms"] / 1e3
        assert choice["speedup_vs_decode_step"][b] == pytest.approx(speedup, rel=0.01, abs=1e-3)


def test_replay_keeps_the_best_nodes_and_cuts_the_accepted_path_at_the_first_dropped_one():
    # root 0; 1 (p .5) and 2 (p .3) under it; 3 (.9) and 4 (.2) under 1; 5 (.5) under 3
    tree = {"parents": [-1, 0, 0, 1, 1, 3], "draft_probs": [1.0, 0.5, 0.3, 0.9, 0.2, 0.5]}
    assert trace.best_nodes(tree, 6) == [1, 3, 2, 5, 4]  # path probabilities .5, .45, .3, .225, .1
    assert [trace.replay_budget(tree, [0, 1, 3, 5], b) for b in range(1, 8)] == [0, 1, 2, 2, 3, 3, 3]
    assert [trace.replay_budget(tree, [0, 2], b) for b in (3, 4)] == [0, 1]
    assert trace.replay_budget(tree, [0], 6) == 0


def test_replay_keeps_what_prompt_lookup_proposed_at_every_budget():
    # the drafter's nodes 1, 2 (under the root) and 3 (under 1); lookup proposed 1 -> 4 and 5 -> 6,
    # so 4, 5 and 6 are lookup's own nodes (source -1) and 1 is both drafters' guess
    tree = {"tokens": [9, 10, 11, 12, 13, 14, 15], "parents": [-1, 0, 0, 1, 1, 0, 5],
            "draft_probs": [1.0, 0.5, 0.3, 0.9, 1.0, 1.0, 1.0], "sources": [0, 1, 1, 2, -1, -1, -1]}
    lookup_tree = {"tokens": [9, 10, 13, 14, 15], "parents": [-1, 0, 1, 0, 3]}
    assert bench.token_paths(lookup_tree) == {(10,), (10, 13), (14,), (14, 15)}
    lookup = bench.lookup_nodes(tree, lookup_tree)
    assert lookup == {1, 4, 5, 6}
    assert trace.best_nodes(tree, 10) == [1, 3, 2]  # lookup's nodes never compete for the budget
    # the path through lookup's 1 -> 4 is kept at every budget, even where the drafter keeps nothing
    assert [trace.replay_budget(tree, [0, 1, 4], b, lookup, sizes=True) for b in (1, 2, 4)] == [(2, 5), (2, 5), (2, 7)]
    assert [trace.replay_budget(tree, [0, 1, 3], b, lookup) for b in (1, 2, 3)] == [1, 1, 2]
    assert trace.replay_budget(tree, [0, 2], 3, lookup, sizes=True) == (0, 6)  # 1, 3, 4, 5, 6 and the root


def test_auto_tree_tunes_a_drafter_joined_with_lookup(tiny):
    from fasteagle.hybrid import WithLookup

    torch.manual_seed(0)
    inner = CascadedDrafter(DrafterConfig.for_target(tiny.model, tiny.name, num_layers=3, intermediate=64))
    d = WithLookup(inner.attach(tiny.model).eval())
    choice = bench.auto_tree(tiny, d, PROMPTS[:1], budgets=(8, 4), max_new=24)
    assert choice["budget"] == inner.tree_budget == d.tree_budget
    sizes = choice["tree_size"]
    assert 1 <= sizes["4"] <= sizes["8"] and choice["replayed_steps"] > 0
    for b in ("4", "8"):
        expected = 1e3 * choice["tokens_per_step"][b] / (choice["draft_ms"][b] + choice["verify_ms"][b])
        assert choice["tokens_per_s"][b] == pytest.approx(expected, rel=0.01)


def test_interpolated_verify_cost():
    ms = {"1": 10.0, "4": 16.0, "8": 20.0}
    # flat below the smallest size, on along the last line past the largest
    assert [whatif.interpolate(ms, s) for s in (0, 1, 2, 4, 6, 8, 12)] == [10.0, 10.0, 12.0, 16.0, 18.0, 20.0, 24.0]


def test_verify_costs_are_made_nondecreasing_by_pooling_only_what_violates_the_order():
    assert bench.nondecreasing({"1": 10.0, "2": 14.0, "4": 12.0, "8": 20.0}) == {"1": 10.0, "2": 13.0, "4": 13.0,
                                                                               "8": 20.0}
    assert bench.nondecreasing({"16": 9.0, "1": 10.0, "4": 8.0}) == {"1": 9.0, "4": 9.0, "16": 9.0}
    ordered = {"1": 1.0, "2": 2.0, "3": 3.0}
    assert bench.nondecreasing(ordered) == ordered


@pytest.mark.parametrize("kind", ["fasteagle", "fasteagle-backbone", "eagle3"])
def test_a_smaller_budget_drafts_the_best_nodes_of_a_bigger_tree(tiny, kind):
    """What replay assumes of both tree builders: from the same state, budget B drafts exactly the
    best B-1 nodes (by path probability) of the tree a bigger budget drafts."""
    from fasteagle.eagle3 import AutoregressiveDrafter

    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(tiny.model, tiny.name, num_layers=3, intermediate=64)
    d = (AutoregressiveDrafter(AutoregressiveDrafter.config_for(cfg, 4)) if kind == "eagle3"
         else CascadedDrafter(cfg)).attach(tiny.model).eval()
    d.tree_k = 3
    if kind == "fasteagle-backbone":
        d.tree_shape = "backbone"
    ids = torch.randint(4, 200, (12,))
    first = {}
    for b in (5, 9, 20):
        d.tree_budget = b
        first[b] = next(s for s in generate(tiny, ids, drafter=d, max_new_tokens=2) if s.tree).tree
    big = first[20]
    for b in (5, 9):
        small = first[b]
        want = sorted((big["tokens"][i], big["depths"][i]) for i in trace.best_nodes(big, b))
        assert sorted(zip(small["tokens"][1:], small["depths"][1:])) == want


def test_cpu_results_name_the_model_and_vector_isa():
    name = bench.device_name(torch.device("cpu"))
    assert name.startswith("CPU (") and f"{torch.get_num_threads()} threads" in name
    assert torch.backends.cpu.get_cpu_capability() in name


def test_gpu_results_name_the_host_cpu(monkeypatch):
    """A launch-bound GPU's speedups move with the CPU feeding it, so its results name that CPU too."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA H200")
    monkeypatch.setattr(bench.timing, "cpu_model", lambda: "Some Xeon")
    assert bench.device_name(torch.device("cuda")) == "NVIDIA H200 (host Some Xeon)"
    monkeypatch.setattr(bench.timing, "cpu_model", lambda: None)
    assert bench.device_name(torch.device("cuda")) == "NVIDIA H200"


def test_draft_step_cost_times_both_drafters_at_every_depth():
    cost = bench.draft_step_cost(TINY_SHAPE, depths=(2, 3), prefix=8, reps=1, device="cpu")
    assert set(cost["ms"]) == {"2", "3"}
    for row in cost["ms"].values():
        assert row["fasteagle"] > 0 and row["eagle3"] > 0
        assert row["eagle3_over_fasteagle"] == pytest.approx(row["eagle3"] / row["fasteagle"], rel=0.05)


def test_verify_cost_and_draft_step_render_as_tables(tiny):
    cost = bench.verify_cost(tiny, sizes=(1, 4), prefix=8, reps=1)
    table = bench.markdown_table(cost | {"device": "cpu"})
    assert "| vs T=1 | 1.00x | " in table and table.count("\n|") == 4  # header, rule, ms, relative
    step = bench.draft_step_cost(TINY_SHAPE, depths=(2,), prefix=8, reps=1, device="cpu")
    assert "| 2 | " in bench.markdown_table(step) and "EAGLE-3 / FastEagle" in bench.markdown_table(step)
    assert "CUDA graph" not in bench.markdown_table(step)  # a CPU run has no graph column
    step["ms"]["2"]["fasteagle_graph"] = 0.25  # as a GPU run adds it
    table = bench.markdown_table(step)
    assert "FastEagle as a CUDA graph ms |" in table and table.rstrip().endswith("| 0.25 |")


def test_draft_step_cost_packs_both_drafters_like_the_engine_does_on_a_cpu(monkeypatch):
    """Packed and stock draft steps must both run and say which they were (the table names it)."""
    packed = bench.draft_step_cost(TINY_SHAPE, depths=(2,), prefix=8, reps=1, device="cpu")
    stock = bench.draft_step_cost(TINY_SHAPE, depths=(2,), prefix=8, reps=1, device="cpu", pack=False)
    assert stock["packed_linears"] == 0 and "stock linears" in bench.markdown_table(stock)
    if packing.available():
        assert packed["packed_linears"] == 1 and "prepacked linears" in bench.markdown_table(packed)
        want = "int8" if packing.int8_available() else "fp32"
        assert packed["draft_weights"] == want and f"{want} drafter weights" in bench.markdown_table(packed)
        fp32 = bench.draft_step_cost(TINY_SHAPE, depths=(2,), prefix=8, reps=1, device="cpu", int8=False)
        assert fp32["draft_weights"] == "fp32"
    monkeypatch.setenv("FASTEAGLE_PACK", "0")
    assert bench.draft_step_cost(TINY_SHAPE, depths=(2,), prefix=8, reps=1, device="cpu")["packed_linears"] == 0


def test_draft_step_cost_refuses_an_unknown_shape():
    with pytest.raises(FastEagleError, match="unknown shape"):
        bench.draft_step_cost("llama-1t")


def test_budget_curve_replays_every_budget_from_one_decode(tiny):
    encoded = [chat_prompt_ids(tiny, p["text"]) for p in PROMPTS]
    assert len({ids.numel() for ids in encoded}) == len(encoded)
    replies = {ids.numel(): [t for tr in generate(tiny, ids, max_new_tokens=40) for t in tr.tokens] for ids in encoded}
    doc = bench.budget_curve(tiny, OracleDrafter(replies), PROMPTS, (16, 4, 1), max_new=12)
    curve = doc["budget_curve"]
    assert set(curve) == {"chat", "code", "all"} and list(curve["all"]) == ["1", "4", "16"]
    # 1 node: the root alone, the bonus only; 4: the best 3 nodes by path probability are depth 1 (0.6),
    # depth 2 (0.36) and depth 1's sibling (0.3), so 2 drafts + the bonus; 16: all 3 depths + the bonus
    assert all(row == {"1": 1.0, "4": 3.0, "16": 4.0} for row in curve.values())
    assert doc["decoded"]["all"] <= 4.0  # the decode's own tau: its last step cut at 12 tokens
    assert doc["steps"]["all"] == doc["steps"]["chat"] + doc["steps"]["code"]
    about = {"device": "cpu", "target": "tiny", "drafter": "d", "prompts_desc": "2 prompts,"}
    table = bench.markdown_table(doc | about)
    assert "| all (" in table and "| 1 | 4 | 16 | decoded at 16 |" in table


def test_budget_curve_reads_lookups_proposals_step_by_step(tiny):
    """A drafter joined with lookup: each step's lookup nodes are those lookup proposed that step, so the
    replay at the decode's own budget gives back what the decode accepted, step for step."""
    from fasteagle.hybrid import WithLookup

    d = WithLookup(CascadedDrafter(DrafterConfig.for_target(tiny.model, tiny.name, num_layers=3, intermediate=64))
                   .attach(tiny.model).eval(), LookupDrafter())
    doc = bench.budget_curve(tiny, d, PROMPTS, (2, 8), max_new=24)
    decoded = []
    for p in PROMPTS:  # the steps whose trees the length limit did not cut: the last ones may have been
        traces = list(generate(tiny, chat_prompt_ids(tiny, p["text"]), drafter=d, max_new_tokens=24))[1:]
        deepest = max(max(t.tree["depths"]) for t in traces)
        decoded += [len(t.path) for t in traces if 24 - (t.generated - len(t.tokens)) - 1 >= deepest]
    decoded = statistics.fmean(decoded)
    assert decoded > 1.5  # lookup's copies were accepted: the test can tell right lookup nodes from wrong ones
    assert doc["budget_curve"]["all"]["8"] == round(decoded, 3)

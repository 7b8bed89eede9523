"""A recipe of steps measures its drafters with `bench` steps and joins their results with a `compare` step
(`fasteagle.train.compare`): one result file, one table and one chart, each drafter's parameters and training
beside its measurements in our engine and in vLLM."""

from __future__ import annotations

import json

import pytest
import torch

from fasteagle.draftconfig import DrafterConfig
from fasteagle.drafter import CascadedDrafter
from fasteagle.errors import FastEagleError
from fasteagle.peagle import ParallelEagleDrafter
from fasteagle.train import compare
from fasteagle.train import steps as S
from tests.test_bench import PROMPTS


def drafters(tiny, tmp_path) -> dict[str, str]:
    torch.manual_seed(0)
    CascadedDrafter(DrafterConfig.for_target(tiny.model, tiny.name, num_layers=2, intermediate=32)).save(
        tmp_path / "cascade", extra={"training": {"steps": 40, "train_minutes": 1.5, "tokens_trained": 900}})
    cfg = DrafterConfig.for_target(tiny.model, tiny.name, intermediate=32)
    cfg.layout = "eagle3"
    ParallelEagleDrafter(ParallelEagleDrafter.config_for(cfg, 3, mask_token_id=3)).save(
        tmp_path / "peagle", extra={"training": {"steps": 40, "train_minutes": 2.0, "tokens_trained": 900}})
    return {"cascade": str(tmp_path / "cascade"), "peagle": str(tmp_path / "peagle")}


def vllm_sweep(path, folders: dict) -> str:
    """A `bench --engine vllm --repeats` result as it writes one (its batches' per-method summaries), run with
    the compared cascade as `fasteagle`, the shipped equal-training cascade beside it, and the compared peagle."""
    m = {"tokens_per_s": 30.0, "spread": 0.04, "speedup_vs_vanilla": 1.2, "tau": 1.5, "per_position": [0.4, 0.1],
         "identical_to_vanilla": 2, "prompts": 2}
    runs = {b: {"methods": {"vanilla": {"tokens_per_s": 25.0, "speedup_vs_vanilla": 1.0, "prompts": 2},
                            "fasteagle": m, "fasteagle-equal": m | {"tau": 1.4}, "peagle": m | {"tau": 1.3},
                            "ngram": m}} for b in ("1", "8")}
    command = ("python -m fasteagle bench --engine vllm --methods vanilla,fasteagle,fasteagle-equal,peagle,ngram "
               f"--drafter {folders['cascade']} --peagle-drafter {folders['peagle']}")
    path.write_text(json.dumps({"k": 2, "batches": runs, "command": command}))
    return str(path)


def test_bench_results_join_into_one_table_and_chart(tiny, tmp_path, monkeypatch, capsys):
    import fasteagle.target
    from fasteagle.cli import main

    folders = drafters(tiny, tmp_path)
    monkeypatch.setattr(fasteagle.target, "load_target", lambda *a, **k: tiny)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:2]))
    ours = tmp_path / "chain.json"
    assert main(["bench", "--prompts", str(prompts), "--methods", "vanilla,cascade,peagle", "--drafters",
                 f"cascade={folders['cascade']}", "--peagle-drafter", folders["peagle"], "--tree-k", "1",
                 "--tree-budget", "3", "--max-new-tokens", "6", "--repeats", "2", "--device", "cpu",
                 "--out", str(ours)]) == 0
    out = tmp_path / "side.json"
    CascadedDrafter.load(folders["cascade"]).save(  # a second cascade, listed last
        tmp_path / "cascade-b", extra={"training": {"steps": 40, "train_minutes": 1.5, "tokens_trained": 900}})
    compared = folders | {"cascade-b": str(tmp_path / "cascade-b")}
    assert compare.main(["--ours", f"held/chain2={ours}", "--vllm", f"k2={vllm_sweep(tmp_path / 'v.json', folders)}",
                         "--drafters", ",".join(f"{k}={v}" for k, v in compared.items()), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    run = doc["side_by_side"]["held"]["chain2"]
    assert list(run["methods"]) == ["vanilla", "cascade", "peagle"] and run["prompts"] == 2
    assert all(run["methods"][m]["identical_to_vanilla"] == 2 for m in ("cascade", "peagle"))
    assert doc["steps"] == 40 and doc["repeats"] == 2
    facts = doc["drafter_facts"]
    assert facts["peagle"]["kind"] == "peagle" and facts["cascade"]["train_minutes"] == 1.5
    want = sum(p.numel() for k, p in CascadedDrafter.load(folders["cascade"]).state_dict().items() if k != "vocab_ids")
    assert facts["cascade"]["params"] == want
    # each of vLLM's methods under the compared drafter its command decoded with (not the last of its kind); the
    # shipped cascade beside them under its own name, its facts added; ngram is no drafter
    assert set(doc["vllm"]["k2"]["batches"]["8"]) == {"vanilla", "cascade", "fasteagle-equal", "peagle"}
    assert doc["vllm"]["k2"]["batches"]["8"]["fasteagle-equal"]["tau"] == 1.4
    table = (tmp_path / "side.md").read_text()
    shipped = facts["fasteagle-equal"]  # trained in stages: every stage's steps and minutes, no token count
    assert shipped["folder"].endswith("smollm2-135m-fasteagle-equal") and shipped["steps"] == 1050
    assert shipped["tokens_trained"] is None and "| fasteagle-equal | fasteagle | 14.6M | 1050 | – |" in table
    assert "| cascade | fasteagle |" in table and "(fasteagle-equal beside them in vLLM as shipped)" in table
    assert "| k2 | 2 | 8 | peagle | 30.0 ± 4% | 1.20x | 1.30 | 0.40 / 0.25 |" in table  # conditional: 0.1 / 0.4
    assert (tmp_path / "side.html").stat().st_size > 1000
    assert doc["command"].startswith("python -m fasteagle.train.compare --ours held/chain2=")
    step = "python -m fasteagle.train.recipe r.json --out runs/r --stages compare"  # run as a recipe's step
    monkeypatch.setenv("FASTEAGLE_RECIPE_STEP", step)
    assert "snapshot" not in doc  # a result of drafters as they are; --snapshot: of one since changed
    assert compare.main(["--ours", f"held/chain2={ours}", "--drafters", f"cascade={folders['cascade']}",
                         "--out", str(out), "--snapshot", "cascade before its retrain"]) == 0
    assert json.loads(out.read_text())["command"] == step
    assert json.loads(out.read_text())["snapshot"] == "cascade before its retrain"
    capsys.readouterr()
    assert compare.main(["--ours", f"chain2={ours}", "--drafters", f"cascade={folders['cascade']}",
                         "--out", str(out)]) == 2
    assert "PROMPTS/TREE" in capsys.readouterr().err


def test_a_recipe_measures_and_compares_in_steps_checked_before_anything_runs():
    raw = json.loads(open("assets/recipes/single-pass.json").read())
    recipe = S.load("single-pass.json", raw)
    recipe.source, recipe.out = "assets/recipes/single-pass.json", "runs/whole-prompts"
    compare_step = next(s for s in recipe.steps if s.name == "compare")
    assert recipe.step_command(compare_step) == ("python -m fasteagle.train.recipe assets/recipes/single-pass.json "
                                                 "--out runs/whole-prompts --stages compare")
    runs = [s.run for s in recipe.steps]
    assert runs.index("bench") > max(i for i, r in enumerate(runs) if r == "train")  # nothing trains while timed
    assert runs[-1] == "compare"
    bad = [s | {"args": s["args"] + ["--tree", "sideways"]} if s["name"] == "compare-chain3" else s
           for s in raw["steps"]]
    with pytest.raises(FastEagleError, match="invalid choice"):
        S.load("x.json", raw | {"steps": bad})
    late = [s for s in raw["steps"] if s["name"] != "vllm-chain6"]  # the compare step reads its result
    with pytest.raises(FastEagleError, match="made by no earlier step"):
        S.load("x.json", raw | {"steps": late})

"""The equal-training recipe end to end on a tiny target: one distillation that both drafters train
on in the same order, a learning rate tuned per drafter, snapshots at every budget, a bench per
budget, one report; a rerun redoes nothing."""

from __future__ import annotations

import json

import pytest
import torch

from fasteagle.errors import FastEagleError
from fasteagle.train import recipe as recipe_mod
from fasteagle.train.data import build_prompt_ids, save_token_dataset
from tests.conftest import TINY_VOCAB, tiny_tokenizer
from tests.test_bad_inputs import tiny_dir  # noqa: F401


def write_recipe(tmp_path, tiny_dir, **over) -> tuple:  # noqa: F811
    out = tmp_path / "runs"
    g = torch.Generator().manual_seed(0)
    tok = tiny_tokenizer()
    prompts = [" ".join(f"w{int(i)}" for i in torch.randint(4, TINY_VOCAB, (5,), generator=g)) for _ in range(12)]
    ids = [build_prompt_ids(tok, p) for p in prompts]
    save_token_dataset({"input_ids": ids, "loss_mask": [[0] * len(x) for x in ids], "prompt_ids": ids,
                        "ids": [f"p{i}" for i in range(len(ids))]}, out / "prompts.pt")
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps({"id": f"e{i}", "turns": [p]}) + "\n" for i, p in enumerate(prompts[:2])))
    recipe = {
        "prompts": {"chat": 12}, "out": str(out), "written": 3,
        "train": {"target": str(tiny_dir), "device": "cpu", "distill_max_new": 24, "distill_batch": 4,
                  "distill_sample_every": 0, "topk": 8, "micro_batch": 2, "warmup": 2, "epochs": 1000,
                  "checkpoint_every": 100, "intermediate": 64, "keep_prompt": 16},
        "drafters": {"cascade": {"drafter": "fasteagle", "num_layers": 3},
                     "eagle": {"drafter": "eagle3", "depth": 3},
                     "cascade-2": {"drafter": "fasteagle", "num_layers": 2, "budgets": [10]}},
        "pair": ["cascade", "eagle"], "budgets": [10, 20], "tune": {"lr": [0.001, 0.003], "steps": 10},
        "eval": {"prompts": [str(evals)], "limit": 2, "max_new_tokens": 8, "paper_budget": 12,
                 "side_by_side": {"steps": 10, "repeats": 1, "max_new_tokens": 8,
                                  "prompts": {"chat": {"files": [str(evals)], "limit": 2}},
                                  "trees": {"chain": ["--tree-k", "1", "--tree-budget", "4"],
                                            "paper": ["--tree-budget", "12"]},
                                  "result": str(tmp_path / "side.json")}},
        "ship": {"steps": 20, "to": {"cascade": str(tmp_path / "ship" / "fe"), "eagle": str(tmp_path / "ship" / "e3")},
                 "holdout": 3},
    } | over
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(recipe))
    return path, out


def as_written(tokenizer, split, max_len, limit, **_) -> dict:
    """Stands in for ShareGPT's conversations as written (the tiny tokenizer cannot render them)."""
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(4, TINY_VOCAB, (30,), generator=g).tolist() for _ in range(limit)]
    return {"input_ids": seqs, "loss_mask": [[0] * 10 + [1] * 20 for _ in seqs], "prompt_ids": [s[:10] for s in seqs],
            "ids": [f"w{i}" for i in range(limit)]}


def test_recipe_trains_both_drafters_on_the_same_data_and_reports_curves(tmp_path, tiny_dir, capsys,  # noqa: F811
                                                                          monkeypatch):
    from fasteagle.train import data as data_mod

    monkeypatch.setattr(data_mod, "build_token_dataset", as_written)
    path, out = write_recipe(tmp_path, tiny_dir)
    assert recipe_mod.main([str(path), "--report", str(tmp_path / "report.json")]) == 0
    assert sorted(p.name for p in (out / "data" / "features").glob("shard-*.pt"))  # one teacher pass
    assert json.loads((out / "data" / "done.json").read_text())["reply_tokens"] > 0
    assert json.loads((out / "written" / "done.json").read_text())["sequences"] == 3  # ShareGPT as written, beside
    # the same shards in the same order: step n has seen the same tokens whichever drafter trains
    hist = {n: json.loads((out / n / "at-20" / "history.json").read_text()) for n in ("cascade", "eagle")}
    assert [h["tokens"] for h in hist["cascade"]] == [h["tokens"] for h in hist["eagle"]] != []
    tuned = json.loads((out / "tune.json").read_text())
    assert set(tuned) == {"cascade", "eagle"}  # the pair; cascade-2 takes the cascade's
    assert all(set(t["late_loss_by_lr"]) == {"0.001", "0.003"} for t in tuned.values())
    ablation = json.loads((out / "cascade-2" / "at-10" / "config.json").read_text())["training"]
    assert ablation["lr"] == tuned["cascade"]["lr"] and ablation["num_layers"] == 2
    for name in ("cascade", "eagle"):
        info = json.loads((out / name / "at-20" / "config.json").read_text())["training"]
        assert info["steps"] == 20 and info["lr"] == tuned[name]["lr"]
        folders = {str(out / "data" / "features"), str(out / "written" / "features")}
        assert set(info["tokens_per_feature_dir"]) == folders
        assert json.loads((out / name / "at-10" / "config.json").read_text())["training"]["steps"] == 10
    doc = json.loads((tmp_path / "report.json").read_text())
    points = doc["equal_training"]
    assert [p["steps"] for p in points["cascade"]] == [10, 20] and [p["steps"] for p in points["cascade-2"]] == [10]
    for name in ("cascade", "eagle"):
        for p in points[name]:
            assert p["auto_tree"]["tau"] >= 1.0 and p["paper_tree"]["tree_budget"] == 12
            assert p["auto_tree"]["identical"] == 2  # lossless, both prompts
            assert p["auto_tree"]["command"].startswith("python -m fasteagle bench")
    assert points["cascade"][1]["tokens_trained"] == points["eagle"][1]["tokens_trained"] > 0
    for row in doc["head_to_head"]:  # each drafter at the tree where it was fastest against vanilla
        best = {n: max((p[f"{t}_tree"] for t in ("auto", "paper")), key=lambda m: m["speedup_vs_vanilla"])
                for n in ("cascade", "eagle") for p in points[n] if p["steps"] == row["steps"]}
        assert row["speed_ratio"] == pytest.approx(best["cascade"]["speedup_vs_vanilla"]
                                                   / best["eagle"]["speedup_vs_vanilla"])
        assert row["tau_ratio"] == pytest.approx(best["cascade"]["tau"] / best["eagle"]["tau"])
    assert [r["steps"] for r in doc["head_to_head"]] == [10, 20]
    # the report says what the shards hold: the target's replies and the conversations as written
    assert doc["data"]["data"] == json.loads((out / "data" / "done.json").read_text())
    assert doc["data"]["written"]["sequences"] == 3
    table = (tmp_path / "report.md").read_text()
    assert (f"the target's replies to {doc['data']['data']['sequences']} of chat 12 prompts, "
            f"{doc['data']['data']['reply_tokens']} tokens; 3 ShareGPT conversations as written, ") in table
    assert "| cascade | 20 |" in table and "| eagle | 10 |" in table
    assert "cascade over eagle" in table and f"| {doc['head_to_head'][1]['speed_ratio']:.2f}x |" in table
    assert (tmp_path / "report.html").stat().st_size > 1000
    # compare: every drafter at 10 steps in one run per prompt set and tree, under its recipe name
    side = json.loads((tmp_path / "side.json").read_text())
    assert list(side["side_by_side"]["chat"]) == ["chain", "paper"] and side["steps"] == 10
    for tree, nodes in (("chain", 4), ("paper", 12)):
        run = side["side_by_side"]["chat"][tree]
        assert list(run["methods"]) == ["vanilla", "eagle", "cascade", "cascade-2"]
        assert "--drafters cascade-2=" in run["command"] and "--repeats 1" in run["command"]
        for m in ("eagle", "cascade", "cascade-2"):
            measured = run["methods"][m]
            assert measured["identical_to_vanilla"] == 2 and measured["tree_budget"] == nodes
            assert measured["tau"] >= 1.0 and len(measured["depth_acceptance"]) >= 1
            assert len(measured["depth_reached"]) == len(measured["depth_acceptance"])
            assert measured["depth_reached"][0] > 0
            if tree == "chain":  # one token per depth: every node is on the backbone
                assert measured["acceptance_below_side"] is None
    rows = (tmp_path / "side.md").read_text().splitlines()
    assert sum(r.startswith("| chat (2) | chain |") for r in rows) == 3
    assert any(r.startswith("| chat (2) | paper | cascade-2 | 12 |") and "| 2/2 |" in r for r in rows)
    assert (tmp_path / "side.html").stat().st_size > 1000
    # a rerun finds everything on disk: nothing is trained or measured again
    stamp = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.suffix in (".safetensors", ".json", ".pt")}
    capsys.readouterr()
    assert recipe_mod.main([str(path), "--stages", "prompts,data,tune,train,eval,compare"]) == 0
    rerun = capsys.readouterr().out
    assert "eval:" not in rerun and "compare:" not in rerun
    assert stamp == {p: p.stat().st_mtime_ns for p in stamp}
    # a bench the recipe's interruption cut short leaves a partial file: the rerun measures it again
    cut = out / "eval" / "pair-at-10.json"
    cut.write_text(json.dumps(json.loads(cut.read_text()) | {"partial": {"prompts_done": 1, "prompts": 2}}))
    assert recipe_mod.main([str(path), "--stages", "eval"]) == 0
    assert capsys.readouterr().out.count("eval:") == 1 and "partial" not in json.loads(cut.read_text())
    assert not (tmp_path / "ship").exists()  # the default stages leave the repository's drafters alone
    # ship: the pair at one budget, in the form of every shipped drafter (tests/test_docs.py checks that form)
    assert recipe_mod.main([str(path), "--stages", "ship"]) == 0
    for name, folder in (("cascade", "fe"), ("eagle", "e3")):
        dest, snap = tmp_path / "ship" / folder, out / name / "at-20"
        assert {p.name for p in dest.iterdir()} == {"model.safetensors", "config.json", "eval.json",
                                                    "training_log.json", "configs"}
        assert (dest / "model.safetensors").read_bytes() == (snap / "model.safetensors").read_bytes()
        (stage,) = json.loads((dest / "training_log.json").read_text())
        assert stage["training"] == json.loads((snap / "config.json").read_text())["training"]
        assert stage["eval"] == json.loads((dest / "eval.json").read_text())
        assert stage["eval"]["holdout"]["tau_backbone"] >= 1.0 and stage["eval"]["holdout"]["positions"] > 0
        assert stage["configs"] == {"train.json": json.loads((dest / "configs" / "train.json").read_text())}
        assert stage["configs"]["train.json"]["lr"] == tuned[name]["lr"] and stage["data"] == doc["data"]
        assert stage["history"] == json.loads((snap / "history.json").read_text())
    assert (out / "holdout_distilled.pt").exists()  # the target answered the holdout once, for both
    # another recipe on this one's data (data_from): a seeded half of its shards beside all, no EAGLE-3 pair
    raw = json.loads(path.read_text())
    raw |= {"out": str(tmp_path / "scaling"), "data_from": str(out), "tune": {}, "ship": {}, "budgets": [5],
            "drafters": {"all": {"drafter": "fasteagle", "num_layers": 2},
                         "half": {"drafter": "fasteagle", "num_layers": 2, "shard_fraction": 0.5},
                         "quarter": {"drafter": "fasteagle", "num_layers": 2, "shard_fraction": 0.25}},
            "pair": ["all", "half"]}
    raw["eval"]["side_by_side"] |= {"steps": 5, "trees": {"chain": ["--tree-k", "1", "--tree-budget", "3"]},
                                    "result": str(tmp_path / "scaling.json")}
    (tmp_path / "scaling-recipe.json").write_text(json.dumps(raw))
    capsys.readouterr()
    assert recipe_mod.main([str(tmp_path / "scaling-recipe.json"), "--stages", "prompts,data,train,compare",
                            "--drafters", "all,half"]) == 0
    assert "left out: quarter" in capsys.readouterr().out  # a run cut short compares what it has, and says so
    assert not (tmp_path / "scaling" / "data").exists() and not (tmp_path / "scaling" / "prompts.pt").exists()
    tokens = {n: json.loads((tmp_path / "scaling" / n / "at-5" / "config.json").read_text())["training"]
              ["tokens_per_feature_dir"] for n in ("all", "half")}
    data_dir = str(out / "data" / "features")
    assert tokens["all"][data_dir] == doc["data"]["data"]["reply_tokens"] > tokens["half"][data_dir] > 0
    run = json.loads((tmp_path / "scaling.json").read_text())["side_by_side"]["chat"]["chain"]
    assert list(run["methods"]) == ["vanilla", "all", "half"] and "--eagle3-drafter" not in run["command"]
    assert set(json.loads((tmp_path / "scaling.json").read_text())["drafters"]) == {"all", "half"}
    # once the last one is saved, the compare stage measures all three side by side again
    assert recipe_mod.main([str(tmp_path / "scaling-recipe.json"), "--stages", "train,compare"]) == 0
    run = json.loads((tmp_path / "scaling.json").read_text())["side_by_side"]["chat"]["chain"]
    assert list(run["methods"]) == ["vanilla", "all", "half", "quarter"]


@pytest.mark.parametrize("change, word", [
    ({"pair": ["cascade"]}, "pair must name two"),
    ({"prompts": {"poetry": 3}}, "unknown prompt source 'poetry'"),
    ({"budgets": []}, "budgets must be"),
    ({"drafters": {"cascade": {"drafter": "lstm"}, "eagle": {}}}, "drafter"),
    ({"drafters": {"cascade": {"num_layers": 0}, "eagle": {}}}, "num_layers"),
    ({"ship": {"steps": 15, "to": {"cascade": "x"}}}, "ship needs steps"),
    ({"ship": {"steps": 20, "to": {"lstm": "x"}}}, "ship needs steps"),
    ({"eval": {"side_by_side": {"steps": 15, "prompts": {"a": {"files": ["x"]}}, "trees": {"t": []}}}},
     "steps must be one of the budgets"),
    ({"eval": {"side_by_side": {"steps": 10, "prompts": {"a": {"files": ["x"]}}, "trees": {}}}}, "trees must name"),
    ({"eval": {"side_by_side": {"steps": 10, "prompts": {"A b": {"files": ["x"]}}, "trees": {"t": []}}}},
     "label 'A b'"),
    ({"eval": {"side_by_side": {"steps": 10, "prompts": {"a": {}}, "trees": {"t": []}}}}, "needs files"),
    ({"eval": {"side_by_side": {"step": 10}}}, "unknown setting 'step'"),
    ({"eval": {"side_by_side": {"steps": 20, "prompts": {"a": {"files": ["x"]}}, "trees": {"t": []}}}},
     "steps must be one of the budgets"),  # cascade-2 is saved at 10 steps only
    ({"eval": {"side_by_side": ["chain"]}}, "must be an object"),
])
def test_a_bad_recipe_is_refused_before_anything_loads(tmp_path, tiny_dir, change, word, capsys):  # noqa: F811
    path, _ = write_recipe(tmp_path, tiny_dir, **change)
    with pytest.raises(FastEagleError, match=word):
        recipe_mod.load(path)
    assert recipe_mod.main([str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and word.split()[0] in err[0]


def test_shipping_needs_a_ship_section(tmp_path, tiny_dir, capsys):  # noqa: F811
    path, _ = write_recipe(tmp_path, tiny_dir, ship={})
    assert recipe_mod.main([str(path), "--stages", "ship"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: this recipe has no ship section: nothing to ship (see "
                   "assets/recipes/equal-training.json)"]


def test_training_on_another_recipes_data_needs_its_data_stage_done(tmp_path, tiny_dir, capsys):  # noqa: F811
    path, _ = write_recipe(tmp_path, tiny_dir, data_from=str(tmp_path / "nowhere"))
    assert recipe_mod.main([str(path), "--stages", "train"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no finished data stage" in err[0]


def test_drafters_narrows_tuning_training_and_shipping_to_the_named_ones(tmp_path, tiny_dir, capsys,  # noqa: F811
                                                                         monkeypatch):
    """`--drafters cascade`: one drafter tuned, trained and shipped (say, retrained with a new switch) while
    the recipe's others are left as they are; a name the recipe lacks is refused in one line."""
    from fasteagle.train import data as data_mod

    monkeypatch.setattr(data_mod, "build_token_dataset", as_written)
    path, out = write_recipe(tmp_path, tiny_dir, budgets=[10], tune={"lr": [0.003], "steps": 4},
                             ship={"steps": 10, "to": {"cascade": str(tmp_path / "ship" / "fe"),
                                                       "eagle": str(tmp_path / "ship" / "e3")}, "holdout": 2})
    raw = json.loads(path.read_text())
    raw["eval"].pop("side_by_side")
    path.write_text(json.dumps(raw))
    assert recipe_mod.main([str(path), "--stages", "prompts,data,tune,train,ship", "--drafters", "cascade"]) == 0
    assert (out / "cascade" / "at-10" / "config.json").exists()
    assert not (out / "eagle").exists() and not (out / "cascade-2").exists()
    assert set(json.loads((out / "tune.json").read_text())) == {"cascade"}
    assert (tmp_path / "ship" / "fe" / "model.safetensors").exists() and not (tmp_path / "ship" / "e3").exists()
    capsys.readouterr()
    assert recipe_mod.main([str(path), "--stages", "train", "--drafters", "cascade,lstm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--drafters takes the recipe's drafters" in err[0] and "'lstm'" in err[0]

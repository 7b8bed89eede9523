"""The benchmark harness on the tiny target: every method runs, summaries are consistent, the
lossless check counts identical outputs, tables, charts and the docs' result blocks are drawn again."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest

from fasteagle import bench
from fasteagle.drafter import CascadedDrafter, DrafterConfig
from fasteagle.errors import FastEagleError
from fasteagle.generate import chat_prompt_ids
from fasteagle.lookup import LookupDrafter
from fasteagle.verify import SamplingParams

PROMPTS = [{"id": "a", "category": "chat", "text": "w10 w11 w12 w13"},
           {"id": "b", "category": "code", "text": "w40 w41 w40 w41 w40"}]


def test_load_prompts_accepts_turns_prompt_and_text(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"turns": ["first", "second"], "category": "x"}\n{"prompt": "p"}\n\n{"text": "t", "id": "9"}\n')
    rows = bench.load_prompts(f)
    assert [r["text"] for r in rows] == ["first", "p", "t"]
    assert rows[0]["category"] == "x" and rows[1]["category"] == "p" and rows[2]["id"] == "9"
    assert [r["text"] for r in bench.load_prompts(f, limit=1)] == ["first", "p"]  # the first of each category


def test_limit_takes_the_first_prompts_of_each_category(tmp_path):
    f = tmp_path / "tasks.jsonl"
    f.write_text("".join(json.dumps({"id": f"{c}{i}", "category": c, "turns": [f"{c} {i}"]}) + "\n"
                         for c in ("chat", "math", "rag") for i in range(4)))
    rows = bench.load_prompts(f, limit=2)
    assert [r["id"] for r in rows] == ["chat0", "chat1", "math0", "math1", "rag0", "rag1"]
    spare = bench.tuning_prompts([str(f)], limit=2, n=3)
    assert not {r["id"] for r in spare} & {r["id"] for r in rows}  # --tree auto tunes on prompts not measured
    picked = bench.load_prompts(f, limit=1, skip=2)  # --skip: for choosing on prompts --limit 2 never measures
    assert [r["id"] for r in picked] == ["chat2", "math2", "rag2"]
    assert [r["id"] for r in bench.load_prompts(f, skip=3)] == ["chat3", "math3", "rag3"]
    with pytest.raises(FastEagleError, match="--skip 4 leaves no prompts"):
        bench.load_prompts(f, skip=4)


@pytest.mark.parametrize("content,fragment", [
    ('{"turns": []}\n', ":1: no prompt"), ('{"prompt": "a"}\n{"category": "x"}\n', ":2: no prompt"),
    ("not json\n", ":1: not JSON"), ("\n\n", "holds no prompts"), ('["a list"]\n', ":1: no prompt")])
def test_bad_prompt_files_are_one_line_errors_naming_the_line(tmp_path, content, fragment):
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    with pytest.raises(FastEagleError, match=fragment):
        bench.load_prompts(f)


def test_auto_tree_tunes_on_prompts_outside_the_measured_ones(tmp_path):
    chat, code = tmp_path / "chat.jsonl", tmp_path / "code.jsonl"
    chat.write_text("".join(f'{{"prompt": "c{i}", "id": "c{i}"}}\n' for i in range(5)))
    code.write_text("".join(f'{{"prompt": "k{i}", "id": "k{i}"}}\n' for i in range(4)))
    ids = [p["id"] for p in bench.tuning_prompts([str(chat), str(code)], 2)]
    assert ids == ["c2", "k2", "c3"]  # past each file's limit, the files taking turns
    assert [p["id"] for p in bench.tuning_prompts([str(chat)], 4)] == ["c0", "c1", "c2"]  # one spare: measured ones
    assert [p["id"] for p in bench.tuning_prompts([str(chat)], None)] == ["c0", "c1", "c2"]


def test_a_bad_limit_or_missing_file_is_refused(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n')
    with pytest.raises(FastEagleError, match="--limit"):
        bench.load_prompts(f, limit=-1)
    with pytest.raises(FastEagleError, match="cannot read"):
        bench.load_prompts(tmp_path / "nope.jsonl")


@pytest.mark.parametrize("engine", [[], ["--engine", "vllm", "--step-costs", "s.json"]])
def test_repeats_below_one_are_refused_in_one_line_by_either_engine(engine, capsys):
    from fasteagle.cli import main

    assert main(["bench", "--repeats", "0", *engine]) == 2
    assert capsys.readouterr().err.strip().endswith("--repeats must be at least 1")


def test_depth_acceptance_is_null_where_no_step_reached_a_depth():
    row = {"tokens": [1, 2], "wall_s": 1.0, "forwards": 1, "steps": 1, "draft_ms": 1.0, "verify_ms": 1.0,
           "accepted_lengths": [2], "depth_reached": [3, 1, 0], "depth_accepted": [2, 1, 0], "peak_mb": None}
    summary = bench.summarize({"lookup": [row, row]}, SamplingParams())["lookup"]
    assert summary["depth_acceptance"] == [0.667, 1.0, None] and summary["depth_reached"] == [6, 2, 0]


def test_side_by_side_tables_leave_out_depths_judged_too_rarely_to_say_anything():
    judged = bench.reports.judged_depths
    few = bench.reports.MIN_JUDGED - 1
    summary = {"depth_acceptance": [0.5, 0.25, 1.0, None], "depth_reached": [400, 40, few, 0]}
    assert judged(summary) == [0.5, 0.25, None, None] and bench.reports._depths(summary) == "0.50, 0.25"
    assert judged({"depth_acceptance": [0.5, 1.0]}) == [0.5, 1.0]  # counts unknown (older files): all shown


def test_ms_per_step_weighs_every_step_and_skips_prompts_without_one():
    rows = [{"steps": 0, "draft_ms": 0.0, "verify_ms": 0.0}, {"steps": 3, "draft_ms": 2.0, "verify_ms": 9.0},
            {"steps": 1, "draft_ms": 6.0, "verify_ms": 5.0}]
    per_step = bench.reports._per_step
    assert per_step(rows, "draft_ms") == 3.0 and per_step(rows, "verify_ms") == 8.0


def test_methods_take_turns_going_first_and_warm_up_past_stop_tokens(tiny, monkeypatch):
    calls = []

    def fake(target, ids, method, drafter, max_new, sampling, seed, stop=True, replay=False):
        calls.append((method, max_new, stop))
        return {"tokens": [1], "wall_s": 1.0, "forwards": 0, "steps": 0, "draft_ms": 0.0, "verify_ms": 0.0,
                "accepted_lengths": [], "depth_reached": [], "depth_accepted": [], "peak_mb": None}

    monkeypatch.setattr(bench.timing, "time_one", fake)
    bench.compare(tiny, {"vanilla": None, "lookup": None, "hf-generate": None}, PROMPTS * 2, max_new=12)
    assert calls[:3] == [("vanilla", 12, False), ("lookup", 12, False), ("hf-generate", 12, False)]
    firsts = [calls[3 + 3 * i][0] for i in range(4)]
    assert firsts == ["vanilla", "lookup", "hf-generate", "vanilla"] and all(c[2] for c in calls[3:])


def test_warmup_without_stops_decodes_every_token(tiny):
    ids = chat_prompt_ids(tiny, "w10 w11")
    for method in ("vanilla", "hf-generate"):
        r = bench.time_one(tiny, ids, method, None, 9, SamplingParams(), 0, stop=False)
        assert len(r["tokens"]) == 9


@pytest.fixture(scope="module")
def doc(tiny):
    methods = {"vanilla": None, "hf-generate": None, "lookup": LookupDrafter()}
    rows = bench.compare(tiny, methods, PROMPTS, max_new=12)
    return bench.result_document(tiny, rows, {"max_new_tokens": 12, "temperature": 0.0})


def test_every_method_is_summarised(doc):
    m = doc["methods"]
    assert set(m) == {"vanilla", "hf-generate", "lookup"}
    assert m["vanilla"]["speedup_vs_vanilla"] == 1.0 and m["vanilla"]["speedup_vs_vanilla_median"] == 1.0
    rows = doc["rows"]
    per_prompt = [(r["n"] / r["wall_s"]) / (v["n"] / v["wall_s"]) for r, v in zip(rows["lookup"], rows["vanilla"])]
    assert m["lookup"]["speedup_vs_vanilla_median"] == round(statistics.median(per_prompt), 3)
    assert m["vanilla"]["tau"] == 1.0  # one token per forward without a drafter
    # lookup's copies were accepted (the code prompt repeats itself), and its tau is the mean accepted length
    lengths = [n for r in rows["lookup"] for n in r["accepted_lengths"]]
    assert m["lookup"]["tau"] > 1.2 and m["lookup"]["tau"] == pytest.approx(statistics.fmean(lengths), abs=1e-3)
    assert sum(m["lookup"]["accepted_length_histogram"]) == len(lengths) == sum(r["forwards"] for r in rows["lookup"])
    assert len(m["lookup"]["depth_acceptance"]) > 1 and 0 < m["lookup"]["depth_acceptance"][0] <= 1
    assert "tau" not in m["hf-generate"]
    assert set(doc["per_category"]) == {"chat", "code"}


def test_each_request_is_split_into_prefill_and_decode(doc):
    m = doc["methods"]
    assert "prefill_s" not in m["hf-generate"]  # generate's prefill is not seen from outside
    for name in ("vanilla", "lookup"):  # the tokens after the prefill's over the time after it, pooled
        rows = doc["rows"][name]
        want = sum(r["n"] - 1 for r in rows) / sum(r["wall_s"] - r["prefill_ms"] / 1e3 for r in rows)
        # (the tiny target's prefill costs about one step, so its decode alone is not faster than the request)
        assert m[name]["prefill_s"] > 0 and m[name]["decode_tokens_per_s"] == pytest.approx(want, rel=1e-2)
    assert m["vanilla"]["drafter_prefill_s"] < 0.01 and m["vanilla"]["decode_speedup_vs_vanilla"] == 1.0
    assert "Each request split" in bench.markdown_table(doc)


def test_lossless_check_counts_identical_outputs(doc):
    # our loop, HF generate and lookup all decode greedily: all must match vanilla
    for name in ("hf-generate", "lookup"):
        assert doc["methods"][name]["identical_to_vanilla"] == len(PROMPTS)


def test_results_match_replies_against_another_result(doc, tmp_path, capsys):
    """Each row keeps a digest of its reply, so a second run (bf16 against fp32, another machine) says
    how many of its replies are the first run's vanilla ones, prompt by prompt, without storing them."""
    import copy

    from fasteagle.cli import main

    assert all(len(r["reply"]) == 16 for rs in doc["rows"].values() for r in rs)
    for name in ("hf-generate", "lookup"):  # greedy and lossless: vanilla's replies, digest for digest
        assert [r["reply"] for r in doc["rows"][name]] == [r["reply"] for r in doc["rows"]["vanilla"]]
    assert bench.reply_digest([1, 2, 3]) != bench.reply_digest([1, 2, 4])
    other = copy.deepcopy(doc)
    other["rows"]["lookup"][0]["reply"] = bench.reply_digest([9])
    del other["rows"]["hf-generate"][1]["reply"]  # a row without one is not compared
    match = bench.reply_match(doc, other)
    assert match == {"vanilla": {"same": 2, "compared": 2}, "hf-generate": {"same": 1, "compared": 1},
                     "lookup": {"same": 1, "compared": 2}}
    table = bench.markdown_table(other | {"reference": {"file": "fp32.json", "dtype": "torch.float32",
                                                        "replies": match}})
    assert "Replies equal to vanilla's in `fp32.json` (torch.float32), prompt by prompt: vanilla 2/2, " \
           "hf-generate 1/1, lookup 1/2." in table
    # a reference without digests (an older result) is refused in one line, before any model loads
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"rows": {"vanilla": [{"id": "a", "n": 3}]}}))
    assert main(["bench", "--prompts", "assets/prompts/sharegpt_holdout.jsonl", "--reference", str(old)]) == 2
    assert "holds no vanilla replies to match" in capsys.readouterr().err


def test_summary_detects_a_different_output():
    row = {"tokens": [1, 2, 3], "wall_s": 1.0, "forwards": 2, "draft_ms": 0.0, "verify_ms": 1.0,
           "accepted_lengths": [1, 2], "depth_reached": [1], "depth_accepted": [1], "peak_mb": None,
           "category": "c"}
    rows = {"vanilla": [row], "other": [row | {"tokens": [1, 2, 4]}]}
    s = bench.summarize(rows, SamplingParams())
    assert s["other"]["identical_to_vanilla"] == 0 and s["vanilla"]["identical_to_vanilla"] == 1
    assert s["other"]["accepted_length_histogram"] == [1, 1]


def test_markdown_charts_and_docs(doc, tmp_path):
    table = bench.markdown_table(doc)
    assert "| lookup |" in table and "| hf-generate |" in table
    assert "--full-vocab" not in table
    assert f"the depths judged at least {bench.reports.MIN_JUDGED} times" in table  # rarer ones are left out
    wide = doc | {"settings": doc["settings"] | {"full_vocab": True}}
    assert "drafting over the whole vocabulary (--full-vocab)" in bench.markdown_table(wide).splitlines()[0]
    # one row per category, one cell per method
    cat_rows = [line for line in table.splitlines() if line.startswith(("| chat |", "| code |"))]
    assert len(cat_rows) == 2 and all(row.count("|") == len(doc["methods"]) + 2 for row in cat_rows)
    out = tmp_path / "r.json"
    out.write_text(json.dumps(doc | {"command": "python -m fasteagle bench --limit 1"}))
    bench.charts(doc, tmp_path / "r.html")
    assert "plotly" in (tmp_path / "r.html").read_text().lower()
    assert "--tree auto" not in (tmp_path / "r.html").read_text()
    assert "speedup vs vanilla, prompt by prompt" in (tmp_path / "r.html").read_text()
    auto = copy.deepcopy(doc)
    auto["settings"]["tree_auto"] = {"fasteagle": {"budget": 8, "speedup_vs_decode_step": {"4": 1.1, "8": 1.25}}}
    bench.charts(auto, tmp_path / "auto.html")
    assert "--tree auto: expected speedup vs budget" in (tmp_path / "auto.html").read_text()
    assert "fasteagle (picked 8)" in (tmp_path / "auto.html").read_text()
    (tmp_path / "r.html").unlink()
    (tmp_path / "r.md").write_text("stale")
    bench.redraw(out)  # the table and the charts again, from the JSON alone
    assert (tmp_path / "r.md").read_text() == table and (tmp_path / "r.html").exists()
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- result: r.json -->\nold\n<!-- /result -->\nmiddle\n"
                      "<!-- result: r.json -->\n<!-- /result -->\nbottom\n")
    assert bench.update_docs([readme]) == [readme]
    assert bench.update_docs([readme]) == []  # nothing changed: nothing written
    text = readme.read_text()
    assert "\nold\n" not in text and text.count("| lookup |") == 2 * table.count("| lookup |")
    assert text.startswith("top") and text.endswith("bottom\n")
    assert "middle" in text and text.count("<!-- result: r.json -->") == 2  # blocks stay where they were
    assert "from [`r.json`](r.json), made by `python -m fasteagle bench --limit 1`" in text  # each cites its command
    assert bench.render_docs([readme]) == {readme: text}  # drawn again, the same text


def test_redraw_draws_a_vllm_batch_sweep_chart_too(tmp_path):
    """`--redraw` draws every kind's charts as the measuring command wrote them: a vLLM batch sweep's
    (no `rows`, a block per batch size) included."""
    name = "cpu-smollm2-135m-vllm-batches-2026-11-28"
    results = Path(__file__).parents[1] / "bench" / "results"
    (tmp_path / f"{name}.json").write_text((results / f"{name}.json").read_text())
    bench.redraw(tmp_path / f"{name}.json")
    assert (tmp_path / f"{name}.html").read_text() == (results / f"{name}.html").read_text()


def test_the_table_notes_sampling_and_shows_peak_memory_where_measured(doc):
    assert "peak MB" not in bench.markdown_table(doc) and "Sampling" not in bench.markdown_table(doc)
    sampled = copy.deepcopy(doc)
    sampled["settings"]["temperature"] = 0.7
    for m in sampled["methods"].values():
        m["peak_mb"] = 812.4
    table = bench.markdown_table(sampled)
    assert "| peak MB |" in table and "| 812 |" in table and "not compared with vanilla" in table


def test_per_prompt_speedups_pair_each_prompt_with_its_vanilla_run():
    row = {"category": "chat", "accepted_lengths": [], "forwards": 3}
    doc = {"rows": {"vanilla": [row | {"id": "a", "wall_s": 2.0}, row | {"id": "b", "wall_s": 1.0}],
                    "fasteagle": [row | {"id": "a", "wall_s": 1.0, "accepted_lengths": [3, 1]},
                                  row | {"id": "b", "wall_s": 2.0, "accepted_lengths": [1]}],
                    "hf-generate": [row | {"id": "a", "wall_s": 4.0}, row | {"id": "b", "wall_s": 1.0}]}}
    got = bench.per_prompt(doc)
    assert set(got) == {"fasteagle", "hf-generate"}
    assert [(r["id"], r["speedup"], r["tau"]) for r in got["fasteagle"]] == [("a", 2.0, 2.0), ("b", 0.5, 1.0)]
    assert [r["tau"] for r in got["hf-generate"]] == [None, None]
    assert bench.per_prompt({"rows": {"fasteagle": doc["rows"]["fasteagle"]}}) == {}  # no vanilla, no ratios
    sampled = {"rows": {"vanilla": [row | {"id": "a", "wall_s": 2.0, "n": 40}],
                        "fasteagle": [row | {"id": "a", "wall_s": 1.0, "n": 10}]}}  # a shorter sample
    assert bench.per_prompt(sampled)["fasteagle"][0]["speedup"] == 0.5


def test_results_name_the_drafters_they_measured(tiny, tmp_path):
    """A result says which trained drafter it timed, so a retrained drafter never hides behind old numbers."""
    from types import SimpleNamespace

    from fasteagle.cli import make_drafter
    from fasteagle.eagle3 import AutoregressiveDrafter

    fe = CascadedDrafter(DrafterConfig.for_target(tiny.model, tiny.name, num_layers=2, intermediate=64))
    fe.save(tmp_path / "fe", extra={"training": {"steps": 7, "steps_all": 30, "train_minutes": 1.5,
                                                 "train_minutes_all": 4.0}, "holdout": {"tau_backbone": 1.9}})
    e3_cfg = AutoregressiveDrafter.config_for(DrafterConfig.for_target(tiny.model, tiny.name, intermediate=64), 3)
    AutoregressiveDrafter(e3_cfg).save(tmp_path / "e3", extra={"training": {"steps": 5, "train_minutes": 2.0}})
    args = SimpleNamespace(drafter=str(tmp_path / "fe"), eagle3_drafter=str(tmp_path / "e3"), tree_k="4",
                           tree_budget=8)
    methods = {"vanilla": None, "fasteagle": make_drafter("fasteagle", tiny, args),
               "eagle3": make_drafter("eagle3", tiny, args)}  # each method reads its own directory
    drafters = {m: bench.drafter_summary(d) for m, d in methods.items() if d is not None}
    assert drafters["fasteagle"]["path"] == str(tmp_path / "fe") and drafters["fasteagle"]["steps"] == 30
    assert drafters["fasteagle"]["train_minutes"] == 4.0 and drafters["fasteagle"]["holdout_tau_backbone"] == 1.9
    assert drafters["eagle3"]["path"] == str(tmp_path / "e3") and drafters["eagle3"]["steps"] == 5
    rows = bench.compare(tiny, methods, PROMPTS[:1], max_new=6)
    doc = bench.result_document(tiny, rows, {"max_new_tokens": 6, "temperature": 0.0, "drafters": drafters})
    head = bench.markdown_table(doc).splitlines()[0]
    vocab = methods["fasteagle"].vocab_ids.numel()
    assert f"fasteagle drafter `{tmp_path / 'fe'}` (30 steps, 4.0 min, drafting over {vocab} tokens)" in head
    assert "eagle3 drafter" in head


def interrupt_on_call(n: int, real):
    """`real` (bench's time_one) that raises KeyboardInterrupt on its n-th call; `.calls` counts them
    (a test may refill it to move the interrupt)."""
    def timed(*a, **k):
        timed.calls.append(1)
        if len(timed.calls) == n:
            raise KeyboardInterrupt
        return real(*a, **k)

    timed.calls = []
    return timed


def test_a_bench_cut_short_keeps_the_prompts_it_finished(tiny, tmp_path, monkeypatch):
    """A run killed by a time limit (a GPU loan's, or Ctrl-C) leaves a result JSON of the prompts
    it finished, marked partial; a whole run leaves the plain document."""
    import fasteagle.target
    from fasteagle.cli import main

    monkeypatch.setattr(fasteagle.target, "load_target", lambda *a, **k: tiny)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS + [PROMPTS[0] | {"id": "c"}]))
    out = tmp_path / "r.json"
    argv = ["bench", "--prompts", str(prompts), "--methods", "vanilla,lookup", "--max-new-tokens", "6",
            "--device", "cpu", "--out", str(out)]
    real = bench.time_one
    # 2 warmup runs, 2 for the first prompt, then the second prompt
    monkeypatch.setattr(bench.timing, "time_one", interrupt_on_call(5, real))
    assert main(argv) == 130
    doc = json.loads(out.read_text())
    assert doc["partial"] == {"prompts_done": 1, "prompts": 3}
    assert doc["methods"]["lookup"]["prompts"] == 1 and doc["methods"]["lookup"]["identical_to_vanilla"] == 1
    assert bench.markdown_table(doc).startswith("**Partial: the run stopped after 1 of 3 prompts.**")
    monkeypatch.setattr(bench.timing, "time_one", real)
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert "partial" not in doc and doc["methods"]["vanilla"]["prompts"] == 3
    assert not bench.markdown_table(doc).startswith("**Partial") and not list(tmp_path.glob("*.tmp"))


def test_drafters_under_their_own_labels_run_side_by_side(tiny, tmp_path, monkeypatch, capsys):
    """`--drafters a=DIR,b=DIR`: several trained drafters (variants of one kind, or of two) timed in one run, each
    a method of its label, decoded as the kind its folder holds, named in the result by its folder; a bad pair, a
    label taken by a method, or a folder with no drafter is refused in one line before anything loads."""
    import fasteagle.target
    from fasteagle.cli import main
    from fasteagle.eagle3 import AutoregressiveDrafter

    CascadedDrafter(DrafterConfig.for_target(tiny.model, tiny.name, num_layers=2, intermediate=32)).save(tmp_path / "a")
    e3 = AutoregressiveDrafter.config_for(DrafterConfig.for_target(tiny.model, tiny.name, intermediate=32), 3)
    AutoregressiveDrafter(e3).save(tmp_path / "b")
    monkeypatch.setattr(fasteagle.target, "load_target", lambda *a, **k: tiny)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(PROMPTS[0]) + "\n")
    out = tmp_path / "r.json"
    named = f"wide={tmp_path / 'a'},e3var={tmp_path / 'b'}"
    argv = ["bench", "--prompts", str(prompts), "--methods", "wide,e3var", "--drafters", named, "--max-new-tokens",
            "6", "--tree-budget", "4", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert list(doc["methods"]) == ["vanilla", "wide", "e3var"]
    assert all(doc["methods"][m]["identical_to_vanilla"] == 1 for m in ("wide", "e3var"))
    assert doc["settings"]["drafters"]["wide"]["path"] == str(tmp_path / "a")
    assert doc["settings"]["drafters"]["e3var"]["path"] == str(tmp_path / "b")
    for bad, says in ((f"wide{tmp_path / 'a'}", "LABEL=FOLDER"), (f"eagle3={tmp_path / 'a'}", "already a method"),
                      (f"x={tmp_path / 'none'}", "no trained drafter")):
        capsys.readouterr()
        assert main(["bench", "--prompts", str(prompts), "--methods", "x", "--drafters", bad]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1


def test_repeats_time_each_prompt_several_times_in_turn_and_give_the_spread(tiny):
    """`--repeats R`: every method decodes each prompt R times, methods in turn; a row keeps the median wall
    time and every run's, the summary the pooled tokens/s of each run and their spread; the table says so."""
    methods = {"vanilla": None, "lookup": LookupDrafter()}
    rows = bench.compare(tiny, methods, PROMPTS[:2], max_new=6, repeats=3)
    for rs in rows.values():
        assert len(rs) == 2 and all(len(r["wall_s_runs"]) == 3 for r in rs)
        assert all(r["wall_s"] == sorted(r["wall_s_runs"])[1] for r in rs)
    doc = bench.result_document(tiny, rows, {"max_new_tokens": 6, "temperature": 0.0})
    for m in doc["methods"].values():
        runs = m["tokens_per_s_runs"]
        slack = 0.0005 + 0.01 / sorted(runs)[1]  # the runs are rounded to 0.01 tokens/s, the spread to 0.001
        assert len(runs) == 3 and m["spread"] == pytest.approx((max(runs) - min(runs)) / sorted(runs)[1], abs=slack)
    assert doc["methods"]["lookup"]["identical_to_vanilla"] == 2
    assert "Each prompt decoded 3 times by every method in turn" in bench.markdown_table(doc)
    once = bench.result_document(tiny, bench.compare(tiny, methods, PROMPTS[:1], max_new=6), {"max_new_tokens": 6})
    assert "spread" not in once["methods"]["vanilla"] and "decoded" not in bench.markdown_table(once)

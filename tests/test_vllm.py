"""vLLM as the reference for our drafters: the shipped EAGLE-3-style drafter, exported to the EAGLE-3 format,
runs in stock vLLM, and the equal cascade, exported for our plugin, runs in vLLM's EAGLE-3 path in parallel-
drafting mode (`fasteagle.vllm_cascade`); each also runs in our engine, on held-out prompts, greedy, drafting a
chain of 3 tokens. Both engines' outputs equal vLLM's plain decoding, and they accept the same share at each
chain position.

Skipped where vLLM is not installed (requirements-vllm.txt); CI installs it. The tolerance, measured: on 20
held-out prompts of 64 tokens (bench/results/cpu-smollm2-135m-vllm-engines-2026-11-29.json) the engines'
tau were within 2% (EAGLE-3 1.264 and 1.257, the equal cascade 1.304 and 1.299, the shipped one 1.788 and
1.757) and their per-position rates within 0.012 (vLLM's CPU kernels sum in another
order than ours, so a near-tie in the draft's argmax can fall the other way now and then); 0.03 per
position and 3% on tau leave room for that and nothing more.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from fasteagle.bench import load_prompts  # noqa: E402
from fasteagle.bench.serving import compare_engines  # noqa: E402
from fasteagle.errors import FastEagleError  # noqa: E402
from fasteagle.methods import Settings  # noqa: E402
from tests.test_repo import ROOT  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
PROMPTS, TOKENS, K = 8, 48, 3


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return tmp_path_factory.mktemp("vllm-traces")


@pytest.fixture(scope="module")
def engines(smollm, traces):
    texts = [p["text"] for p in load_prompts(ROOT / "assets" / "prompts" / "sharegpt_holdout.jsonl", PROMPTS)]
    return compare_engines(smollm, Settings(), ["vanilla", "eagle3", "fasteagle-equal"], texts, K, TOKENS, [1],
                           None, traces)["methods"]


def test_both_engines_write_what_plain_decoding_writes(engines):
    for method, by_engine in engines.items():
        for engine, row in by_engine.items():
            assert row["identical"] == PROMPTS, f"{method} in {engine}"


def test_a_cascade_with_eagle31_norms_drafts_in_vllm_what_it_drafts_in_ours(smollm, tmp_path):
    """The shipped cascade given EAGLE 3.1's norms runs in vLLM's one forward as in ours: same outputs, same
    acceptance at each chain position. `fc_norm` normalizes each target feature (weights: its typical RMS) and
    `norm_output` passes each layer's normed output on (depth norms scaled by the layer's typical RMS: the same
    argmax at every head), so it still accepts at depths 1 and 2; an engine that skipped either would not."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from fasteagle.drafter import CascadedDrafter
    from fasteagle.methods import DEFAULT_DRAFTER

    folder = tmp_path / "normed"
    shutil.copytree(DEFAULT_DRAFTER, folder)
    d = CascadedDrafter.load(folder, smollm.model).float()
    text = "The lighthouse keeper read the message twice, then she wrote back to the stranger who had sent it."
    ids = smollm.tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        hs = smollm.model(input_ids=ids, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i] for i in d.cfg.feature_layers], -1)
        outs = d.hidden(feats[:, :-1], ids[:, 1:], torch.arange(ids.shape[1] - 1)[None])

    def typical(x):  # the median row RMS past the first position (whose hidden states are outliers)
        return float(x[0, 1:].pow(2).mean(-1).sqrt().median())

    cfg = json.loads((folder / "config.json").read_text()) | {"fc_norm": True, "norm_output": True}
    (folder / "config.json").write_text(json.dumps(cfg))
    state = load_file(folder / "model.safetensors")
    for i, layer in enumerate(cfg["feature_layers"]):
        state[f"fc_norm.{i}.weight"] = torch.full((cfg["target_hidden"],), typical(hs[layer]))
    for i, h in enumerate(outs[:-1]):
        state[f"norms.{i}.weight"] = (state[f"norms.{i}.weight"].float() * typical(h)).to(state[f"norms.{i}.weight"])
    save_file(state, folder / "model.safetensors")
    ours, _ = _cascade_agrees_in_both_engines(smollm, folder)
    assert ours[0] > 0.15 and ours[1] > 0.03, ours


def test_a_cascade_with_injected_keys_and_values_drafts_in_vllm_what_it_drafts_in_ours(smollm, engines, tmp_path):
    """The equal cascade switched to `kv_inject` (every layer's keys and values from the fused input; the same
    weights) runs in vLLM's one forward as in ours: same outputs, same acceptance at each chain position. Its
    deeper depths read another function (`tests/test_drafter.py`), so some of its drafts differ from the plain
    cascade's, and vLLM's counts with it differ from its counts without it on the same prompts (the `engines`
    run); a plugin that ignored the switch would count exactly the same."""
    import json
    import shutil

    from fasteagle.methods import EQUAL_DRAFTER

    folder = tmp_path / "injected"
    shutil.copytree(EQUAL_DRAFTER, folder)
    cfg = json.loads((folder / "config.json").read_text()) | {"kv_inject": True}
    (folder / "config.json").write_text(json.dumps(cfg))
    ours, theirs = _cascade_agrees_in_both_engines(smollm, folder)
    assert ours[0] > 0.1
    assert theirs != engines["fasteagle-equal"]["vllm"]["per_position"]


@pytest.mark.parametrize("method", ["eagle3", "fasteagle-equal"])
def test_vllm_accepts_what_ours_accepts_position_by_position(engines, method):
    ours, theirs = engines[method]["ours"], engines[method]["vllm"]
    assert theirs["drafts"] == pytest.approx(ours["drafts"], rel=0.03)
    assert theirs["tau"] == pytest.approx(ours["tau"], rel=0.03)
    assert len(theirs["per_position"]) == K
    for i, (a, b) in enumerate(zip(ours["per_position"], theirs["per_position"]), start=1):
        assert abs(a - b) <= 0.03, f"position {i}: ours {a:.3f}, vLLM {b:.3f}"
    assert ours["per_position"][0] > 0.1, "a trained drafter accepts; else the comparison says nothing"


def _cascade_agrees_in_both_engines(smollm, folder) -> tuple[list[float], list[float]]:
    """The cascade in `folder` decoding held-out chat prompts in vLLM (our plugin) and in ours: both write plain
    decoding's output and accept alike at each chain position (within 0.03); the acceptance per position, ours
    and vLLM's."""
    texts = [p["text"] for p in load_prompts(ROOT / "assets" / "prompts" / "sharegpt_holdout.jsonl", PROMPTS)]
    got = compare_engines(smollm, Settings(drafter=folder), ["vanilla", "fasteagle"], texts, K, TOKENS, [1],
                          None, None)["methods"]["fasteagle"]
    ours, theirs = got["ours"], got["vllm"]
    assert ours["identical"] == theirs["identical"] == PROMPTS
    for i, (a, b) in enumerate(zip(ours["per_position"], theirs["per_position"]), start=1):
        assert abs(a - b) <= 0.03, f"position {i}: ours {a:.3f}, vLLM {b:.3f}"
    return ours["per_position"], theirs["per_position"]


def test_a_token_conditioned_cascade_drafts_in_vllm_what_it_drafts_in_ours(smollm, tmp_path):
    """The shipped cascade made token-conditioned, each `tok_fc` a random map large enough to scramble every
    draft past depth 1, runs in vLLM's one forward as in ours: same outputs, same acceptance at each chain
    position. Unconditioned, this drafter accepts about 0.47, 0.20 and 0.09 at positions 1-3 in both engines
    (bench/results/cpu-smollm2-135m-vllm-engines-2026-11-29.json): an engine that skipped the conditioning
    would keep ~0.2 at position 2 where the other falls to almost nothing."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from fasteagle.methods import DEFAULT_DRAFTER

    folder = tmp_path / "conditioned"
    shutil.copytree(DEFAULT_DRAFTER, folder)
    cfg = json.loads((folder / "config.json").read_text()) | {"token_conditioned": True}
    (folder / "config.json").write_text(json.dumps(cfg))
    state = load_file(folder / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    for i in range(cfg["num_layers"] - 1):  # std 50: ~the norm of the cascade's residual stream (~5000)
        state[f"tok_fc.{i}.weight"] = (torch.randn(cfg["width"], cfg["target_hidden"], generator=g) * 50.0).half()
    save_file(state, folder / "model.safetensors")
    ours, _ = _cascade_agrees_in_both_engines(smollm, folder)
    assert ours[0] > 0.3 and ours[1] < 0.08  # depth 1 intact, depth 2 scrambled


@pytest.mark.parametrize("method", ["eagle3", "fasteagle-equal"])
def test_trace_files_hold_what_vllm_counted(engines, traces, method):
    """`--traces`: each prompt's vLLM decode as an app trace file; over the files, the accepted drafts per
    position and the replies are vLLM's own (its counters, its plain decoding)."""
    import viz
    from fasteagle import trace

    files = sorted(traces.glob(f"{method}-*.json"))
    assert len(files) == PROMPTS
    runs = [viz.parse_run_file(f.read_text()) for f in files]
    steps = [r["sides"]["speculative"]["traces"] for r in runs]
    rows = [trace.depth_acceptance(s) for s in steps]
    accepted = [sum(r[d]["accepted"] for r in rows if len(r) > d) for d in range(K)]
    drafts = sum(1 for s in steps for step in s if step.get("tree"))
    vllm = engines[method]["vllm"]
    assert drafts == vllm["drafts"]
    assert [a / drafts for a in accepted] == pytest.approx(vllm["per_position"])
    same = [trace.reply_tokens(r["sides"]["speculative"]["traces"]) == trace.reply_tokens(
        r["sides"]["vanilla"]["traces"]) for r in runs]
    assert sum(same) == vllm["identical"]


def test_a_vllm_release_the_code_was_not_written_for_is_refused(monkeypatch):
    import vllm

    from fasteagle.vllm_engine import require_vllm

    monkeypatch.setattr(vllm, "__version__", "0.31.2")
    with pytest.raises(FastEagleError, match="written for 0.32") as exc:
        require_vllm()
    assert "\n" not in str(exc.value)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict):
    import json
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


@pytest.mark.parametrize("method", ["eagle3", "fasteagle"])
def test_serve_answers_chat_completions_streamed_and_not_then_stops(smollm, tmp_path, method):
    """`python -m fasteagle serve --method M`: vLLM's OpenAI server with our drafter, exported on the fly (the
    cascade runs in vLLM through our plugin), on localhost. A chat completion, whole and streamed, says what our
    engine says greedily; Ctrl-C stops it."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    from fasteagle.generate import chat_prompt_ids, run

    port, prompt = _free_port(), "Name three primary colors."
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "fasteagle", "serve", "--method", method, "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(2)
        else:
            pytest.fail("the server did not come up in 7 minutes")
        body = {"model": "fasteagle", "messages": [{"role": "user", "content": prompt}], "max_tokens": 24,
                "temperature": 0}
        whole = json.load(_post(base + "/v1/chat/completions", body))["choices"][0]["message"]["content"]
        pieces = []
        for line in _post(base + "/v1/chat/completions", body | {"stream": True}):
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
        ours, _ = run(smollm, chat_prompt_ids(smollm, prompt), max_new_tokens=24)
        assert whole and "".join(pieces) == whole
        assert whole.strip() == smollm.tokenizer.decode(ours, skip_special_tokens=True).strip()
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("the server did not stop within 90 s of Ctrl-C")
        log.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(base + "/health", timeout=5)


def test_vllm_writes_the_replies_our_engine_writes(smollm):
    """`--distill-engine vllm`: the same greedy replies as `self_distill` (fp32), in the same dataset form,
    saying which engine made them (measured: 8 of 8 held-out prompts identical at 48 tokens, all greedy);
    a sampled batch runs too (vLLM's CPU sampler refuses a per-request seed)."""
    from fasteagle.train import data as data_mod
    from fasteagle.train.fast_replies import vllm_replies
    from fasteagle.train.teacher import distill_order, self_distill

    prompts = data_mod.build_token_dataset(smollm.tokenizer, "holdout", 1024, limit=8)["prompt_ids"][:8]
    theirs = vllm_replies(None, smollm.tokenizer, prompts, 48, 4, sample_every=2)  # the second batch sampled
    ours = self_distill(smollm.model, smollm.tokenizer, prompts, 48, 4, sample_every=0)
    assert theirs["engine"].startswith("vllm 0.32") and set(theirs) - {"engine"} == set(ours)
    a, b = dict(zip(theirs["ids"], theirs["input_ids"])), dict(zip(ours["ids"], ours["input_ids"]))
    greedy = [str(i) for i in distill_order([len(p) for p in prompts], 4, 0)[:4]]
    assert a.keys() == b.keys() and sum(a[k] == b[k] for k in greedy) >= 3


@pytest.fixture(scope="module")
def sweep(smollm, tmp_path_factory):
    """`bench --engine vllm --repeats 2` on 4 prompts at batch 1 and 2: its result file."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("sweep") / "sweep.json"
    cmd = [sys.executable, "-m", "fasteagle", "bench", "--engine", "vllm", "--repeats", "2", "--methods",
           "vanilla,fasteagle-equal", "--prompts", "assets/prompts/sharegpt_holdout.jsonl", "--limit", "4",
           "--tree-budget", "4", "--max-new-tokens", "12", "--batch-sizes", "1,2", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_batch_sweep_keeps_every_method_per_batch_size(sweep):
    """`bench --engine vllm --repeats R`: per batch size the usual per-method block (tokens/s as the median of R
    runs, identical_to_vanilla over the batch's prompts, tau for drafters), KV bytes per token from the configs
    (vLLM's own cache agrees: 2 GiB held 46,592 SmolLM2 tokens alone, 38,784 beside all 6 cascade layers), the
    .md table and the chart."""
    import json

    out = sweep
    doc = json.loads(out.read_text())
    assert list(doc["batches"]) == ["1", "2"] and doc["repeats"] == 2
    for b, block in doc["batches"].items():
        van, casc = block["methods"]["vanilla"], block["methods"]["fasteagle-equal"]
        assert len(casc["tokens_per_s_runs"]) == 2 and casc["tokens_per_s"] > 0
        assert casc["prompts"] == (4 if b == "1" else 2) and casc["identical_to_vanilla"] >= casc["prompts"] - 1
        assert casc["tau"] >= 1.0 and len(casc["per_position"]) == 3
        assert van["kv_bytes_per_token"]["total"] == 46080 and van["kv_bytes_per_token"]["drafter"] == 0
        assert casc["kv_bytes_per_token"]["drafter"] == 3 * 2 * 3 * 64 * 4  # k = 3 of 6 layers, 3 KV heads of 64, fp32
    assert "fasteagle-equal" in out.with_suffix(".md").read_text() and out.with_suffix(".html").exists()


def test_step_costs_time_vllm_and_set_each_method_against_its_limit(sweep):
    """`bench --engine vllm --step-costs SWEEP`: vLLM's step at the sweep's batch sizes, verifying 1..k+1 tokens
    per request (n-gram drafting at every step of a repeating prompt), the drafter's forward at its shape (an
    empty model's step taken off), and each method's limit b * tau / step against what the sweep measured."""
    import json
    import subprocess
    import sys

    from fasteagle.bench.vllm_costs import step_ms

    out = sweep.with_name("costs.json")
    cmd = [sys.executable, "-m", "fasteagle", "bench", "--engine", "vllm", "--step-costs", str(sweep), "--repeats",
           "1", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    doc, measured = json.loads(out.read_text()), json.loads(sweep.read_text())
    # the cascade's shape as timed: the k = 3 of its 6 layers the plugin builds
    assert doc["kinds"] == {"fasteagle-equal": "fasteagle"} and doc["shapes"]["fasteagle-equal"]["num_layers"] == 3
    assert list(doc["target"]) == ["1", "2", "3", "4"] and list(doc["drafters"]["fasteagle-equal"]) == ["6"]
    for b in ("1", "2"):
        for q, row in doc["target"].items():  # the n-gram proposer drafted at every step of the repeating prompt
            assert row[b]["ms"] > 0 and int(q) - 0.3 <= row[b]["query"] <= int(q) + 0.05
        drafter = doc["drafters"]["fasteagle-equal"]["6"][b]  # a decode step of b*6 requests at its shape
        assert drafter["rows"] == 6 * int(b) and drafter["step_ms"] > drafter["ms"]
        for m in ("vanilla", "fasteagle-equal"):
            row, swept = doc["limits"][b][m], measured["batches"][b]["methods"][m]
            tau = swept.get("tau") or 1.0
            ms = step_ms(m, doc["kinds"].get(m), int(b), 3, doc["target"], doc["drafters"])
            # the sweep's calls paid their prefill (vLLM's clock, to the first token): the limit pays it too
            assert 0 < swept["prefill_s"] and swept["requests"] == (4 if b == "1" else int(b))
            steps = (swept["tokens"] - swept["requests"]) / (int(b) * tau)
            assert row["limit_tokens_per_s"] == pytest.approx(swept["tokens"] / (swept["prefill_s"] + steps * ms / 1e3))
            assert row["limit_tokens_per_s"] < int(b) * tau / ms * 1e3
            assert row["tokens_per_s"] == measured["batches"][b]["methods"][m]["tokens_per_s"]
    assert "measured / limit" in out.with_suffix(".md").read_text()


def test_distill_speed_times_both_engines_on_the_same_prompts(tmp_path):
    """`bench --engine vllm --distill-speed`: the target's greedy replies by our `generate` batches and by vLLM,
    each engine's replies, tokens and seconds (vLLM's start-up apart), and how many replies are identical."""
    import json
    import subprocess
    import sys

    out = tmp_path / "distill.json"
    cmd = [sys.executable, "-m", "fasteagle", "bench", "--engine", "vllm", "--distill-speed", "--prompts",
           "assets/prompts/sharegpt_holdout.jsonl", "--limit", "3", "--max-new-tokens", "16", "--batch-sizes", "2",
           "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["prompts"] == 3 and doc["batch"] == 2 and doc["compared"] == 3 and doc["identical"] >= 2
    for name, row in doc["engines"].items():
        assert row["replies"] == 3 and 3 * 4 <= row["reply_tokens"] <= 3 * 16 and row["seconds"] > 0, name
        assert row["replies_per_min"] == pytest.approx(row["replies"] / row["seconds"] * 60)
    assert doc["engines"]["vllm"]["engine"].startswith("vllm 0.32") and doc["engines"]["vllm"]["load_s"] > 0
    f = doc["features"]  # then the teacher's pass over vLLM's replies, whole rows and windowed
    assert f["reply_tokens"] == doc["engines"]["vllm"]["reply_tokens"] and f["read"] > f["reply_tokens"]
    assert f["reply_tokens"] < f["window"]["positions"] <= f["whole"]["positions"] and f["window"]["mb"] > 0
    assert f["speedup"] == pytest.approx(f["whole"]["seconds"] / f["window"]["seconds"])
    md = out.with_suffix(".md").read_text()
    assert "replies/min" in md and "positions written" in md


def test_the_cascade_runs_in_vllm_on_a_qwen3_moe_target(tmp_path):
    """Of the families beyond Llama and Qwen2/3, vLLM 0.32 gives EAGLE-3's path the auxiliary hidden states
    only for `qwen3_moe`: there our plugin runs. A tiny Qwen3-30B-A3B-shaped target (its published config,
    shrunk; vLLM's CPU attention takes a head size of 64, not the family tests' 16) and a random cascade
    exported for the plugin: both engines draft at every step and write vLLM's plain decoding. (A random
    drafter's drafts are rejected; acceptance matching between the engines is tested on SmolLM2 above.)"""
    import json

    import torch

    from fasteagle.draftconfig import DrafterConfig
    from fasteagle.drafter import CascadedDrafter
    from fasteagle.target import load_target
    from tests.test_families import FIXTURES, build_family

    raw = json.loads((FIXTURES / "qwen3_moe.json").read_text())
    folder = build_family(raw, tmp_path / "target", hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=64)
    target = load_target(str(folder), device="cpu", dtype="fp32")
    torch.manual_seed(0)
    CascadedDrafter(DrafterConfig.for_target(target.model, target.name, num_layers=3, intermediate=64)).save(
        tmp_path / "fe")
    texts = ["w10 w11 w12 w13", "w40 w41 w42 w43 w44 w45", "w7 w99 w123", "w200 w201 w202 w203 w204"]
    got = compare_engines(target, Settings(drafter=tmp_path / "fe"), ["vanilla", "fasteagle"], texts, K, 24, [1],
                          str(folder), None)["methods"]
    assert got["vanilla"]["ours"]["identical"] == len(texts)
    for engine in ("ours", "vllm"):
        assert got["fasteagle"][engine]["identical"] == len(texts), engine
        assert got["fasteagle"][engine]["drafts"] > 0, (engine, got["fasteagle"][engine])


def test_vllms_cpu_grouped_rms_norm_reads_layer_0s_weight_only():
    """Why a DFlash drafter's layers share one k-norm (`fasteagle.dflash`): vLLM 0.32's DFlash normalizes every
    layer's context keys in one `rms_norm` call with a (layers, head_dim) weight, and the CPU kernel applies row
    0 to every layer. Should a vLLM release fix it, this fails, and the layers may have k-norms of their own."""
    import torch
    import vllm._custom_ops as ops

    x, w = torch.randn(3, 4, 2, 64), torch.rand(3, 64) + 0.5
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-5)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    for layer in range(3):
        torch.testing.assert_close(out[layer], normed[layer] * w[0], atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def single_pass(smollm):
    texts = [p["text"] for p in load_prompts(ROOT / "assets" / "prompts" / "sharegpt_holdout.jsonl", PROMPTS)]
    return compare_engines(smollm, Settings(), ["vanilla", "dflash", "peagle"], texts, K, TOKENS, [1], None,
                           None)["methods"]


@pytest.mark.parametrize("method", ["dflash", "peagle"])
def test_the_shipped_single_pass_drafters_draft_in_stock_vllm_what_they_draft_in_ours(single_pass, method):
    """The shipped DFlash drafter, exported to vLLM's own format (`method: "dflash"`, blocks of [bonus, mask x 3]),
    and the shipped parallel EAGLE one, exported as an EAGLE-3 checkpoint with its mask row (`method: "eagle3"`,
    `parallel_drafting`: [accepted | bonus | mask x 2] in one forward), run in stock vLLM as in our engine: both
    write plain decoding, and accept the same share at each chain position (the module docstring's tolerance)."""
    ours, theirs = single_pass[method]["ours"], single_pass[method]["vllm"]
    assert ours["identical"] == theirs["identical"] == PROMPTS
    assert theirs["tau"] == pytest.approx(ours["tau"], rel=0.03)
    for i, (a, b) in enumerate(zip(ours["per_position"], theirs["per_position"]), start=1):
        assert abs(a - b) <= 0.03, f"position {i}: ours {a:.3f}, vLLM {b:.3f}"
    # about 0.11 (DFlash) and 0.2 (peagle) at position 1 (their cards): enough drafts to tell two networks apart
    assert ours["per_position"][0] > 0.05, "a trained drafter accepts; else the comparison says nothing"

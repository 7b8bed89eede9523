"""Target families beyond Llama: mixtures of experts (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE) and Gemma 2 / 3's
text models, each built from its published checkpoint's `config.json` (tests/fixtures/target_configs, with
their sources), shrunk to a tiny random model, saved and loaded as a user's folder is.

Every method decodes greedily token for token as the family's own `generate` does, past a sliding window
where the family has one; both drafters train a few steps on it; an EAGLE-3 checkpoint of a published shape
drafts for it; `export` round-trips; a family still unsupported is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fasteagle import cli, eagle3_format
from fasteagle.draftconfig import DrafterConfig
from fasteagle.drafter import CascadedDrafter
from fasteagle.eagle3 import AutoregressiveDrafter
from fasteagle.generate import run
from fasteagle.hybrid import WithLookup
from fasteagle.lookup import LookupDrafter
from fasteagle.methods import load_drafter
from fasteagle.target import Target, attention_windows, load_target
from tests.conftest import TINY_VOCAB, tiny_tokenizer
from tests.drafters import OracleDrafter, RandomDrafter, steer
from tests.test_bad_inputs import assert_one_line_error, run_main

FIXTURES = Path(__file__).parent / "fixtures" / "target_configs"
PUBLISHED = sorted(FIXTURES.glob("*.json"))
EAGLE3 = Path(__file__).parent / "fixtures" / "eagle3_configs"
LAYERS, WINDOW, EXPERTS = 8, 8, 8  # a window of 8 positions: a 20-token prompt and its reply run past it
NEW = 32
HEAD_SCALE = 8.0
DROPPED = ("torch_dtype", "dtype", "transformers_version", "quantization_config", "auto_map", "layer_types",
           "text_config", "vision_config")


def shrink(raw: dict, **sizes) -> dict:
    """A published config at a tiny size: its structure kept (experts and top-k with k/E <= 1/4, shared
    experts, soft-capping, the sliding pattern, tied embeddings, norms), its sizes replaced."""
    raw = raw.get("text_config", raw) | {"model_type": raw.get("text_config", {}).get("model_type", raw["model_type"])}
    out = {k: v for k, v in raw.items() if k not in DROPPED}
    out |= {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": TINY_VOCAB, "max_position_embeddings": 4096,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "initializer_range": 0.05} | sizes
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if key in raw:
            out[key] = 32
    for key in ("num_experts", "num_local_experts"):
        if key in raw:
            out[key] = EXPERTS
            out["num_experts_per_tok"] = max(1, min(raw.get("num_experts_per_tok", 2), EXPERTS // 4))
    if raw.get("sliding_window") or raw["model_type"].startswith("gemma"):
        out["sliding_window"] = WINDOW
        out["use_sliding_window"] = True if "use_sliding_window" in raw else out.get("use_sliding_window")
    if out.get("tie_word_embeddings", True):  # random tied weights make a model that repeats its last token
        out["tie_word_embeddings"] = False
    for key in ("max_window_layers", "first_k_dense_replace"):
        if key in raw:
            out[key] = min(int(raw[key]), LAYERS)
    return {k: v for k, v in out.items() if v is not None}


def build_family(raw: dict, folder: Path, seed: int = 0, **sizes) -> Path:
    """The shrunk model with random weights, its head scaled so greedy choices are decisive, saved with the
    tiny tokenizer as a model folder."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg = shrink(raw, **sizes)
    config = CONFIG_MAPPING[cfg.pop("model_type")](**cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(HEAD_SCALE)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def published(source) -> dict:
    """A fixture file's config, or for qwen2_moe, of which no copy of a published config.json was found on
    GitHub (SOURCES.md), transformers' `Qwen2MoeConfig` defaults, which are Qwen1.5-MoE-A2.7B's sizes."""
    if source == "qwen2_moe":
        from transformers import Qwen2MoeConfig

        return Qwen2MoeConfig().to_dict()
    return json.loads(source.read_text())


@pytest.fixture(scope="module", params=[*PUBLISHED, "qwen2_moe"], ids=lambda p: getattr(p, "stem", p))
def family(request, tmp_path_factory) -> tuple[str, Target, dict]:
    name = getattr(request.param, "stem", request.param)
    raw = published(request.param)
    best = None  # of a few random draws, the one whose reply varies most: tiny random MoEs fall into loops
    for seed in range(4):
        folder = build_family(raw, tmp_path_factory.mktemp(name), seed=seed)
        target = load_target(str(folder), device="cpu", dtype="fp32")
        n = len(set(run(target, prompt(target), max_new_tokens=NEW, stop_ids=set())[0]))
        best = max(best or (n, seed, target), (n, seed, target), key=lambda x: x[0])
    return name, best[2], raw


def prompt(target, n: int = 20) -> torch.Tensor:
    return torch.randint(4, TINY_VOCAB, (n,), generator=torch.Generator().manual_seed(3))


def test_the_fixtures_are_the_families_asked_for():
    kinds = {json.loads(p.read_text()).get("model_type") for p in PUBLISHED}
    assert kinds == {"qwen3_moe", "mixtral", "olmoe", "gemma2", "gemma3"}, kinds
    sources = (FIXTURES / "SOURCES.md").read_text()
    assert all(p.name in sources for p in PUBLISHED)


def test_vanilla_is_the_models_own_greedy_generate(family):
    """Our vanilla loop (a one-node tree per step, through `verify.tree_mask`) against transformers'
    `generate`, past the sliding window where the family has one."""
    name, target, raw = family
    ids = prompt(target)
    ours, _ = run(target, ids, max_new_tokens=NEW, stop_ids=set())
    theirs = target.model.generate(ids[None], max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                                   pad_token_id=0)[0, ids.numel():].tolist()
    assert ours == theirs, name
    window, _ = attention_windows(target.model.config)
    if raw.get("sliding_window") or name.startswith("gemma"):  # past the window, with a reply that varies
        assert window == WINDOW and ids.numel() + NEW > 2 * window
        assert len(set(ours)) >= 5, "a reply looping over a token or two tests little of the window"


def drafters_for(target) -> dict:
    """Untrained drafters of both kinds for the target (random, decisive weights), lookup, and the joins."""
    torch.manual_seed(0)
    base = DrafterConfig.for_target(target.model, target.name, intermediate=64)
    fe = CascadedDrafter(DrafterConfig.for_target(target.model, target.name, num_layers=3, intermediate=64))
    e3 = AutoregressiveDrafter(AutoregressiveDrafter.config_for(base, depth=4))
    out = {}
    for name, d in (("fasteagle", fe), ("eagle3", e3)):
        d = d.attach(target.model).eval()
        for p in d.parameters():
            p.data.mul_(3)
        d.tree_budget = 12
        out[name] = d
    out["lookup"] = LookupDrafter()
    out["fasteagle+lookup"] = WithLookup(out["fasteagle"])
    return out


def test_every_method_is_lossless(family):
    """Trees of every shape (a random drafter, a mostly-right oracle that gets deep paths accepted) and
    every real method, greedy: each output is vanilla's, token for token."""
    name, target, _ = family
    ids = prompt(target)
    want, _ = run(target, ids, max_new_tokens=NEW, stop_ids=set())
    for shape, depth, k, budget in (("chain", 5, 1, 64), ("backbone", 4, 3, 12), ("product", 6, 4, 16)):
        got, _ = run(target, ids, drafter=RandomDrafter(TINY_VOCAB, shape, depth, k, budget), max_new_tokens=NEW,
                     stop_ids=set())
        assert got == want, (name, shape)
        got, traces = run(target, ids, drafter=OracleDrafter(want, TINY_VOCAB, shape, depth, k, budget, corrupt=0.1),
                          max_new_tokens=NEW, stop_ids=set())
        assert got == want and traces[-1].tau > 1.5, (name, shape, traces[-1].tau)
    for method, d in drafters_for(target).items():
        got, _ = run(target, ids, drafter=d, max_new_tokens=NEW, stop_ids=set())
        assert got == want, (name, method)
        if method in ("fasteagle", "eagle3"):  # untrained: steered towards the reply, so drafts get accepted
            got, traces = run(target, ids, drafter=steer(d, want), max_new_tokens=NEW, stop_ids=set())
            assert got == want and max(len(t.path) for t in traces[1:]) > 1, (name, method)


def test_both_drafters_train_a_few_steps(family, tmp_path):
    """The trainer reads the family's hidden states (its residual stream, MoE or not) and both drafters
    take optimizer steps on them; what they write loads back and stays lossless."""
    from fasteagle.train.config import TrainConfig
    from fasteagle.train.data import save_token_dataset
    from fasteagle.train.trainer import train

    name, target, _ = family
    g = torch.Generator().manual_seed(1)
    data = {"input_ids": [], "loss_mask": [], "prompt_ids": [], "ids": []}
    for i in range(6):
        p = torch.randint(4, TINY_VOCAB, (6,), generator=g)
        reply, _ = run(target, p, max_new_tokens=24, stop_ids=set())
        data["input_ids"].append(p.tolist() + reply)
        data["loss_mask"].append([0] * 6 + [1] * len(reply))
        data["prompt_ids"].append(p.tolist())
        data["ids"].append(f"r{i}")
    save_token_dataset(data, tmp_path / "train.pt")
    ids = prompt(target)
    want, _ = run(target, ids, max_new_tokens=16, stop_ids=set())
    for kind, extra in (("fasteagle", {"num_layers": 2}), ("eagle3", {"depth": 3})):
        out = train(TrainConfig(out=str(tmp_path / kind), data=str(tmp_path / "train.pt"), drafter=kind,
                                intermediate=64, topk=4, batch_tokens=200, max_steps=4, warmup=1, lr=1e-3,
                                features="cache", checkpoint_every=100, device="cpu", **extra), target=target)
        d = load_drafter(out, target.model, kind=kind)
        assert d.info["training"]["steps"] == 4, (name, kind)
        assert run(target, ids, drafter=d, max_new_tokens=16, stop_ids=set())[0] == want, (name, kind)


def test_an_eagle3_checkpoint_of_a_published_shape_drafts(family, tmp_path):
    """SpecForge's Qwen3-235B-A22B drafter shape for the Qwen MoE targets, its Llama-3 one for the others."""
    from tests.test_eagle3_format import shrink as shrink_eagle3
    from tests.test_eagle3_format import write_checkpoint

    name, target, _ = family
    source = "specforge_qwen3_235b_a22b.json" if name.startswith("qwen") else "specforge_llama3_8b.json"
    # over the whole vocabulary: a reduced one (test_eagle3_format covers it) may lack a looping reply's token
    raw = shrink_eagle3(json.loads((EAGLE3 / source).read_text()), target, draft_vocab=TINY_VOCAB)
    for holder in (raw, raw.get("eagle_config") or {}):
        if "eagle_aux_hidden_state_layer_ids" in holder:
            holder["eagle_aux_hidden_state_layer_ids"] = [1, 3, 4]
    d = load_drafter(write_checkpoint(tmp_path / "ckpt", raw), target.model)
    ids = prompt(target)
    want, _ = run(target, ids, max_new_tokens=NEW, stop_ids=set())
    d.tree_k, d.tree_budget = 4, 16
    assert run(target, ids, drafter=d, max_new_tokens=NEW, stop_ids=set())[0] == want
    got, traces = run(target, ids, drafter=steer(d, want), max_new_tokens=NEW, stop_ids=set())
    assert got == want and max(len(t.path) for t in traces[1:]) > 1


def test_export_round_trips(family, tmp_path):
    """Our EAGLE-3-style drafter for the family -> export -> import: the same trees, the same output."""
    from tests.test_eagle3_format import make_ours

    name, target, _ = family
    d = make_ours(target)
    back = load_drafter(eagle3_format.export(d, tmp_path / "exported"), target.model, int8=False)  # as d runs
    ids = prompt(target)
    for x in (d, back):
        x.tree_k, x.tree_budget = 4, 16
    (a, ta), (b, tb) = (run(target, ids, drafter=x, max_new_tokens=NEW, stop_ids=set()) for x in (d, back))
    assert a == b, name
    assert [t.tree["tokens"] for t in ta[1:]] == [t.tree["tokens"] for t in tb[1:]]


def test_an_unsupported_family_is_one_line(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=TINY_VOCAB)).save_pretrained(tmp_path / "g")
    tiny_tokenizer().save_pretrained(tmp_path / "g")
    rc, out, err = run_main(cli.main, ["generate", "--prompt", "w7", "--target", str(tmp_path / "g")], capsys)
    assert_one_line_error(rc, err, "'gpt2' model")
    assert rc == 2


@pytest.mark.parametrize("source", ["gemma2.json", "qwen3_moe.json"])
def test_the_app_decodes_on_a_family_target(source, tmp_path):
    """`python app.py --target` a Gemma or MoE folder: the app builds on it with both drafters, and a
    greedy run of each writes the plain reply (the badge says identical)."""
    import app
    from tests.appclient import call_run, served

    target = load_target(str(build_family(json.loads((FIXTURES / source).read_text()), tmp_path / "t")),
                         device="cpu", dtype="fp32")
    torch.manual_seed(0)
    CascadedDrafter(DrafterConfig.for_target(target.model, target.name, num_layers=3, intermediate=64)).save(
        tmp_path / "fe")
    AutoregressiveDrafter(AutoregressiveDrafter.config_for(
        DrafterConfig.for_target(target.model, target.name, intermediate=64), depth=3)).save(tmp_path / "e3")
    demo = app.build_app(target, drafter_dir=tmp_path / "fe", eagle3_dir=tmp_path / "e3")
    with served(demo) as client:
        for method in ("FastEagle", "EAGLE-3"):
            res = call_run(client, "w9 w10 w11 w12", method=method, max_new=10)
            assert 'data-identical="true"' in res["badge"], (source, method, res["badge"])


@pytest.mark.parametrize("source", ["gemma2.json", "mixtral.json", "olmoe.json"])
def test_vllm_drafting_on_a_family_it_cannot_feed_is_one_line(source, tmp_path, capsys):
    """`serve` (and `bench --engine vllm`) with a drafter on a family whose vLLM model has no auxiliary hidden
    states: one line, exit 2, naming our engine as where it runs; before vLLM is started."""
    pytest.importorskip("vllm")
    folder = build_family(json.loads((FIXTURES / source).read_text()), tmp_path / "t")
    rc, out, err = run_main(cli.main, ["serve", "--method", "fasteagle", "--target", str(folder), "--dry-run"], capsys)
    assert_one_line_error(rc, err, "our engine only")
    assert rc == 2

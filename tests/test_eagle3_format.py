"""EAGLE-3 checkpoints in and out (`fasteagle.eagle3_format`): the published configs of the EAGLE and
SpecForge repositories load (shrunk to a tiny target, random weights written here with the format's own
names, not by our exporter) and decode losslessly; ours export and come back token-identical; a broken
checkpoint is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from fasteagle import cli, eagle3_format
from fasteagle.draftconfig import DrafterConfig
from fasteagle.eagle3 import AutoregressiveDrafter
from fasteagle.errors import FastEagleError
from fasteagle.generate import run
from fasteagle.methods import Settings, build, load_drafter
from tests.conftest import TINY_VOCAB, tiny_target
from tests.drafters import steer
from tests.test_bad_inputs import assert_one_line_error, run_main

FIXTURES = Path(__file__).parent / "fixtures" / "eagle3_configs"
PUBLISHED = sorted(FIXTURES.glob("*.json"))
LAYERS = 6  # the tiny target's layers: vLLM's default feature layers (2, L//2, L-3) exist


@pytest.fixture(scope="module")
def target():
    return tiny_target(layers=LAYERS)


def shrink(raw: dict, target, draft_vocab: int = 200) -> dict:
    """A published config at the tiny target's size; every key it has is kept, sizes replaced."""
    c = target.model.config
    out = dict(raw) | {"hidden_size": c.hidden_size, "intermediate_size": 96, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "head_dim": 16, "vocab_size": TINY_VOCAB,
                       "max_position_embeddings": 512}
    out["draft_vocab_size"] = TINY_VOCAB if raw.get("draft_vocab_size") == raw.get("vocab_size") else draft_vocab
    if "target_hidden_size" in raw:
        out["target_hidden_size"] = c.hidden_size
    for holder in (out, out.get("eagle_config") or {}):
        if "eagle_aux_hidden_state_layer_ids" in holder:
            holder["eagle_aux_hidden_state_layer_ids"] = [1, 3, 5]
    return out


def write_checkpoint(folder: Path, config: dict, seed: int = 0, drop: str | None = None) -> Path:
    """Random weights under the format's names, shaped by `config` alone (layers past the first as
    `layers.i.`, the first as `midlayer.` when it is the only one, as the EAGLE repository saves it)."""
    g = torch.Generator().manual_seed(seed)
    w, i, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    th = config.get("target_hidden_size", w)
    layers = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or \
        config.get("eagle_aux_hidden_state_layer_ids") or [2, LAYERS // 2, LAYERS - 3]
    dv, v = config["draft_vocab_size"], config["vocab_size"]

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    state = {"fc.weight": rand(w, len(layers) * th), "norm.weight": 1 + rand(w), "lm_head.weight": rand(dv, w) * 20}
    n = config.get("num_hidden_layers", 1)
    for layer in range(n):
        p = "midlayer." if n == 1 else f"layers.{layer}."
        width = 2 * w if layer == 0 else w
        state |= {p + "self_attn.q_proj.weight": rand(q, width), p + "self_attn.k_proj.weight": rand(kv, width),
                  p + "self_attn.v_proj.weight": rand(kv, width), p + "self_attn.o_proj.weight": rand(w, q),
                  p + "mlp.gate_proj.weight": rand(i, w), p + "mlp.up_proj.weight": rand(i, w),
                  p + "mlp.down_proj.weight": rand(w, i), p + "input_layernorm.weight": 1 + rand(w),
                  p + "post_attention_layernorm.weight": 1 + rand(w)}
        if layer == 0:
            state[p + "hidden_norm.weight"] = 1 + rand(w)
    ids = torch.randperm(v, generator=g)[:dv].sort().values
    state["d2t"] = ids - torch.arange(dv)
    state["t2d"] = torch.zeros(v, dtype=torch.bool).index_fill_(0, ids, True)
    if drop:
        del state[drop]
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("published", PUBLISHED, ids=lambda p: p.stem)
def test_published_configs_load_and_decode_losslessly(published, target, tmp_path):
    """Each published config, shrunk: it loads in the format's own layout, drafts an EAGLE-2 tree and a
    chain, and (steered towards the reply, so that drafts get accepted) the output stays vanilla's."""
    folder = write_checkpoint(tmp_path / published.stem, shrink(json.loads(published.read_text()), target))
    assert eagle3_format.is_checkpoint(folder)
    d = load_drafter(folder, target.model)
    assert isinstance(d, AutoregressiveDrafter) and d.cfg.layout == "eagle3" and d.cfg.own_head
    ids, want = prompt(target)
    for k, budget in ((4, 20), (1, 5)):
        d.tree_k, d.tree_budget = k, budget
        assert run(target, ids, drafter=d, max_new_tokens=24)[0] == want
    got, traces = run(target, ids, drafter=steer(d, want), max_new_tokens=24)
    assert got == want and max(len(t.path) for t in traces[1:]) > 1, "steered drafts must be accepted"


def prompt(target, n: int = 24) -> tuple[torch.Tensor, list[int]]:
    """A random prompt whose vanilla reply runs all n tokens (a tiny target can stop at once)."""
    g = torch.Generator().manual_seed(5)
    while True:
        ids = torch.randint(4, TINY_VOCAB, (10,), generator=g)
        want, _ = run(target, ids, max_new_tokens=n)
        if len(want) == n:
            return ids, want


def make_ours(target, seed=0, **layout) -> AutoregressiveDrafter:
    torch.manual_seed(seed)
    cfg = AutoregressiveDrafter.config_for(DrafterConfig.for_target(
        target.model, target.name, intermediate=64, draft_vocab=200, layout="eagle3", **layout), depth=5)
    d = AutoregressiveDrafter(cfg).attach(target.model).eval()
    d.vocab_ids = torch.randperm(TINY_VOCAB)[:200].sort().values
    for p in d.parameters():  # decisive drafts: near-ties would make a token-identical check meaningless
        p.data.mul_(3)
    return d


@pytest.mark.parametrize("layout", [{}, {"num_layers": 2}, {"norm_before_residual": True},
                                    {"norm_before_fc": True, "fc_norm": True, "attention_bias": True}],
                         ids=["one-layer", "two-layers", "norm-before-residual", "fc-norms-and-bias"])
def test_ours_round_trips_token_identical(layout, target, tmp_path):
    """ours -> export -> import: the same trees and the same output, step by step."""
    d = make_ours(target, **layout)
    out = eagle3_format.export(d, tmp_path / "exported")
    keys = set(eagle3_format._read(out / "model.safetensors"))
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys
    assert any(k.startswith("midlayer." if d.cfg.num_layers == 1 else "layers.1.") for k in keys)
    back = load_drafter(out, target.model)
    ids, _ = prompt(target, 30)
    for drafter in (d, back):
        drafter.tree_k, drafter.tree_budget = 4, 16
    (a, ta), (b, tb) = run(target, ids, drafter=d, max_new_tokens=30), run(target, ids, drafter=back, max_new_tokens=30)
    assert a == b
    assert [t.tree["tokens"] for t in ta[1:]] == [t.tree["tokens"] for t in tb[1:]]
    assert [t.path for t in ta] == [t.path for t in tb]


def test_the_drafter_flag_takes_an_eagle3_checkpoint_for_the_eagle3_method(target, tmp_path):
    folder = write_checkpoint(tmp_path / "ckpt", shrink(json.loads(PUBLISHED[0].read_text()), target))
    args = cli.build_parser().parse_args(["generate", "--prompt", "w7", "--method", "eagle3", "--drafter", str(folder)])
    s = cli.method_settings(args)
    assert s.eagle3_drafter == folder and s.drafter is None
    assert isinstance(build("eagle3", target, s), AutoregressiveDrafter)
    with pytest.raises(FastEagleError, match="--method eagle3"):
        load_drafter(folder, target.model, kind="fasteagle")


def test_exporting_what_the_format_cannot_hold_is_refused(target, tmp_path):
    proj = AutoregressiveDrafter(AutoregressiveDrafter.config_for(
        DrafterConfig.for_target(target.model, target.name, intermediate=64))).attach(target.model)
    with pytest.raises(FastEagleError, match="'proj' layout"):
        eagle3_format.export(proj, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def _broken(kind: str, target, folder: Path) -> Path:
    raw = shrink(json.loads(PUBLISHED[0].read_text()), target)
    if kind == "missing key":
        return write_checkpoint(folder, raw, drop="midlayer.hidden_norm.weight")
    if kind == "hidden size":
        return write_checkpoint(folder, raw | {"hidden_size": 48, "head_dim": 12})
    if kind == "vocabulary":
        return write_checkpoint(folder, raw | {"vocab_size": TINY_VOCAB + 64})
    if kind == "variant":
        return write_checkpoint(folder, raw | {"norm_output": True})
    write_checkpoint(folder, raw)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    return folder


@pytest.mark.parametrize("kind,word", [("missing key", "hidden_norm"), ("hidden size", "hidden"),
                                       ("vocabulary", "vocab"), ("truncated", "truncated"),
                                       ("variant", "norm_output")])
def test_a_bad_checkpoint_is_one_line(kind, word, target, tmp_path, capsys):
    """Through the command line, as a user meets it: exit code 2, one line naming what is wrong."""
    model_dir = tmp_path / "target"
    target.model.save_pretrained(model_dir)
    target.tokenizer.save_pretrained(model_dir)
    folder = _broken(kind, target, tmp_path / "bad")
    rc, out, err = run_main(cli.main, ["generate", "--prompt", "w7 w8", "--method", "eagle3", "--target",
                                       str(model_dir), "--drafter", str(folder), "--max-new-tokens", "4"], capsys)
    assert_one_line_error(rc, err, word)


def test_export_command_writes_a_folder_vllm_reads(target, tmp_path, capsys):
    """`python -m fasteagle export`: our drafter folder in, an EAGLE-3 checkpoint out, with the keys and
    config fields vLLM's `llama_eagle3.py` reads."""
    model_dir = tmp_path / "target"
    target.model.save_pretrained(model_dir)
    target.tokenizer.save_pretrained(model_dir)
    make_ours(target).save(tmp_path / "ours")
    rc, out, err = run_main(cli.main, ["export", "--drafter", str(tmp_path / "ours"), "--out",
                                       str(tmp_path / "vllm"), "--target", str(model_dir)], capsys)
    assert rc == 0, err
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 200
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3]
    assert isinstance(build("eagle3", target, Settings(eagle3_drafter=tmp_path / "vllm")), AutoregressiveDrafter)

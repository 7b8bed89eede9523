"""Shared fixtures: a tiny randomly initialised Llama target built in-process (no downloads), the real
embedded default target for the integration tests (downloaded once into the cache), and the app's: the app
built on the tiny target, untrained drafters for it, and the warnings it showed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from fasteagle.target import Target

TINY_VOCAB = 320
SPECIALS = ["<unk>", "<bos>", "<eos>", "<|im_end|>"]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer whose tokens are w4..w319 (ids 4..319), plus the specials 0..3."""
    vocab = {t: i for i, t in enumerate(SPECIALS)} | {f"w{i}": i for i in range(len(SPECIALS), TINY_VOCAB)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<bos>", eos_token="<eos>")
    tok.chat_template = (
        "{% for m in messages %}<bos> w5 {{ m['content'] }} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<bos> w6 {% endif %}"
    )
    return tok


def tiny_target(seed: int = 0, layers: int = 2, attn: str = "sdpa") -> Target:
    """A 2-layer Llama with a vocab of 320, random weights scaled up so its greedy choices are
    decisive (ties between near-equal logits would make exactness tests flaky)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    cfg._attn_implementation = attn
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return Target(model=model, tokenizer=tiny_tokenizer(), name=f"tiny-llama-{seed}")


@pytest.fixture(scope="session")
def tiny() -> Target:
    return tiny_target()


@pytest.fixture(scope="session")
def smollm() -> Target:
    """The real embedded default target on CPU, fp32 (downloads and converts on first use)."""
    from fasteagle.target import load_target

    return load_target(None, device="cpu", dtype="fp32")


# -- the app ----------------------------------------------------------------------------------------
@pytest.fixture
def warnings(monkeypatch) -> list[str]:
    """Messages the app showed with gr.Warning (the server runs in this process)."""
    import gradio as gr

    seen: list[str] = []
    real = gr.Warning

    def record(message="", *args, **kwargs):
        seen.append(str(message))
        return real(message, *args, **kwargs)

    monkeypatch.setattr(gr, "Warning", record)
    return seen


@pytest.fixture
def tiny_app(tiny, tmp_path):
    """The app on the tiny target, with no trained drafter (lookup and vanilla only)."""
    import app

    return app.build_app(tiny, drafter_dir=tmp_path / "no-drafter", eagle3_dir=tmp_path / "no-eagle3")


@pytest.fixture
def drafters(tiny, tmp_path) -> tuple[Path, Path]:
    """Untrained FastEagle and EAGLE-3 drafters for the tiny target: (FastEagle dir, EAGLE-3 dir)."""
    from fasteagle.drafter import CascadedDrafter, DrafterConfig
    from fasteagle.eagle3 import AutoregressiveDrafter

    torch.manual_seed(0)
    base = dict(intermediate=64)
    CascadedDrafter(DrafterConfig.for_target(tiny.model, tiny.name, num_layers=3, **base)).save(tmp_path / "fe")
    AutoregressiveDrafter(AutoregressiveDrafter.config_for(DrafterConfig.for_target(tiny.model, tiny.name, **base),
                                                           depth=3)).save(tmp_path / "e3")
    return tmp_path / "fe", tmp_path / "e3"

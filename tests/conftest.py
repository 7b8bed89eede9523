"""Shared fixtures: a tiny randomly initialised Llama target built in-process (no downloads), and
the real embedded default target for the integration tests (downloaded once into the cache)."""

from __future__ import annotations

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

"""A drafter's configuration (`DrafterConfig`, its folder's config.json) and the checks made before any
weights load: the folder's files, and whether a target is the one the drafter was trained for."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig

from fasteagle.errors import FastEagleError

__all__ = ["DrafterConfig", "check_fingerprint", "peek", "read_config", "target_fingerprint"]


@dataclass
class DrafterConfig:
    target: str  # the target's name, for messages
    target_hidden: int
    vocab_size: int
    feature_layers: list[int]  # indices into the target's hidden_states (0 = embeddings)
    num_layers: int = 6  # N: draft depths
    width: int = 0  # layer width (0: the target's hidden size)
    intermediate: int = 0  # MLP width (0: the target's)
    num_heads: int = 0  # (0: the target's)
    num_kv_heads: int = 0
    head_dim: int = 0
    rope_theta: float = 10000.0
    rope: dict = field(default_factory=dict)  # rotary scaling beyond the default (e.g. Llama 3.1's "llama3")
    rms_norm_eps: float = 1e-5
    max_positions: int = 8192
    loss_decay: float = 0.8  # layer i's loss weight = loss_decay ** (i - 1)
    loss_targets: str = "soft"  # "soft": the teacher's top-k distribution; "hard": its top-1 token only
    loss_weights: str = "decay"  # how depths and positions weigh (`DrafterBase._depth_weights`): "decay",
    # "until-fail" (Accept-Until-Fail) or "dpace" (expected accepted length's gradient)
    token_conditioned: bool = False  # cascade only: layer i+1 also reads the embedding of depth i's top-1 draft
    token_source: str = "draft"  # what token_conditioned layers read in training: "draft", depth i's own top-1;
    # "true", the sequence's own token there (what the deeper targets are conditioned on, and on the target's
    # greedy replies what depth i must draft for depth i+1 to count); drafting always reads its own top-1
    attention_window: int = 0  # cascade only: each layer attends over its last this many positions (0: all)
    current_token: bool = False  # cascade only: each row also reads its own position's token, not only the next
    # one, so one attention layer can match the token being continued and read the one after it (a copy)
    depth: int = 7  # EAGLE-3 style: unrolled training steps and draft tree depth; DFlash: the masks in a block;
    # parallel EAGLE: the longest chain one pass drafts (the bonus row and depth-1 mask rows)
    mask_token_id: int = 0  # DFlash, parallel EAGLE: the token id vLLM feeds mask rows (one the target never writes)
    draft_vocab: int = 0  # >0: draft only the most frequent tokens (EAGLE-3's reduced draft vocab)
    fingerprint: list[float] = field(default_factory=list)
    kind: str = "fasteagle"  # or "eagle3" (`fasteagle.eagle3`), "dflash" (`fasteagle.dflash`), "peagle"
    # EAGLE-3-style drafter only: "proj" (ours: a projection in front of a stock layer) or "eagle3" (EAGLE-3's
    # own: layer 0's attention reads [norm(embed); norm(hidden)], 2W wide; what `fasteagle.eagle3_format`
    # imports and exports), and the switches of that format (vLLM's `llama_eagle3.py` reads the same)
    layout: str = "proj"
    norm_before_residual: bool = False  # layer 0's residual is norm(hidden), not hidden
    norm_before_fc: bool = False  # one RMSNorm over the concatenated target features before `fc`
    fc_norm: bool = False  # one RMSNorm per target feature before `fc` (EAGLE 3.1; the cascade's too)
    norm_output: bool = False  # cascade: layer i+1 reads layer i's output after depth i's norm (EAGLE 3.1)
    kv_inject: bool = False  # cascade: every layer's keys and values come from the fused input (fc's output), not
    # the layer before; queries still flow down the cascade (`fasteagle.drafter`)
    attention_bias: bool = False
    own_head: bool = False  # an LM head of its own over the draft vocab (imported), not the target's
    own_embed: bool = False  # an embedding of its own (imported), not the target's

    @classmethod
    def for_target(cls, model: nn.Module, name: str, **overrides) -> DrafterConfig:
        c = model.config
        n = c.num_hidden_layers
        rope = getattr(c, "rope_parameters", None) or {}
        rope = rope.get("full_attention", rope)  # Gemma 3: one per layer type; the drafter's layers attend in full
        cfg = cls(
            target=name, target_hidden=c.hidden_size, vocab_size=c.vocab_size,
            feature_layers=[min(2, n), n // 2, max(n - 3, 1)],  # EAGLE-3's low / mid / high choice
            width=c.hidden_size, intermediate=c.intermediate_size, num_heads=c.num_attention_heads,
            num_kv_heads=getattr(c, "num_key_value_heads", c.num_attention_heads),
            head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
            rope_theta=float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
            rms_norm_eps=c.rms_norm_eps, max_positions=c.max_position_embeddings,
            fingerprint=target_fingerprint(model),
        )
        for k, v in overrides.items():
            if v is not None:
                setattr(cfg, k, v)
        return cfg

    def layer_config(self) -> LlamaConfig:
        lc = LlamaConfig(
            hidden_size=self.width, intermediate_size=self.intermediate, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim, num_hidden_layers=self.num_layers,
            rms_norm_eps=self.rms_norm_eps, max_position_embeddings=self.max_positions, vocab_size=self.vocab_size,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta} | self.rope,
            attention_bias=self.attention_bias,
        )
        lc._attn_implementation = "sdpa"
        return lc


def target_fingerprint(model: nn.Module) -> list[float]:
    """Norms of 16 fixed rows of the input embedding and the LM head: stable across dtypes and
    devices, different for any other model (compared with a relative tolerance)."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    rows = torch.linspace(0, emb.shape[0] - 1, 8).long()
    return [round(float(w[r].detach().float().norm()), 4) for w in (emb, head) for r in rows]


def peek(path: str | Path) -> tuple[dict, DrafterConfig, list[Path]]:
    """A drafter folder's config (raw and typed) and weight files, checked without reading the weights,
    so a missing or broken drafter fails before anything loads."""
    path = Path(path)
    files = sorted(path.glob("model*.safetensors")) if path.is_dir() else []
    if not (path / "config.json").is_file() or not files:
        raise FastEagleError(f"no drafter at {path}: expected a folder with config.json and model.safetensors")
    return (*read_config(path), files)


def read_config(path: str | Path) -> tuple[dict, DrafterConfig]:
    """A drafter directory's config.json, raw and as a DrafterConfig (without loading weights)."""
    from fasteagle.fields import from_json

    file = Path(path) / "config.json"
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FastEagleError(f"cannot read the drafter config {file}: {exc}") from None
    return raw, from_json(DrafterConfig, raw, f"the drafter config {file}")


def check_fingerprint(cfg: DrafterConfig, target_model: nn.Module) -> None:
    c = target_model.config
    if c.hidden_size != cfg.target_hidden or c.vocab_size != cfg.vocab_size:
        raise FastEagleError(
            f"this drafter was trained for {cfg.target} (hidden {cfg.target_hidden}, vocab {cfg.vocab_size}); "
            f"the loaded target has hidden {c.hidden_size}, vocab {c.vocab_size}"
        )
    if c.num_hidden_layers + 1 <= max(cfg.feature_layers):
        raise FastEagleError(f"this drafter reads target layer {max(cfg.feature_layers)}, the target has fewer")
    if cfg.fingerprint:
        got = torch.tensor(target_fingerprint(target_model))
        want = torch.tensor(cfg.fingerprint)
        if got.shape != want.shape or not torch.allclose(got, want, rtol=2e-2, atol=1e-3):
            raise FastEagleError(
                f"this drafter was trained for {cfg.target}, and the loaded target's embedding/LM-head "
                "weights differ: load the matching target or train a drafter for this one"
            )

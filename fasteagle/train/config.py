"""The training settings (`TrainConfig`): one dataclass for flags, --config files and recipes alike,
checked before any model loads."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fasteagle.errors import FastEagleError
from fasteagle.fields import check_types
from fasteagle.train.teacher import PROMPT_TAIL

__all__ = ["TrainConfig", "read_config_file"]


@dataclass
class TrainConfig:
    out: str
    target: str | None = None
    data: str | None = None  # a saved token dataset (fasteagle.train.data); None: build from ShareGPT
    holdout_data: str | None = None
    max_len: int = 1024
    limit: int | None = None  # use at most this many training conversations
    skip: int = 0  # pass over the first this many conversations kept (an earlier --limit run had them)
    english_only: bool = False  # skip ShareGPT conversations whose first prompt is not English
    distill: bool = False  # regenerate replies with the target first
    distill_max_new: int = 256
    prompt_tail: int = PROMPT_TAIL  # distillation keeps a prompt's last this many tokens
    distill_batch: int = 128
    distill_minutes: float | None = None
    distill_batches: int | None = None  # at most this many batches of distill_batch prompts (what a time-capped
    # run made, made again exactly: the same prompts in the same order, seeded sampling)
    distill_sample_every: int = 4  # every n-th distillation batch is sampled (temperature 0.7); 1: all, 0: none
    distill_only: bool = False  # stop once the data is written (distilled.pt, holdout_distilled.pt, shards)
    distill_engine: str = "ours"  # "vllm": replies by vLLM's batched generation (requirements-vllm.txt)
    features: str = "online"  # "online": teacher runs each step; "cache": fp16 shards on disk first
    feature_dir: str | None = None
    reuse_features: bool = False  # train on the shards already in feature_dir (same data, same teacher pass)
    extra_features: list[str] = field(default_factory=list)  # more shard dirs to train on (e.g. raw ShareGPT)
    shard_fraction: float = 1.0  # train on this share of feature_dir's shards, a draw by `seed` (data-scaling
    # tests); the extra_features folders stay whole
    extra_data: list[str] = field(default_factory=list)  # more token datasets to train on (e.g. a distilled.pt)
    init_from: str | None = None  # continue from a trained drafter directory (weights and draft vocab)
    drafter: str = "fasteagle"  # "fasteagle" (the cascade), "eagle3" (one layer, training-time test), "dflash" or
    # "peagle" (parallel EAGLE: EAGLE-3's layer drafting a chain in one pass over mask rows)
    num_layers: int = 6  # cascade layers = draft depths (fasteagle); decoder layers (dflash)
    depth: int = 7  # unrolled training steps = draft tree depth (eagle3); masks in a block (dflash); chain (peagle)
    layout: str = "eagle3"  # eagle3: EAGLE-3's own network, exportable to its format; "proj": ours before it
    intermediate: int = 768
    loss_decay: float = 0.8  # layer i's loss weight = loss_decay ** (i - 1)
    loss_targets: str = "soft"  # soft: the teacher's top-k distribution; hard: its top-1 token (DrafterBase.loss)
    fc_norm: bool = False  # new cascade or EAGLE-3 drafter: an RMSNorm per target feature before fc (EAGLE 3.1)
    norm_output: bool = False  # new cascade: each layer passes its normalized output to the next (EAGLE 3.1)
    kv_inject: bool = False  # new cascade: every layer's keys and values from the fused input, not the layer before
    loss_weights: str = "decay"  # decay (loss_decay ** (i-1)), until-fail (Accept-Until-Fail) or dpace (D-PACE's
    # expected accepted length gradient): `DrafterBase._depth_weights`; continuing a drafter, this run's applies
    token_conditioned: bool = False  # fasteagle: each layer also reads the token the layer before drafted
    token_source: str = "draft"  # that token in training: "draft" (its own top-1) or "true" (the sequence's)
    current_token: bool = False  # fasteagle: each row also reads its own token (`DrafterConfig.current_token`);
    # with init_from, a drafter without it grows it, its function unchanged at the start
    current_token_lr: float = 1.0  # its map `cur_fc` learns at lr times this: grown from zero beside trained
    # weights, at their learning rate it barely moves in a short run
    topk: int = 16
    draft_vocab: int = 0  # >0: the drafter drafts only this many most frequent reply tokens; with init_from,
    # a number above its draft vocab grows it (the vocabulary size or more: all of it)
    loss_vocab: int = 0  # >0: the loss's softmax covers the N most frequent reply tokens plus each batch's
    # teacher tokens, not the whole draft vocab (CPU fine-tuning of a whole-vocab drafter: ~5x less head work)
    keep_prompt: int = 64  # prompt tokens kept before each reply in distilled feature shards
    prompt_window: bool = False  # cached features of token data (vLLM's replies, text as written) keep only
    # keep_prompt tokens before each row's first reply token, as distilled shards do; the target reads them all
    lr: float = 5e-4
    warmup: int = 100
    schedule: str = "cosine"  # "cosine": anneal to zero over the run; "constant": hold lr after warmup, so a run
    # continued to a larger --max-steps goes on the same schedule (training curves, snapshots at budgets)
    weight_decay: float = 0.0
    clip: float = 0.5
    batch_tokens: int = 8192
    micro_batch: int = 0  # >0: sequences per optimizer step, cut from each cached shard
    epochs: float = 1.0
    max_steps: int | None = None
    minutes: float | None = None  # stop training after this wall time
    init_from_target: bool = True
    checkpoint_every: int = 500
    seed: int = 0
    device: str | None = None
    dtype: str | None = None
    mixed_precision: str = "auto"  # the drafter's matmuls in bf16 ("bf16"), or not ("no"); auto: bf16 on a GPU.
    # A CPU with AVX512-BF16 or AMX also runs them ~2x faster in bf16 (the weights and optimizer stay fp32)
    eval_sequences: int = 200
    shard_mb: float | None = None  # split model.safetensors into files of at most this size
    eval_initial: bool = True  # also evaluate the untrained drafter, to show what training bought

    def check(self) -> TrainConfig:
        """Refuse a setting of the wrong type or out of range, from a flag or a --config file alike,
        before any model loads (a bad value would otherwise fail deep in training, or never stop)."""
        def plain(v):  # paths given as Path objects (the API) pass as strings
            return os.fspath(v) if isinstance(v, os.PathLike) else [plain(x) for x in v] if isinstance(v, list) else v

        values = {k: plain(v) for k, v in asdict(self).items()}
        check_types(TrainConfig, values, "training setting")

        def refuse(name: str, rule: str) -> None:
            flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
            raise FastEagleError(f"{name} ({flag}) must be {rule}, not {values[name]!r}")

        for name, (low, rule) in _RANGES.items():
            v = values[name]
            if v is None and name in _OPTIONAL:
                continue
            if (isinstance(v, float) and not math.isfinite(v)) or v < low or (v == low and rule.startswith("above")):
                refuse(name, rule)
        if not self.seed < 2**63:
            refuse("seed", "below 2**63")
        if self.shard_fraction > 1:
            refuse("shard_fraction", "above 0 and at most 1")
        for name, choices in _CHOICES.items():
            if values[name] not in choices:
                refuse(name, " or ".join(choices))
        if self.norm_output and self.drafter != "fasteagle":
            raise FastEagleError(f"norm_output is a cascade's switch (drafter fasteagle), not {self.drafter}'s")
        if self.kv_inject and self.drafter != "fasteagle":
            raise FastEagleError(f"kv_inject is a cascade's switch (drafter fasteagle), not {self.drafter}'s")
        if self.fc_norm and self.drafter not in ("fasteagle", "eagle3", "peagle"):
            raise FastEagleError(f"fc_norm is for the cascade and EAGLE-3's layers, not {self.drafter}")
        if self.reuse_features and self.features != "cache":
            raise FastEagleError(f"--reuse-features needs --features cache, not {self.features!r}")
        if self.extra_data and (self.reuse_features or (self.distill and self.features == "cache")):
            raise FastEagleError("--add-data joins token datasets; with feature shards (--distill --features cache, "
                                 "--reuse-features) use --add-features instead")
        return self


_FLAGS = {"extra_data": "--add-data", "extra_features": "--add-features"}  # the rest: --name-with-dashes
_AT_LEAST_1 = ("max_len", "prompt_tail", "num_layers", "depth", "intermediate", "topk", "batch_tokens",
               "checkpoint_every", "distill_max_new", "distill_batch", "keep_prompt", "max_steps", "limit",
               "distill_batches")
_AT_LEAST_0 = ("skip", "draft_vocab", "loss_vocab", "micro_batch", "warmup", "distill_sample_every",
               "eval_sequences", "seed", "weight_decay", "lr")  # lr 0: evaluate a drafter as it is
_ABOVE_0 = ("epochs", "clip", "loss_decay", "minutes", "distill_minutes", "shard_mb", "shard_fraction")
_RANGES = ({n: (1, "at least 1") for n in _AT_LEAST_1} | {n: (0, "at least 0") for n in _AT_LEAST_0}
           | {n: (0, "above 0") for n in _ABOVE_0})
_OPTIONAL = ("max_steps", "limit", "minutes", "distill_minutes", "shard_mb", "distill_batches")  # None: no such limit
_CHOICES = {"features": ("online", "cache"), "drafter": ("fasteagle", "eagle3", "dflash", "peagle"),
            "layout": ("eagle3", "proj"), "distill_engine": ("ours", "vllm"), "loss_targets": ("soft", "hard"),
            "loss_weights": ("decay", "until-fail", "dpace"),
            "token_source": ("draft", "true"),
            "mixed_precision": ("auto", "bf16", "no"), "schedule": ("cosine", "constant")}


def read_config_file(path: str | Path) -> dict:
    """A --config file: a JSON object of TrainConfig fields (`out` in it gives way to --out)."""
    path = Path(path)
    if not path.is_file():
        raise FastEagleError(f"--config {path}: {'a folder' if path.is_dir() else 'no such file'}; "
                             "give a JSON file of training settings")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FastEagleError(f"--config {path} is not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
                             ) from None
    if not isinstance(raw, dict):
        raise FastEagleError(f"--config {path} must hold a JSON object of training settings, "
                             f"not a {type(raw).__name__}")
    unknown = sorted(set(raw) - set(TrainConfig.__dataclass_fields__))
    if unknown:
        raise FastEagleError(f"--config {path}: unknown setting {unknown[0]!r} (the settings are the fields of "
                             "TrainConfig in fasteagle/train/config.py)")
    return raw

"""Train a FastEagle drafter for a target: data -> (self-distillation) -> teacher -> layer-wise
training on `accelerate` (CPU, one GPU, or `accelerate launch` for several) -> holdout evaluation.

Read top to bottom: `train()` is the whole pipeline, one named stage after another, and each stage
follows it in that order.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from fasteagle import trace
from fasteagle.drafter import CascadedDrafter, DrafterConfig
from fasteagle.errors import FastEagleError
from fasteagle.fields import check_types
from fasteagle.files import check_writable, write_text
from fasteagle.methods import load_drafter
from fasteagle.train import data as data_mod
from fasteagle.train.teacher import (
    PROMPT_TAIL,
    Batch,
    cache_features,
    distill_features,
    length_batches,
    load_shard,
    micro_batches,
    pad_batch,
    self_distill,
    shard_stats,
    teach,
)
from fasteagle.tree import TREE_BUILDERS

if TYPE_CHECKING:
    from accelerate import Accelerator

    from fasteagle.target import Target


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
    drafter: str = "fasteagle"  # "fasteagle" (the cascade) or "eagle3" (one layer, training-time test)
    num_layers: int = 6  # cascade layers = draft depths (fasteagle)
    depth: int = 7  # unrolled training steps = draft tree depth (eagle3)
    layout: str = "eagle3"  # eagle3: EAGLE-3's own network, exportable to its format; "proj": ours before it
    intermediate: int = 768
    loss_decay: float = 0.8  # layer i's loss weight = loss_decay ** (i - 1)
    loss_targets: str = "soft"  # soft: the teacher's top-k distribution; hard: its top-1 token (DrafterBase.loss)
    token_conditioned: bool = False  # fasteagle: each layer also reads the token the layer before drafted
    topk: int = 16
    draft_vocab: int = 0  # >0: the drafter drafts only this many most frequent reply tokens; with init_from,
    # a number above its draft vocab grows it (the vocabulary size or more: all of it)
    loss_vocab: int = 0  # >0: the loss's softmax covers the N most frequent reply tokens plus each batch's
    # teacher tokens, not the whole draft vocab (CPU fine-tuning of a whole-vocab drafter: ~5x less head work)
    keep_prompt: int = 64  # prompt tokens kept before each reply in distilled feature shards
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
        if self.reuse_features and self.features != "cache":
            raise FastEagleError(f"--reuse-features needs --features cache, not {self.features!r}")
        if self.extra_data and (self.reuse_features or (self.distill and self.features == "cache")):
            raise FastEagleError("--add-data joins token datasets; with feature shards (--distill --features cache, "
                                 "--reuse-features) use --add-features instead")
        return self


_FLAGS = {"extra_data": "--add-data", "extra_features": "--add-features"}  # the rest: --name-with-dashes
_AT_LEAST_1 = ("max_len", "prompt_tail", "num_layers", "depth", "intermediate", "topk", "batch_tokens",
               "checkpoint_every", "distill_max_new", "distill_batch", "keep_prompt", "max_steps", "limit")
_AT_LEAST_0 = ("skip", "draft_vocab", "loss_vocab", "micro_batch", "warmup", "distill_sample_every",
               "eval_sequences", "seed", "weight_decay", "lr")  # lr 0: evaluate a drafter as it is
_ABOVE_0 = ("epochs", "clip", "loss_decay", "minutes", "distill_minutes", "shard_mb", "shard_fraction")
_RANGES = ({n: (1, "at least 1") for n in _AT_LEAST_1} | {n: (0, "at least 0") for n in _AT_LEAST_0}
           | {n: (0, "above 0") for n in _ABOVE_0})
_OPTIONAL = ("max_steps", "limit", "minutes", "distill_minutes", "shard_mb")  # None: no such limit
_CHOICES = {"features": ("online", "cache"), "drafter": ("fasteagle", "eagle3"), "layout": ("eagle3", "proj"),
            "distill_engine": ("ours", "vllm"), "loss_targets": ("soft", "hard"),
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
                             "TrainConfig in fasteagle/train/trainer.py)")
    return raw


def train(cfg: TrainConfig, target=None, command: str | None = None) -> Path:
    """The whole pipeline, stage by stage; `target` (a loaded `Target`) overrides `cfg.target` (tests
    pass a tiny one); `command`, the command line that ran it, goes into the model card."""
    run = start(cfg, target)

    # 1. data: ShareGPT (or a saved dataset), optionally rewritten by the target itself
    train_data = distill(run, token_data(run))
    holdout = holdout_data(run)
    train_data = trainable(run, train_data)

    # 2. teacher: the target's features and top-k, once into fp16 shards (--features cache) or per batch
    shards = feature_shards(run, train_data)
    if cfg.distill_only:
        run.accel.print(f"distilled data written to {run.out} ({sum(map(len, shards.values()))} feature shards)")
        return run.out

    # 3. drafter: a trained one to continue, or started from the target's top layers, with a draft
    #    vocab from reply frequencies
    replies = reply_stats(run, train_data, shards)
    drafter, before = make_drafter(run, replies.counts)

    # 4. optimise: AdamW over this process's share of the batches, on from the last checkpoint if any
    batches = Batches(run, train_data, shards, replies.rows_per_shard)
    per_process = math.ceil(len(batches) / run.accel.num_processes)  # each process trains on its share
    total_steps = cfg.max_steps or max(1, int(cfg.epochs * per_process))
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    drafter, opt = run.accel.prepare(drafter, opt)
    raw = run.accel.unwrap_model(drafter)
    progress = resume(run)
    initial = evaluate(raw, run.model, holdout, cfg.eval_sequences, cfg.max_len, raw.tree_k) \
        if holdout is not None and cfg.eval_initial and progress.step == 0 else {}
    optimise(run, drafter, opt, batches, progress, total_steps)

    # 5. evaluate and save
    metrics = {}
    if holdout is not None:
        metrics = evaluate(raw, run.model, holdout, cfg.eval_sequences, cfg.max_len, raw.tree_k)
        run.accel.print(json.dumps(metrics, indent=1))
    if run.accel.is_main_process:
        info = run_info(run, progress, progress.step / per_process, replies, before, command)
        save_run(run, raw, info | {"holdout": metrics, "holdout_initial": initial}, progress.history)
    return run.out


@dataclass
class Run:
    """What every stage of a training run reads: its settings, the accelerator (device and
    processes), the target, the drafter's config and class, and where it writes."""

    cfg: TrainConfig
    accel: Accelerator
    target: Target
    dcfg: DrafterConfig
    drafter_cls: type
    out: Path
    fdir: Path  # the feature shards (--features cache)
    t_start: float  # time.monotonic() once the target is loaded

    @property
    def model(self) -> torch.nn.Module:
        return self.target.model


def start(cfg: TrainConfig, target=None) -> Run:
    """Every setting and path checked, the seed set, the accelerator and the target up, the drafter's
    config made for the target."""
    from accelerate import Accelerator, DistributedDataParallelKwargs

    from fasteagle.target import load_target

    cfg.check()
    out = check_writable(cfg.out, "--out", directory=True)  # made when the first file is written
    if cfg.features == "cache" and not cfg.reuse_features:
        check_writable(cfg.feature_dir or out / "features", "--feature-dir", directory=True)
    for path in (cfg.data, cfg.holdout_data, *cfg.extra_data):
        if path and not Path(path).exists():
            raise FastEagleError(f"no token dataset at {path}; build one first (python -m fasteagle.train.data)")
    torch.manual_seed(cfg.seed)
    # a batch whose replies end early leaves the deepest layers without a loss (`CascadedDrafter.loss`
    # skips them): under several processes DDP must expect parameters without gradients
    accel = Accelerator(mixed_precision=mixed_precision(cfg), cpu=cfg.device == "cpu",
                        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    target = target or load_target(cfg.target, device=accel.device, dtype=cfg.dtype)
    t_start = time.monotonic()

    model = target.model
    vocab_size = model.config.vocab_size
    if cfg.topk > vocab_size:
        raise FastEagleError(f"topk must be at most the target's vocabulary ({vocab_size} tokens), not {cfg.topk}")
    dcfg = DrafterConfig.for_target(model, target.name, num_layers=cfg.num_layers, intermediate=cfg.intermediate,
                                    loss_decay=cfg.loss_decay, loss_targets=cfg.loss_targets,
                                    token_conditioned=cfg.token_conditioned and cfg.drafter == "fasteagle",
                                    # a draft vocab of them all is the whole one: 0
                                    draft_vocab=cfg.draft_vocab if cfg.draft_vocab < vocab_size else 0)
    drafter_cls = CascadedDrafter
    if cfg.drafter == "eagle3":
        from fasteagle.eagle3 import AutoregressiveDrafter

        drafter_cls, dcfg = AutoregressiveDrafter, AutoregressiveDrafter.config_for(dcfg, cfg.depth)
        dcfg.layout = cfg.layout
    elif cfg.drafter != "fasteagle":
        raise FastEagleError(f"unknown drafter {cfg.drafter!r}; use fasteagle or eagle3")
    return Run(cfg, accel, target, dcfg, drafter_cls, out, Path(cfg.feature_dir or out / "features"), t_start)


def token_data(run: Run) -> dict | None:
    """The training conversations as token ids: a saved dataset or ShareGPT's train split (None:
    --reuse-features, another run's shards stand in for them)."""
    cfg = run.cfg
    if cfg.reuse_features:  # another run's shards: the same data through the same teacher pass
        if not any(run.fdir.glob("shard-*.pt")):
            raise FastEagleError(f"--reuse-features needs --features cache and shards in {run.fdir}")
        return None
    if cfg.data:  # a saved dataset: --skip/--limit select its records as they select conversations
        train_data = data_mod.load_token_dataset(cfg.data, skip=cfg.skip or 0, limit=cfg.limit or None)
    else:
        train_data = data_mod.build_token_dataset(run.target.tokenizer, "train", max_len=cfg.max_len,
                                                  limit=cfg.limit, english_only=cfg.english_only, skip=cfg.skip)
    if not train_data["input_ids"] and not cfg.extra_data:
        raise no_data(cfg)
    return train_data


def distill(run: Run, train_data: dict | None) -> dict | None:
    """With --distill, the replies rewritten by the target from the same prompts (saved as
    OUT/distilled.pt, reused by a rerun); with --features cache too, straight into feature shards
    (then None: the shards are the data)."""
    cfg, out, model, tok = run.cfg, run.out, run.model, run.target.tokenizer
    if not cfg.distill or train_data is None:
        return train_data
    budget = cfg.distill_minutes * 60 if cfg.distill_minutes else None
    prompts = [p[-cfg.prompt_tail:] for p in train_data["prompt_ids"]]
    if cfg.distill_engine == "vllm":  # vLLM writes the replies; their features come after, as for any text
        return vllm_distill(run, prompts, budget)
    if cfg.features == "cache":  # one target pass yields both the replies and their features
        distill_features(model, tok, prompts, run.fdir, run.dcfg.feature_layers, cfg.distill_max_new,
                         cfg.distill_batch, budget, sample_every=cfg.distill_sample_every,
                         topk=cfg.topk, keep_prompt=cfg.keep_prompt, seed=cfg.seed)
        return None
    if (out / "distilled.pt").exists():
        # a rerun in the same --out (after --distill-only, or resuming) trains on what was written
        run.accel.print(f"reusing {out / 'distilled.pt'} (delete it to distill again)")
        return data_mod.load_token_dataset(out / "distilled.pt")
    train_data = self_distill(model, tok, prompts, cfg.distill_max_new, cfg.distill_batch, budget,
                              sample_every=cfg.distill_sample_every, seed=cfg.seed)
    if not train_data["input_ids"] and not cfg.extra_data:
        raise no_data(cfg, distilled=True)
    data_mod.save_token_dataset(train_data, out / "distilled.pt")
    return train_data


def vllm_distill(run: Run, prompts: list[list[int]], budget: float | None) -> dict:
    """The replies made by vLLM (`fast_replies`), saved as OUT/distilled.pt (reused by a rerun)."""
    from fasteagle.train.fast_replies import vllm_replies

    cfg, path = run.cfg, run.out / "distilled.pt"
    if path.exists():
        run.accel.print(f"reusing {path} (delete it to distill again)")
        return data_mod.load_token_dataset(path)
    train_data = vllm_replies(cfg.target, run.target.tokenizer, prompts, cfg.distill_max_new, cfg.distill_batch,
                              budget, sample_every=cfg.distill_sample_every, seed=cfg.seed)
    if not train_data["input_ids"] and not cfg.extra_data:
        raise no_data(cfg, distilled=True)
    data_mod.save_token_dataset(train_data, path)
    return train_data


def holdout_data(run: Run) -> dict | None:
    """The evaluation conversations, with --distill the target's own greedy replies to them
    (OUT/holdout_distilled.pt, reused by a rerun); None without --holdout-data."""
    cfg = run.cfg
    holdout = data_mod.load_token_dataset(cfg.holdout_data) if cfg.holdout_data else None
    if holdout is None or not cfg.distill:
        return holdout
    return greedy_replies(run.model, run.target.tokenizer, lambda: holdout["prompt_ids"][: cfg.eval_sequences],
                          cfg, run.out / "holdout_distilled.pt")


def greedy_replies(model, tokenizer, prompt_ids: Callable[[], list[list[int]]], cfg: TrainConfig, path: Path) -> dict:
    """The target's greedy replies to the prompts `prompt_ids()` gives (each cut to its last `prompt_tail`
    tokens, `distill_max_new` at most, in batches of `distill_batch`): written to `path` once, read back
    after (the prompts are not asked for then)."""
    if path.exists():
        return data_mod.load_token_dataset(path)
    replies = self_distill(model, tokenizer, [p[-cfg.prompt_tail:] for p in prompt_ids()], cfg.distill_max_new,
                           cfg.distill_batch, sample_every=0)
    data_mod.save_token_dataset(replies, path)
    return replies


def trainable(run: Run, train_data: dict | None) -> dict | None:
    """The token data joined with --add-data's, less the records that teach nothing; an error if
    none is left."""
    cfg = run.cfg
    if cfg.extra_data and train_data is not None and not cfg.distill_only:  # e.g. greedy and sampled replies
        train_data = data_mod.join_token_datasets(train_data, *map(data_mod.load_token_dataset, cfg.extra_data))
    if train_data is None:
        return None
    if not train_data["input_ids"]:
        raise no_data(cfg, distilled=cfg.distill)
    train_data = with_replies(train_data, cfg.max_len)
    if not train_data["input_ids"]:
        raise FastEagleError(f"no training data left: no record has a reply token the loss can count within "
                             f"its first {cfg.max_len} tokens (--max-len)")
    return train_data


def feature_shards(run: Run, train_data: dict | None) -> dict[Path, list[Path]]:
    """With --features cache, the feature shards to train on per folder (the token data's, written
    now unless there already, then --add-features' folders); empty: the teacher runs online."""
    cfg = run.cfg
    if cfg.features == "cache" and train_data is not None:
        cache_features(run.model, train_data, run.fdir, run.dcfg.feature_layers, cfg.batch_tokens, cfg.topk)
    dirs = [run.fdir] + [Path(d) for d in cfg.extra_features] if cfg.features == "cache" else []
    shards_by_dir = {d: sorted(d.glob("shard-*.pt")) for d in dirs}
    if dirs and cfg.shard_fraction < 1:  # a seeded draw, not the first ones: the shards are sorted by length
        mine = shards_by_dir[run.fdir]
        keep = torch.randperm(len(mine), generator=torch.Generator().manual_seed(cfg.seed))
        shards_by_dir[run.fdir] = [mine[i] for i in sorted(keep[:math.ceil(cfg.shard_fraction * len(mine))].tolist())]
    for d in dirs[1:]:
        if not shards_by_dir[d]:
            raise FastEagleError(f"no feature shards in {d} (extra_features)")
    if dirs and not any(shards_by_dir.values()):
        raise FastEagleError(f"no feature shards in {run.fdir}: the distillation kept no replies (each needs 4 "
                             "tokens or more); give it more time or tokens (--distill-minutes, --distill-max-new)")
    return shards_by_dir


@dataclass
class ReplyStats:
    """The reply tokens a run trains on: how often each token occurs (indexed by token id), the
    sequences in each feature shard, and the tokens of each feature folder."""

    counts: torch.Tensor
    rows_per_shard: list[int] = field(default_factory=list)
    tokens_per_dir: dict[str, int] = field(default_factory=dict)


def reply_stats(run: Run, train_data: dict | None, shards_by_dir: dict[Path, list[Path]]) -> ReplyStats:
    """Counted in the feature shards when there are any, else in the token data's loss masks."""
    vocab_size = run.dcfg.vocab_size
    if not shards_by_dir:
        return ReplyStats(data_mod.reply_counts(train_data, vocab_size))
    stats = ReplyStats(torch.zeros(vocab_size, dtype=torch.long))
    for d, shards in shards_by_dir.items():
        c, rows = shard_stats(shards, vocab_size)
        stats.counts, stats.rows_per_shard = stats.counts + c, stats.rows_per_shard + rows
        stats.tokens_per_dir[str(d)] = int(c.sum())
    return stats


def make_drafter(run: Run, counts: torch.Tensor) -> tuple[CascadedDrafter, dict]:
    """The drafter to train, attached to the target: --init-from's, grown to the asked MLP width and
    draft vocab, or a new one started from the target's top layers with the most frequent reply
    tokens as its draft vocab. Also returns the steps and minutes it had been trained before."""
    cfg, dcfg, model, accel = run.cfg, run.dcfg, run.model, run.accel
    n_tokens = int(counts.sum())
    before = {"steps_all": 0, "train_minutes_all": 0.0}  # what the drafter we continue had already had
    if cfg.init_from:
        drafter = load_drafter(cfg.init_from).attach(model)
        t0 = drafter.info.get("training") or {}
        before = {"steps_all": t0.get("steps_all", t0.get("steps", 0)),
                  "train_minutes_all": t0.get("train_minutes_all", t0.get("train_minutes", 0.0))}
        if drafter.cfg.kind != dcfg.kind:
            raise FastEagleError(f"{cfg.init_from} holds a {drafter.cfg.kind} drafter; this run trains {dcfg.kind}")
        accel.print(f"continuing from {cfg.init_from} ({before['steps_all']} steps)")
        if drafter.cfg.kind == "eagle3" and drafter.cfg.layout != dcfg.layout == "eagle3":
            accel.print("moving it to EAGLE-3's layout (layer 0 reads [embed; hidden]; training goes on from there)")
            drafter = drafter.to_eagle3_layout()
        if cfg.intermediate > drafter.cfg.intermediate:  # more capacity, same function to start from
            accel.print(f"widening its MLP from {drafter.cfg.intermediate} to {cfg.intermediate} channels")
            drafter.grow_mlp(cfg.intermediate, model)
        if drafter.cfg.draft_vocab and cfg.draft_vocab > drafter.cfg.draft_vocab:  # 0: it has them all already
            accel.print(f"growing its draft vocab from {drafter.cfg.draft_vocab} to "
                        f"{min(cfg.draft_vocab, dcfg.vocab_size)} tokens")
            drafter.grow_vocab(cfg.draft_vocab, counts)
    else:
        drafter = run.drafter_cls(dcfg).attach(model)
        if cfg.init_from_target:
            drafter.init_from_target(model)
        if dcfg.draft_vocab:
            drafter.set_vocab(counts)
    if drafter.cfg.draft_vocab:
        accel.print(f"draft vocab covers {float(counts[drafter.vocab_ids.cpu()].sum() / max(1, n_tokens)):.1%} "
                    "of reply tokens")
    accel.print(f"training on {n_tokens} reply tokens")
    if cfg.loss_vocab:
        top_counts, top_ids = counts.sort(descending=True)
        frequent = drafter.to_draft_ids(top_ids[: cfg.loss_vocab].to(drafter.vocab_ids.device))
        drafter.loss_vocab = frequent[frequent >= 0].sort().values
        share = float(top_counts[: cfg.loss_vocab].sum()) / max(1, n_tokens)
        accel.print(f"loss over {drafter.loss_vocab.numel()} frequent draft tokens + each batch's teacher tokens "
                    f"(they hold {share:.1%} of reply tokens)")
    return drafter, before


class Batches:
    """A run's batches, epoch by epoch: micro-batches cut from the cached feature shards, or token
    batches of similar lengths that the target teaches as they come."""

    def __init__(self, run: Run, train_data: dict | None, shards_by_dir: dict[Path, list[Path]],
                 rows_per_shard: list[int]):
        cfg = run.cfg
        self.run, self.data, self.rows_per_shard = run, train_data, rows_per_shard
        self.shards = [s for shards in shards_by_dir.values() for s in shards]
        self.groups: list[list[int]] = []  # token batches (no shards): indices into train_data
        if self.shards:
            self.count = (sum(math.ceil(r / cfg.micro_batch) for r in rows_per_shard) if cfg.micro_batch
                          else len(self.shards))
        else:
            self.groups = length_batches([len(s) for s in train_data["input_ids"]], cfg.batch_tokens,
                                         shuffle_seed=cfg.seed)
            self.count = len(self.groups)

    def __len__(self) -> int:
        return self.count

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        """This process's batches of an epoch, after its first `skip` (a resumed run's). Each shard
        shuffles its micro-batches with its own generator, so skipping needs no shard loaded."""
        cfg, accel, shards = self.run.cfg, self.run.accel, self.shards
        g = torch.Generator().manual_seed(cfg.seed + epoch)
        order = torch.randperm(len(shards) if shards else self.count, generator=g).tolist()
        for b in process_share(order, accel.process_index, accel.num_processes):
            if shards:
                n_micro = math.ceil(self.rows_per_shard[b] / cfg.micro_batch) if cfg.micro_batch else 1
                if skip >= n_micro:
                    skip -= n_micro
                    continue
                shard_g = torch.Generator().manual_seed(cfg.seed + 1_000_003 * (epoch + 1) + b)
                for micro in micro_batches(load_shard(shards[b]), cfg.micro_batch, shard_g)[skip:]:
                    yield micro.to(accel.device)
                skip = 0
                continue
            if skip:
                skip -= 1
                continue
            idx = self.groups[b]
            ids, mask = pad_batch([self.data["input_ids"][i][: cfg.max_len] for i in idx],
                                  [self.data["loss_mask"][i][: cfg.max_len] for i in idx])
            ids = ids.to(accel.device)
            feats, t_ids, t_p = teach(self.run.model, ids, self.run.dcfg.feature_layers, cfg.topk)
            yield Batch(ids, mask.to(accel.device), feats, t_ids, t_p)


@dataclass
class Progress:
    """Where the optimisation stands (what a checkpoint saves and a resumed run restores), and the
    loss and accuracy it logged."""

    step: int = 0
    epoch: int = 0
    in_epoch: int = 0  # batches of the epoch done
    trained_s: float = 0.0  # wall time spent training, a resumed run's earlier part included
    tokens: int = 0  # reply tokens the loss has counted so far (a resumed run's earlier part included)
    history: list[dict] = field(default_factory=list)


def resume(run: Run) -> Progress:
    """A cut-off run's last checkpoint: the weights, optimizer and RNGs restored in place, and where
    the data and the clock stood (a fresh run: the start)."""
    ckpt = run.out / "checkpoint"
    if not (ckpt / "state.json").exists():
        return Progress()
    state = json.loads((ckpt / "state.json").read_text())
    run.accel.load_state(str(ckpt / state.get("dir", ".")))  # no "dir": a checkpoint saved in place before
    progress = Progress(step=state["step"], epoch=state.get("epoch", 0), in_epoch=state.get("in_epoch", 0),
                        trained_s=state.get("train_seconds", 0.0), tokens=state.get("tokens", 0))
    run.accel.print(f"resumed at step {progress.step} (epoch {progress.epoch}, batch {progress.in_epoch}, "
                    f"{progress.trained_s / 60:.1f} min trained)")
    return progress


def optimise(run: Run, drafter, opt, batches: Batches, progress: Progress, total_steps: int) -> None:
    """Train until `total_steps` or --minutes, epoch after epoch, logging every 10 steps and saving a
    checkpoint every `checkpoint_every` and where it stops (a later run with more steps goes on from
    there); `progress` advances as it goes."""
    cfg, accel = run.cfg, run.accel
    bar = tqdm(total=total_steps, initial=progress.step, desc="train", disable=not accel.is_main_process)
    t_train = time.monotonic() - progress.trained_s  # a resumed run's schedule and time budget go on, not restart

    def out_of_time() -> bool:
        return bool(cfg.minutes) and time.monotonic() - t_train > cfg.minutes * 60

    unread = 0  # reply tokens of the steps since progress.tokens was last brought up to date, on the device:
    # reading them every step would wait for the GPU every step

    def count_tokens() -> None:
        nonlocal unread
        progress.tokens, unread = progress.tokens + int(unread), 0

    def checkpoint() -> None:
        count_tokens()
        save_checkpoint(accel, run.out / "checkpoint",
                        {"step": progress.step, "epoch": progress.epoch, "in_epoch": progress.in_epoch,
                         "train_seconds": round(time.monotonic() - t_train, 3), "tokens": progress.tokens})

    start, done = progress.step, progress.step >= total_steps or out_of_time()
    while not done:
        for batch in batches.epoch(progress.epoch, progress.in_epoch):
            progress.in_epoch += 1
            with accel.autocast():  # through forward(), so that DDP syncs gradients
                loss, stats = drafter(batch.feats, batch.input_ids, batch.loss_mask, batch.teacher_ids,
                                      batch.teacher_probs)
            accel.backward(loss)
            accel.clip_grad_norm_(drafter.parameters(), cfg.clip)
            for group in opt.param_groups:
                group["lr"] = lr_at(cfg, progress.step, total_steps, time.monotonic() - t_train)
            opt.step()
            opt.zero_grad(set_to_none=True)
            progress.step += 1
            unread = unread + batch.loss_mask.sum()
            bar.update(1)
            if progress.step % 10 == 0:
                count_tokens()
                progress.history.append({"step": progress.step, "tokens": progress.tokens,
                                         "loss": float(loss.detach())} | stats)
                bar.set_postfix(loss=f"{float(loss.detach()):.3f}", acc1=f"{stats.get('acc1', 0):.2f}")
            if progress.step % cfg.checkpoint_every == 0:
                checkpoint()
            if progress.step >= total_steps or out_of_time():
                done = True
                break
        else:  # the epoch ran out (a resumed run's may have been done already: in_epoch > 0)
            if progress.in_epoch == 0:
                raise FastEagleError(f"an epoch gave this process no batch to train on ({len(batches)} batches "
                                     f"for {accel.num_processes} processes); give it more data")
            progress.epoch, progress.in_epoch = progress.epoch + 1, 0
            done = out_of_time()
    bar.close()
    count_tokens()
    if progress.step > start and progress.step % cfg.checkpoint_every:
        checkpoint()
    progress.trained_s = time.monotonic() - t_train


def run_info(run: Run, progress: Progress, epochs_done: float, replies: ReplyStats, before: dict,
             command: str | None) -> dict:
    """The run's settings and what it did, saved as `training` in the drafter's config.json."""
    cfg, accel = run.cfg, run.accel
    train_minutes = progress.trained_s / 60
    return {"training": asdict(cfg) | {
        "steps": progress.step, "epochs_done": epochs_done, "train_tokens": int(replies.counts.sum()),
        "tokens_trained": progress.tokens,
        "tokens_per_feature_dir": replies.tokens_per_dir, "train_minutes": round(train_minutes, 2),
        "total_minutes": round((time.monotonic() - run.t_start) / 60, 2),
        "device": torch.cuda.get_device_name() if accel.device.type == "cuda" else "cpu",
        "command": command, "steps_all": before["steps_all"] + progress.step,
        "train_minutes_all": round(before["train_minutes_all"] + train_minutes, 2),
    }}


def save_run(run: Run, drafter: CascadedDrafter, info: dict, history: list[dict]) -> None:
    """The drafter's weights and config, its model card, the loss history and the evaluation."""
    out = run.out
    drafter.save(out, extra=info, shard_mb=run.cfg.shard_mb)
    write_text(out / "README.md", model_card(drafter, info))
    write_text(out / "history.json", json.dumps(history))
    write_text(out / "eval.json", json.dumps({"holdout": info["holdout"], "holdout_initial": info["holdout_initial"]},
                                             indent=2))


def no_data(cfg: TrainConfig, distilled: bool = False) -> FastEagleError:
    """The error for a run left with no record to train on (an empty epoch would loop forever)."""
    where = cfg.data or "ShareGPT's train split"
    after = f" after the first {cfg.skip} (--skip)" if cfg.skip else ""
    if distilled:
        return FastEagleError("no training data left: the self-distillation kept no replies (each needs 4 tokens "
                              "or more); give it more time or tokens (--distill-minutes, --distill-max-new)")
    return FastEagleError(f"no training data left: {where} has no records{after}" + ("; lower --skip" if after else ""))


def with_replies(data: dict, max_len: int) -> dict:
    """The records with a reply token the loss counts within their first `max_len` tokens (from
    position 2 on: depth 1 predicts the token two ahead of its feature); the others teach nothing."""
    keep = [i for i, m in enumerate(data["loss_mask"]) if any(m[2:max_len])]
    return data if len(keep) == len(data["loss_mask"]) else \
        {k: [v[i] for i in keep] if isinstance(v, list) else v for k, v in data.items()}


def save_checkpoint(accel, ckpt: Path, state: dict) -> None:
    """Save the run's state into a folder of its own, then point `ckpt/state.json` at it in one rename,
    then remove the older folders: a run killed while saving resumes from the checkpoint before."""
    name = f"step-{state['step']:08d}"
    accel.save_state(str(ckpt / name))
    accel.wait_for_everyone()
    if accel.is_main_process:
        write_text(ckpt / "state.json", json.dumps(state | {"dir": name}))
        for old in ckpt.glob("step-*"):
            if old.name != name and old.is_dir():
                shutil.rmtree(old)


def mixed_precision(cfg: TrainConfig) -> str:
    """accelerate's mixed-precision mode for this run; refuses a mode it does not know."""
    if cfg.mixed_precision not in ("auto", "bf16", "no"):
        raise FastEagleError(f"mixed_precision must be auto, bf16 or no, not {cfg.mixed_precision!r}")
    if cfg.mixed_precision != "auto":
        return cfg.mixed_precision
    return "bf16" if torch.cuda.is_available() and cfg.device != "cpu" else "no"


def model_card(drafter: CascadedDrafter, info: dict) -> str:
    """A short model card written next to the weights from what the run measured."""
    t, h, h0 = info["training"], info.get("holdout") or {}, info.get("holdout_initial") or {}
    c, per_dir = drafter.cfg, t.get("tokens_per_feature_dir") or {}
    shape = (f"{c.num_layers} cascaded decoder layers" if c.kind == "fasteagle"
             else f"1 decoder layer unrolled {c.depth} times (training-time test)")
    lines = [
        f"# {c.kind} drafter for {c.target}", "",
        f"- architecture: {shape}, width {c.width}, MLP {c.intermediate}, features from target layers "
        f"{c.feature_layers}, draft vocab {c.draft_vocab or c.vocab_size} tokens, loss decay {c.loss_decay}",
        f"- data: {'self-distilled' if t.get('distill') and len(per_dir) < 2 else 'ShareGPT'} replies, "
        f"{t['train_tokens']} training (reply) tokens; holdout: {h.get('positions', 0)} positions of the ShareGPT "
        "holdout split",
        *(["- feature shards: " + ", ".join(f"`{d}` ({n} reply tokens)" for d, n in per_dir.items())]
          if len(per_dir) > 1 else []),
        *([f"- continued from `{t['init_from']}`: {t['steps_all']} steps and {t['train_minutes_all']} min of "
            "training in all"] if t.get("init_from") else []),
        f"- training: {t['steps']} steps ({t['epochs_done']:.2f} epochs), lr {t['lr']}, "
        + (f"micro-batches of {t['micro_batch']} sequences" if t.get("micro_batch") else
           f"batch {t['batch_tokens']} tokens (feature shards of {t['distill_batch']} sequences when distilled)"),
        f"- hardware: {t['device']}; wall time {t['total_minutes']} min in all, {t['train_minutes']} min training",
        "", "## Holdout acceptance (teacher-forced, greedy self-distilled replies)", "",
        "| depth | " + " | ".join(str(i + 1) for i in range(len(h.get("depth_top1_given_spine", [])))) + " |",
        "|---|" + "---|" * len(h.get("depth_top1_given_spine", [])),
        "| top-1 acceptance given the spine so far | " + " | ".join(f"{x:.3f}" for x in
                                                          h.get("depth_top1_given_spine", [])) + " |",
        "| top-k (side leaves) | " + " | ".join(f"{x:.3f}" for x in h.get("depth_topk_given_spine", [])) + " |",
        "",
        f"Expected accepted length of the backbone tree (tau, bonus token included): {h.get('tau_backbone')} "
        f"({'the drafter this run continued' if t.get('init_from') else 'untrained start'}: "
        f"{h0.get('tau_backbone')}).",
        *([f"Greedy decoding replayed over these replies with trees of {h['tau_replay_budget']} nodes: tau "
           + ", ".join(f"{v} ({k} tree)" for k, v in h["tau_replay"].items()) + "."] if h.get("tau_replay") else []),
        "", "## Reproduce", "", "```bash", t.get("command") or "python -m fasteagle train ...", "```", "",
        "Training settings are in `config.json` (`training`); the per-step loss and accuracy are in `history.json`.",
    ]
    return "\n".join(lines) + "\n"


def process_share(order: list[int], index: int, count: int) -> list[int]:
    """Process `index` of `count` (data parallel training) takes every count-th batch of the epoch's
    order; one process takes all of them."""
    return order[index::count]


def lr_at(cfg: TrainConfig, step: int, total_steps: int, elapsed_s: float) -> float:
    """Linear warmup, then cosine to zero over the run (or, with schedule "constant", the peak lr
    held); with a time budget, progress is whichever of steps or wall time is further along, so a
    timed run still anneals."""
    warm = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup))
    if cfg.schedule == "constant":
        return warm
    progress = step / total_steps
    if cfg.minutes:
        progress = max(progress, elapsed_s / (cfg.minutes * 60))
    return warm * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def evaluate(drafter: CascadedDrafter, model, data: dict, n: int, max_len: int, k: int | list[int] = 10,
             budget: int = 60) -> dict:
    """Teacher-forced holdout metrics: per-depth top-1 agreement with the target's argmax, and the
    expected accepted length of the greedy backbone tree (spine top-1, side leaves top-k) per
    position, assuming the sequence is what the target itself would say (self-distilled text).

    `tau_replay` is greedy decoding's own tau with trees of `budget` nodes, per tree shape: the
    holdout replies are the target's greedy output, so walking each reply step by step (draft at
    the last accepted position, accept the longest tree path the reply follows, move on) is
    exactly what speculative decoding would do, without running the target per step.
    """
    drafter.eval()
    dev = next(model.parameters()).device
    N = drafter.num_depths
    ks = [k] * N if isinstance(k, int) else (list(k) + [1] * N)[:N]
    spine_hits = torch.zeros(N)
    leaf_hits = torch.zeros(N)
    counted = 0
    taus = []
    walks = {shape: [0, 0] for shape in TREE_BUILDERS}  # tokens, steps
    for i in tqdm(range(min(n, len(data["input_ids"]))), desc="evaluate"):
        ids = torch.tensor(data["input_ids"][i][:max_len], device=dev)[None]
        mask = torch.tensor(data["loss_mask"][i][:max_len], device=dev)[None].bool()
        L = ids.shape[1]
        if L < N + 3:
            continue
        feats, t_ids, _ = teach(model, ids, drafter.cfg.feature_layers, 1)
        target_top1 = t_ids[0, :, 0]  # target's argmax at each position
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            outs = drafter.depth_outputs(feats[:, :-1].to(drafter.fc.weight.dtype), ids[:, 1:])
        T = L - 1 - N  # start positions with every depth defined
        spine = torch.zeros(N, T, dtype=torch.bool, device=dev)
        leaf = torch.zeros(N, T, dtype=torch.bool, device=dev)
        logits_all = [drafter.head(outs[d][0], d + 1).float() for d in range(N)]  # every position, each depth
        for d in range(1, N + 1):
            logits = logits_all[d - 1][:T]
            want = drafter.to_draft_ids(target_top1[d:d + T])  # -1 (never matched) outside the vocab
            spine[d - 1] = logits.argmax(-1) == want
            leaf[d - 1] = (logits.topk(ks[d - 1], -1).indices == want[:, None]).any(-1)
        kmax = max(ks)
        tops = [logits.softmax(-1).topk(kmax, -1) for logits in logits_all]
        top_p = torch.stack([t.values for t in tops], 1).cpu()  # (L-1, N, kmax)
        top_i = drafter.vocab_ids[torch.stack([t.indices for t in tops], 1)].cpu()
        seq, reply = ids[0].tolist(), mask[0].tolist()
        for shape, walk in walks.items():
            draft = drafted_trees(TREE_BUILDERS[shape], seq, top_i, top_p, ks, budget)
            tokens, steps = trace.replay_walk(seq, reply, draft)
            walk[0] += tokens
            walk[1] += steps
        valid = mask[0, 1:1 + T] & mask[0, 1 + N:1 + N + T]  # the root and the deepest draft lie in the reply
        if not bool(valid.any()):
            continue
        # accepted drafts = leading spine hits, plus one if a side leaf catches the first miss
        run = torch.cumprod(spine.int(), 0)  # (N, T): 1 while every depth so far matched
        lead = run.sum(0)
        miss = lead.clamp(max=N - 1)
        extra = (lead < N) & leaf[miss, torch.arange(T, device=dev)]
        acc_len = lead + extra.int()
        taus.append((acc_len[valid] + 1).float().cpu())
        reach = torch.cat([torch.ones(1, T, dtype=torch.int, device=dev), run[:-1]])  # depth d reached via spine
        spine_hits += (spine & reach.bool() & valid).sum(1).cpu().float()
        leaf_hits += (leaf & reach.bool() & valid).sum(1).cpu().float()
        counted += int(valid.sum())
    drafter.train()
    tau = torch.cat(taus) if taus else torch.zeros(1)
    return {
        "positions": counted,
        "tau_backbone": round(float(tau.mean()), 3),
        "depth_top1_given_spine": [round(float(spine_hits[d] / max(1, counted if d == 0 else spine_hits[d - 1])), 3)
                                   for d in range(N)],
        "depth_topk_given_spine": [round(float(leaf_hits[d] / max(1, counted if d == 0 else spine_hits[d - 1])), 3)
                                   for d in range(N)],
        "tree_k": ks,
        "tau_replay": {shape: round(trace.tau(t, s), 3) for shape, (t, s) in walks.items()},
        "tau_replay_budget": budget,
    }


def drafted_trees(build, seq: list[int], top_i: torch.Tensor, top_p: torch.Tensor, ks: list[int], budget: int):
    """`replay_walk`'s `draft`: g -> the tree `build` makes rooted at seq[g] from the per-depth
    candidates top_i/top_p[g - 1] (drafted at position g - 1, i.e. with token g as the root)."""
    return lambda g: build(seq[g], top_i[g - 1], top_p[g - 1], ks, budget).to_dict()

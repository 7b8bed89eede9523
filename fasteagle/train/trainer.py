"""Train a FastEagle drafter for a target: data -> (self-distillation) -> teacher -> layer-wise
training on `accelerate` (CPU, one GPU, or `accelerate launch` for several) -> holdout evaluation.

Read top to bottom: `train()` is the whole pipeline, one named stage after another, and each stage
follows it in that order.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from fasteagle.draftconfig import DrafterConfig
from fasteagle.drafter import CascadedDrafter
from fasteagle.errors import FastEagleError
from fasteagle.files import check_writable, write_text
from fasteagle.methods import load_drafter
from fasteagle.train import data as data_mod
from fasteagle.train.config import TrainConfig
from fasteagle.train.holdout import evaluate
from fasteagle.train.save import save_run
from fasteagle.train.teacher import (
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

if TYPE_CHECKING:
    from accelerate import Accelerator

    from fasteagle.target import Target


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
    opt = torch.optim.AdamW(param_groups(drafter, cfg), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
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
        save_run(run.out, raw, info | {"holdout": metrics, "holdout_initial": initial}, progress.history,
                 run.cfg.shard_mb)
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
    precision = mixed_precision(cfg)
    if cfg.mixed_precision == "bf16" and precision == "no":
        cfg.mixed_precision = "no"  # what the run records is what it ran
    accel = Accelerator(mixed_precision=precision, cpu=cfg.device == "cpu",
                        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    target = target or load_target(cfg.target, device=accel.device, dtype=cfg.dtype)
    t_start = time.monotonic()

    model = target.model
    vocab_size = model.config.vocab_size
    if cfg.topk > vocab_size:
        raise FastEagleError(f"topk must be at most the target's vocabulary ({vocab_size} tokens), not {cfg.topk}")
    dcfg = DrafterConfig.for_target(model, target.name, num_layers=cfg.num_layers, intermediate=cfg.intermediate,
                                    loss_decay=cfg.loss_decay, loss_targets=cfg.loss_targets,
                                    loss_weights=cfg.loss_weights, fc_norm=cfg.fc_norm,
                                    norm_output=cfg.norm_output, kv_inject=cfg.kv_inject,
                                    token_conditioned=cfg.token_conditioned and cfg.drafter == "fasteagle",
                                    token_source=cfg.token_source if cfg.drafter == "fasteagle" else "draft",
                                    current_token=cfg.current_token and cfg.drafter == "fasteagle",
                                    # a draft vocab of them all is the whole one: 0
                                    draft_vocab=cfg.draft_vocab if cfg.draft_vocab < vocab_size else 0)
    drafter_cls = CascadedDrafter
    if cfg.drafter == "eagle3":
        from fasteagle.eagle3 import AutoregressiveDrafter

        drafter_cls, dcfg = AutoregressiveDrafter, AutoregressiveDrafter.config_for(dcfg, cfg.depth)
        dcfg.layout = cfg.layout
    elif cfg.drafter == "dflash":
        from fasteagle.dflash import DFlashDrafter

        drafter_cls, dcfg = DFlashDrafter, DFlashDrafter.config_for(dcfg, cfg.depth)
    elif cfg.drafter == "peagle":
        from fasteagle.peagle import ParallelEagleDrafter

        if cfg.layout != "eagle3":
            raise FastEagleError("parallel EAGLE is EAGLE-3's own network: layout eagle3")
        drafter_cls, dcfg = ParallelEagleDrafter, ParallelEagleDrafter.config_for(dcfg, cfg.depth)
        dcfg.layout = cfg.layout
    elif cfg.drafter != "fasteagle":
        raise FastEagleError(f"unknown drafter {cfg.drafter!r}; use fasteagle, eagle3, dflash or peagle")
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
                         topk=cfg.topk, keep_prompt=cfg.keep_prompt, seed=cfg.seed, max_batches=cfg.distill_batches)
        return None
    if (out / "distilled.pt").exists():
        # a rerun in the same --out (after --distill-only, or resuming) trains on what was written
        run.accel.print(f"reusing {out / 'distilled.pt'} (delete it to distill again)")
        return data_mod.load_token_dataset(out / "distilled.pt")
    train_data = self_distill(model, tok, prompts, cfg.distill_max_new, cfg.distill_batch, budget,
                              sample_every=cfg.distill_sample_every, seed=cfg.seed, max_batches=cfg.distill_batches)
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
                              budget, sample_every=cfg.distill_sample_every, seed=cfg.seed,
                              max_batches=cfg.distill_batches)
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
        cache_features(run.model, train_data, run.fdir, run.dcfg.feature_layers, cfg.batch_tokens, cfg.topk,
                       keep_prompt=cfg.keep_prompt if cfg.prompt_window else None)
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


def param_groups(drafter, cfg: TrainConfig) -> list[dict]:
    """The optimizer's groups: every parameter at the schedule's lr, a current_token cascade's `cur_fc` at
    `current_token_lr` times it (`lr_scale`, which the loop multiplies in)."""
    cur = list(drafter.cur_fc.parameters()) if getattr(drafter, "cur_fc", None) is not None else []
    grown = {id(p) for p in cur}
    rest = [p for p in drafter.parameters() if id(p) not in grown]
    return [{"params": rest, "lr_scale": 1.0}] + ([{"params": cur, "lr_scale": cfg.current_token_lr}] if cur else [])


def _mask_token_id(counts: torch.Tensor, vocab_size: int) -> int:
    """A mask row's token id: one no training reply holds (vLLM knows a DFlash mask row by it, so a bonus token
    must never be it)."""
    unseen = (counts == 0).nonzero()[:, 0]
    return int(unseen[0]) if unseen.numel() else vocab_size - 1


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
        if drafter.cfg.kind == "eagle3" and drafter.cfg.layout != dcfg.layout == "eagle3":
            accel.print("moving it to EAGLE-3's layout (layer 0 reads [embed; hidden]; training goes on from there)")
            drafter = drafter.to_eagle3_layout()
        if drafter.cfg.kind == "eagle3" and dcfg.kind == "peagle":
            from fasteagle.peagle import ParallelEagleDrafter

            accel.print("drafting in parallel from here: its layer, head and vocab as they are, a new mask row")
            drafter = ParallelEagleDrafter.from_eagle3(drafter, _mask_token_id(counts, dcfg.vocab_size))
        if drafter.cfg.kind != dcfg.kind:
            raise FastEagleError(f"{cfg.init_from} holds a {drafter.cfg.kind} drafter; this run trains {dcfg.kind}")
        accel.print(f"continuing from {cfg.init_from} ({before['steps_all']} steps)")
        drafter.cfg.loss_weights = cfg.loss_weights  # a loss switch applies to the drafter it continues
        if cfg.current_token and drafter.cfg.kind == "fasteagle" and not drafter.cfg.current_token:
            accel.print("its rows now read their own token too (cur_fc starts at zero: same function to start)")
            drafter.add_current_token()
        if cfg.intermediate > drafter.cfg.intermediate:  # more capacity, same function to start from
            accel.print(f"widening its MLP from {drafter.cfg.intermediate} to {cfg.intermediate} channels")
            drafter.grow_mlp(cfg.intermediate, model)
        if drafter.cfg.draft_vocab and cfg.draft_vocab > drafter.cfg.draft_vocab:  # 0: it has them all already
            accel.print(f"growing its draft vocab from {drafter.cfg.draft_vocab} to "
                        f"{min(cfg.draft_vocab, dcfg.vocab_size)} tokens")
            drafter.grow_vocab(cfg.draft_vocab, counts)
    else:
        if dcfg.kind in ("dflash", "peagle"):
            dcfg.mask_token_id = _mask_token_id(counts, dcfg.vocab_size)
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
    cpu_s: float = 0.0  # this process's CPU time spent training (every thread; a paused run's pause not counted)
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
                        trained_s=state.get("train_seconds", 0.0), cpu_s=state.get("cpu_seconds", 0.0),
                        tokens=state.get("tokens", 0))
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
    cpu_train = time.process_time() - progress.cpu_s

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
                         "train_seconds": round(time.monotonic() - t_train, 3),
                         "cpu_seconds": round(time.process_time() - cpu_train, 3), "tokens": progress.tokens})

    start, done = progress.step, progress.step >= total_steps or out_of_time()
    while not done:
        for batch in batches.epoch(progress.epoch, progress.in_epoch):
            progress.in_epoch += 1
            with accel.autocast():  # through forward(), so that DDP syncs gradients
                loss, stats = drafter(batch.feats, batch.input_ids, batch.loss_mask, batch.teacher_ids,
                                      batch.teacher_probs)
            accel.backward(loss)
            accel.clip_grad_norm_(drafter.parameters(), cfg.clip)
            lr = lr_at(cfg, progress.step, total_steps, time.monotonic() - t_train)
            for group in opt.param_groups:
                # a checkpoint from before groups were scaled restores its one group without lr_scale: 1
                group["lr"] = lr * group.get("lr_scale", 1.0)
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
    progress.cpu_s = time.process_time() - cpu_train


def run_info(run: Run, progress: Progress, epochs_done: float, replies: ReplyStats, before: dict,
             command: str | None) -> dict:
    """The run's settings and what it did, saved as `training` in the drafter's config.json."""
    cfg, accel = run.cfg, run.accel
    train_minutes = progress.trained_s / 60
    return {"training": asdict(cfg) | {
        "steps": progress.step, "epochs_done": epochs_done, "train_tokens": int(replies.counts.sum()),
        "tokens_trained": progress.tokens,
        "tokens_per_feature_dir": replies.tokens_per_dir, "train_minutes": round(train_minutes, 2),
        "train_cpu_minutes": round(progress.cpu_s / 60, 2),  # CPU time: what a paused or shared run spent
        "total_minutes": round((time.monotonic() - run.t_start) / 60, 2),
        "device": torch.cuda.get_device_name() if accel.device.type == "cuda" else "cpu",
        "command": command, "steps_all": before["steps_all"] + progress.step,
        "train_minutes_all": round(before["train_minutes_all"] + train_minutes, 2),
    }}


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
    on_cpu = cfg.device == "cpu" or not torch.cuda.is_available()
    if cfg.mixed_precision == "bf16" and on_cpu and not cpu_has_bf16():
        print("mixed_precision bf16: this CPU has no native bf16 matmuls (AVX512-BF16 or AMX), where torch "
              "emulates them many times slower than fp32; training in fp32", file=sys.stderr)
        return "no"
    if cfg.mixed_precision != "auto":
        return cfg.mixed_precision
    return "no" if on_cpu else "bf16"


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (oneDNN's check)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


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

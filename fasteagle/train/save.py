"""What a finished training run leaves in its folder: the drafter's weights and config (with the run's
settings and record as `training`), its model card, the loss history and the holdout evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from fasteagle.files import write_text

if TYPE_CHECKING:
    from fasteagle.drafter import CascadedDrafter


def save_run(out: Path, drafter: CascadedDrafter, info: dict, history: list[dict], shard_mb: int) -> None:
    """The drafter's weights and config (`info` beside them), its model card, the loss history and the
    evaluation, into `out`."""
    drafter.save(out, extra=info, shard_mb=shard_mb)
    write_text(out / "README.md", model_card(drafter, info))
    write_text(out / "history.json", json.dumps(history))
    write_text(out / "eval.json", json.dumps({"holdout": info["holdout"], "holdout_initial": info["holdout_initial"]},
                                             indent=2))


def model_card(drafter: CascadedDrafter, info: dict) -> str:
    """A short model card written next to the weights from what the run measured."""
    t, h, h0 = info["training"], info.get("holdout") or {}, info.get("holdout_initial") or {}
    c, per_dir = drafter.cfg, t.get("tokens_per_feature_dir") or {}
    shape = {"fasteagle": f"{c.num_layers} cascaded decoder layers",
             "dflash": f"{c.num_layers} decoder layers over the target's features in their keys and values, "
                       f"drafting a block of {c.depth} masks in one forward (DFlash)",
             "peagle": f"1 EAGLE-3 decoder layer drafting a chain of {c.depth} in one pass over {c.depth - 1} learned "
                       "mask rows (parallel EAGLE)"}.get(
        c.kind, f"1 decoder layer unrolled {c.depth} times (training-time test)")
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
        f"- hardware: {t['device']}; wall time {t['total_minutes']} min in all, {t['train_minutes']} min training "
        f"({t['train_cpu_minutes']} min of CPU time, every thread's)",
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

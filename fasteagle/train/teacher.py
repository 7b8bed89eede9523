"""What the target teaches: its fused hidden features and its next-token distribution (top-k),
computed online on the GPU or once into fp16 shards on disk; and self-distillation, where the
target rewrites the training replies so the drafter learns what the target really says."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, L) long
    loss_mask: torch.Tensor  # (B, L) float
    feats: torch.Tensor  # (B, L, 3H)
    teacher_ids: torch.Tensor  # (B, L, K)
    teacher_probs: torch.Tensor  # (B, L, K)

    def to(self, device) -> "Batch":
        return Batch(*(getattr(self, f).to(device, non_blocking=True) for f in self.__dataclass_fields__))


def pad_batch(seqs: list[list[int]], masks: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest sequence; padded positions get loss mask 0."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), L)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    return ids, mask


@torch.no_grad()
def teach(model: torch.nn.Module, input_ids: torch.Tensor, feature_layers: list[int], topk: int = 16):
    """Target features (B, L, 3H) and its top-k next-token probabilities at every position."""
    out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    feats = torch.cat([out.hidden_states[i] for i in feature_layers], -1)
    probs, ids = torch.softmax(out.logits.float(), -1).topk(topk, -1)
    return feats, ids.int(), probs.half()


def length_batches(lengths: list[int], batch_tokens: int, max_batch: int = 64, shuffle_seed: int | None = 0):
    """Group indices of similar length so that padded batches hold about `batch_tokens` tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * max(lengths[j] for j in cur + [i]) > batch_tokens or len(cur) >= max_batch:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    if shuffle_seed is not None:
        g = torch.Generator().manual_seed(shuffle_seed)
        batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
    return batches


def cache_features(model, data: dict, out_dir: str | Path, feature_layers: list[int], batch_tokens: int = 4096,
                   topk: int = 16) -> Path:
    """Run the target once over the dataset and store each batch as an fp16 shard (resumable:
    shards already on disk are skipped)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = next(model.parameters()).device
    batches = length_batches([len(s) for s in data["input_ids"]], batch_tokens, shuffle_seed=None)
    for b, idx in enumerate(tqdm(batches, desc="target features")):
        path = out / f"shard-{b:05d}.pt"
        if path.exists():
            continue
        ids, mask = pad_batch([data["input_ids"][i] for i in idx], [data["loss_mask"][i] for i in idx])
        feats, t_ids, t_p = teach(model, ids.to(dev), feature_layers, topk)
        tmp = path.with_suffix(".tmp")
        torch.save({"input_ids": ids.int(), "loss_mask": mask.bool(), "feats": feats.half().cpu(),
                    "teacher_ids": t_ids.cpu(), "teacher_probs": t_p.cpu()}, tmp)
        tmp.rename(path)
    return out


def load_shard(path: Path) -> Batch:
    d = torch.load(path, weights_only=True)
    return Batch(d["input_ids"].long(), d["loss_mask"].float(), d["feats"], d["teacher_ids"], d["teacher_probs"])


@torch.no_grad()
def self_distill(model, tokenizer, prompts: list[list[int]], max_new_tokens: int = 256, batch_size: int = 128,
                 time_budget_s: float | None = None, sample_every: int = 4, seed: int = 0) -> dict:
    """Regenerate replies to `prompts` with the target (batched, left-padded). Every
    `sample_every`-th batch is sampled (temperature 0.7) so the drafter also sees non-greedy text.
    Prompts are shuffled (seeded) then length-sorted within windows of 8 batches, so a time budget
    cuts a random subset rather than only the shortest prompts, while padding stays small.
    Returns a token dataset (`fasteagle.train.data` layout) with the loss on the reply only."""
    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    perm = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed)).tolist()
    window = batch_size * 8
    order = [i for w in range(0, len(perm), window) for i in sorted(perm[w:w + window], key=lambda i: len(prompts[i]))]
    torch.manual_seed(seed)
    out_ids, out_mask, out_prompt, out_src, t0 = [], [], [], [], time.monotonic()
    for b, start in enumerate(tqdm(range(0, len(order), batch_size), desc="self-distill")):
        if time_budget_s and time.monotonic() - t0 > time_budget_s:
            break
        idx = order[start:start + batch_size]
        L = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), L), pad, dtype=torch.long)
        att = torch.zeros(len(idx), L, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, L - len(prompts[i]):] = torch.tensor(prompts[i])
            att[r, L - len(prompts[i]):] = 1
        sample = sample_every and b % sample_every == sample_every - 1
        gen = model.generate(input_ids=ids.to(dev), attention_mask=att.to(dev), max_new_tokens=max_new_tokens,
                             do_sample=bool(sample), temperature=0.7 if sample else None, top_p=None, top_k=None,
                             pad_token_id=pad)
        for r, i in enumerate(idx):
            reply = gen[r, L:].tolist()
            stop = set(_as_list(model.generation_config.eos_token_id)) | {tokenizer.eos_token_id}
            for j, t in enumerate(reply):
                if t in stop:
                    reply = reply[: j + 1]
                    break
            if len(reply) < 4:
                continue
            out_ids.append(list(prompts[i]) + reply)
            out_mask.append([0] * len(prompts[i]) + [1] * len(reply))
            out_prompt.append(list(prompts[i]))
            out_src.append(str(i))
    return {"input_ids": out_ids, "loss_mask": out_mask, "prompt_ids": out_prompt, "ids": out_src}


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]

"""What the target teaches: its fused hidden features and its next-token distribution (top-k),
computed online on the GPU or once into fp16 shards on disk; and self-distillation, where the
target rewrites the training replies so the drafter learns what the target really says."""

from __future__ import annotations

import hashlib
import json
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from fasteagle.errors import FastEagleError
from fasteagle.files import torch_save, write_text
from fasteagle.target import head_logits


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, L) long
    loss_mask: torch.Tensor  # (B, L) float
    feats: torch.Tensor  # (B, L, 3H)
    teacher_ids: torch.Tensor  # (B, L, K)
    teacher_probs: torch.Tensor  # (B, L, K)

    def to(self, device) -> Batch:
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


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts to the longest, as `generate` wants a batch: (ids, attention mask)."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    att = torch.zeros(len(seqs), L, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, L - len(s):] = torch.tensor(s)
        att[r, L - len(s):] = 1
    return ids, att


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


def _digest(seqs) -> str:
    h = hashlib.sha256()
    for s in seqs:
        h.update(len(s).to_bytes(8, "little") + array("q", s).tobytes())
    return h.hexdigest()


def _claim_dir(out: Path, inputs: dict) -> None:
    """Refuse a shard directory written from other inputs, and mark it with these. Shards already on
    disk are skipped (that is what makes a run resumable), so another dataset's or setting's shards
    would be trained on silently, mixed with new ones, and a smaller dataset would still pick up a
    larger one's extra shards. A time budget is no input: a resumed run may have more time."""
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    stamp = out / "inputs.sha256"
    if stamp.exists() and stamp.read_text().strip() != key:
        raise FastEagleError(f"{out} holds feature shards made from other data or settings; delete it or "
                             "choose another feature directory (--feature-dir)")
    write_text(stamp, key + "\n")


def cache_features(model, data: dict, out_dir: str | Path, feature_layers: list[int], batch_tokens: int = 4096,
                   topk: int = 16, keep_prompt: int | None = None) -> Path:
    """Run the target once over the dataset and store each batch as an fp16 shard (resumable:
    shards already on disk are skipped; a directory made from other data or settings is refused).

    With `keep_prompt`, each row keeps only its last `keep_prompt` tokens before its first counted one, and
    all after it, as `distill_features` writes replies: the target still reads every token, but its head,
    the shard and every training step pay only for that window (a 2,000-token document before a
    150-token reply is most of the work otherwise, and teaches nothing)."""
    out = Path(out_dir)
    inputs = {"kind": "cache", "input_ids": _digest(data["input_ids"]), "loss_mask": _digest(data["loss_mask"]),
              "feature_layers": list(feature_layers), "batch_tokens": batch_tokens, "topk": topk}
    _claim_dir(out, inputs if keep_prompt is None else inputs | {"keep_prompt": keep_prompt})
    dev = next(model.parameters()).device
    batches = length_batches([len(s) for s in data["input_ids"]], batch_tokens, shuffle_seed=None)
    for b, idx in enumerate(tqdm(batches, desc="target features")):
        path = out / f"shard-{b:05d}.pt"
        if path.exists():
            continue
        ids, mask = pad_batch([data["input_ids"][i] for i in idx], [data["loss_mask"][i] for i in idx])
        if keep_prompt is None:
            feats, t_ids, t_p = teach(model, ids.to(dev), feature_layers, topk)
            torch_save({"input_ids": ids.int(), "loss_mask": mask.bool(), "feats": feats.half().cpu(),
                        "teacher_ids": t_ids.cpu(), "teacher_probs": t_p.cpu()}, path)
        else:
            lengths = [len(data["input_ids"][i]) for i in idx]
            torch_save(teach_windows(model, ids.to(dev), mask, lengths, feature_layers, topk, keep_prompt), path)
    return out


@torch.no_grad()
def teach_windows(model, ids: torch.Tensor, mask: torch.Tensor, lengths: list[int], feature_layers: list[int],
                  topk: int, keep_prompt: int) -> dict:
    """A shard of right-padded rows `ids` (B, L), each cut to its window: `keep_prompt` tokens before the
    row's first counted position (`mask`), up to its length. The target's body runs over whole rows; its
    head and softmax only over the windows."""
    body = model.get_decoder()
    out = body(input_ids=ids, output_hidden_states=True, use_cache=False)
    feats = torch.cat([out.hidden_states[i] for i in feature_layers], -1)  # (B, L, 3H)
    rows = []
    for r, n in enumerate(lengths):
        counted = mask[r, :n].nonzero()
        start = max(0, int(counted[0]) - keep_prompt) if counted.numel() else max(0, n - keep_prompt)
        p, t = torch.softmax(head_logits(model, out.last_hidden_state[r, start:n]).float(), -1).topk(topk, -1)
        rows.append((ids[r, start:n].tolist(), mask[r, start:n].tolist(), feats[r, start:n].half().cpu(),
                     t.int().cpu(), p.half().cpu()))
    ids_b, mask_b = pad_batch([x[0] for x in rows], [x[1] for x in rows])
    L = ids_b.shape[1]
    return {"input_ids": ids_b.int(), "loss_mask": mask_b.bool(), "feats": _stack_rows([x[2] for x in rows], L),
            "teacher_ids": _stack_rows([x[3] for x in rows], L), "teacher_probs": _stack_rows([x[4] for x in rows], L)}


def load_shard(path: Path) -> Batch:
    d = torch.load(path, weights_only=True)
    return Batch(d["input_ids"].long(), d["loss_mask"].float(), d["feats"], d["teacher_ids"], d["teacher_probs"])


PROMPT_TAIL = 512  # distillation keeps a prompt's last this many tokens


def distill_order(lengths: list[int], batch_size: int, seed: int, max_batches: int | None = None) -> list[int]:
    """The order a distillation run visits its prompts (batch b is order[b*batch_size:][:batch_size]):
    shuffled (seeded), then length-sorted within windows of 8 batches, so a time budget cuts a random
    subset rather than only the shortest prompts, while padding stays small. Deterministic, so a later
    run can leave out the prompts an earlier one used (`python -m fasteagle.train.data --exclude-distilled`)
    and a batch cap (`max_batches`, the first that many batches) makes a timed run's prompts again."""
    perm = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).tolist()
    window = batch_size * 8
    order = [i for w in range(0, len(perm), window) for i in sorted(perm[w:w + window], key=lambda i: lengths[i])]
    return order if max_batches is None else order[:max_batches * batch_size]


@torch.no_grad()
def self_distill(model, tokenizer, prompts: list[list[int]], max_new_tokens: int = 256, batch_size: int = 128,
                 time_budget_s: float | None = None, sample_every: int = 4, seed: int = 0,
                 max_batches: int | None = None) -> dict:
    """Regenerate replies to `prompts` with the target (batched, left-padded). Every
    `sample_every`-th batch is sampled (temperature 0.7) so the drafter also sees non-greedy text.
    Prompts are visited in `distill_order`, the first `max_batches` batches of them if given. Returns a
    token dataset (`fasteagle.train.data` layout) with the loss on the reply only."""
    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = distill_order([len(p) for p in prompts], batch_size, seed, max_batches)
    torch.manual_seed(seed)
    out_ids, out_mask, out_prompt, out_src, t0 = [], [], [], [], time.monotonic()
    for b, start in enumerate(tqdm(range(0, len(order), batch_size), desc="self-distill")):
        if time_budget_s and time.monotonic() - t0 > time_budget_s:
            break
        idx = order[start:start + batch_size]
        ids, att = left_pad([prompts[i] for i in idx], pad)
        L = ids.shape[1]  # the padded prompt length: replies start here
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


@torch.no_grad()
def distill_features(model, tokenizer, prompts: list[list[int]], out_dir: str | Path, feature_layers: list[int],
                     max_new_tokens: int = 256, batch_size: int = 32, time_budget_s: float | None = None,
                     sample_every: int = 4, topk: int = 16, keep_prompt: int = 64, seed: int = 0,
                     max_batches: int | None = None) -> Path:
    """Self-distillation that writes the feature cache in the same pass: while the target
    generates its replies, its hidden states and logits at every position are exactly the teacher
    signal, so no second target pass is needed (on a CPU that halves the cost of the data).

    Shards hold the last `keep_prompt` prompt tokens plus the reply (the drafter needs some prompt
    context; the loss is on the reply only). Resumable: batch b goes to shard-b, skipped if present
    (a directory made from other prompts or settings is refused); prompts are visited in `distill_order`,
    the first `max_batches` batches of them if given.
    """
    out = Path(out_dir)
    _claim_dir(out, {"kind": "distill", "prompts": _digest(prompts), "feature_layers": list(feature_layers),
                     "max_new_tokens": max_new_tokens, "batch_size": batch_size, "sample_every": sample_every,
                     "topk": topk, "keep_prompt": keep_prompt, "seed": seed})
    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stop = set(_as_list(model.generation_config.eos_token_id)) | {tokenizer.eos_token_id}
    order = distill_order([len(p) for p in prompts], batch_size, seed, max_batches)
    t0 = time.monotonic()
    for b, start in enumerate(tqdm(range(0, len(order), batch_size), desc="self-distill + features")):
        path = out / f"shard-{b:05d}.pt"
        if path.exists():
            continue
        if time_budget_s and time.monotonic() - t0 > time_budget_s:
            break
        idx = order[start:start + batch_size]
        ids, att = left_pad([prompts[i] for i in idx], pad)
        L = ids.shape[1]  # the padded prompt length: replies start here
        torch.manual_seed(seed + b)
        sample = bool(sample_every) and b % sample_every == sample_every - 1
        gen = model.generate(input_ids=ids.to(dev), attention_mask=att.to(dev), max_new_tokens=max_new_tokens,
                             do_sample=sample, temperature=0.7 if sample else None, top_p=None, top_k=None,
                             pad_token_id=pad, output_hidden_states=True, output_logits=True,
                             return_dict_in_generate=True)
        # features at positions 0 .. L+n-2 (the last generated token was never fed back)
        hs = [torch.cat([gen.hidden_states[0][j]] + [step[j] for step in gen.hidden_states[1:]], 1)
              for j in feature_layers]
        feats = torch.cat(hs, -1)  # (B, L+n-1, 3H)
        p, t_ids = torch.softmax(torch.stack(gen.logits, 1).float(), -1).topk(topk, -1)  # positions L-1..L+n-2
        rows = []
        for r, i in enumerate(idx):
            reply = gen.sequences[r, L:].tolist()
            end = next((j + 1 for j, t in enumerate(reply) if t in stop), len(reply))
            if end < 4:
                continue
            k = min(keep_prompt, len(prompts[i]))
            s0 = L - k  # first kept position
            seq = gen.sequences[r, s0:L + end]
            f = torch.zeros(len(seq), feats.shape[-1], dtype=torch.float16)
            f[: len(seq) - 1] = feats[r, s0:L + end - 1].half()  # the last position's feature is unused
            tp = torch.zeros(len(seq), topk, dtype=torch.float16)
            ti = torch.zeros(len(seq), topk, dtype=torch.int32)
            tp[k - 1:k - 1 + end] = p[r, :end].half()  # teacher at the last prompt position onwards
            ti[k - 1:k - 1 + end] = t_ids[r, :end].int()
            rows.append((seq, [0] * k + [1] * end, f, ti, tp))
        if not rows:
            continue
        ids_b, mask_b = pad_batch([x[0].tolist() for x in rows], [x[1] for x in rows], pad_id=pad)
        torch_save({"input_ids": ids_b.int(), "loss_mask": mask_b.bool(),
                    "feats": _stack_rows([x[2] for x in rows], ids_b.shape[1]),
                    "teacher_ids": _stack_rows([x[3] for x in rows], ids_b.shape[1]),
                    "teacher_probs": _stack_rows([x[4] for x in rows], ids_b.shape[1])}, path)
    return out


def _stack_rows(rows: list[torch.Tensor], length: int) -> torch.Tensor:
    """Right-pad (len_i, W) tensors with zeros into one (B, length, W) tensor."""
    out = rows[0].new_zeros(len(rows), length, rows[0].shape[-1])
    for r, x in enumerate(rows):
        out[r, : len(x)] = x
    return out


def token_counts(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each of `vocab_size` tokens occurs in `ids`; an id outside the vocabulary (data made with
    another tokenizer) is a one-line error, not bincount's longer result failing to add."""
    ids = ids.long()
    if ids.numel() and int(ids.max()) >= vocab_size:
        raise FastEagleError(f"token id {int(ids.max())} in a token dataset is outside the {vocab_size}-token "
                             "vocabulary: the dataset was made with another tokenizer")
    return torch.bincount(ids, minlength=vocab_size)


def shard_stats(shards: list[Path], vocab_size: int) -> tuple[torch.Tensor, list[int]]:
    """How often each token occurs in the replies of the cached shards (for the draft vocab), and
    how many sequences each shard holds (to count micro-batches). Memory-mapped: the features stay on disk."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    rows = []
    for path in shards:
        d = torch.load(path, weights_only=True, mmap=True)
        counts += token_counts(d["input_ids"][d["loss_mask"]], vocab_size)
        rows.append(d["input_ids"].shape[0])
    return counts, rows


def micro_batches(batch: Batch, rows: int, generator: torch.Generator | None = None) -> list[Batch]:
    """Cut a shard into shuffled micro-batches of `rows` sequences, each trimmed after its last
    counted token. On a CPU, small batches are both faster per token (they stay in cache) and
    give many more optimizer steps per epoch, which is what an under-trained drafter needs."""
    if rows <= 0 or rows >= batch.input_ids.shape[0]:
        return [batch]
    order = torch.randperm(batch.input_ids.shape[0], generator=generator)
    out = []
    for idx in order.split(rows):
        counted = batch.loss_mask[idx].bool().any(0).nonzero()
        end = int(counted.max()) + 1 if counted.numel() else 1
        out.append(Batch(*(getattr(batch, f)[idx, :end] for f in Batch.__dataclass_fields__)))
    return out

"""Teacher-forced holdout metrics of a drafter during training: per-depth agreement with the target,
the backbone tree's expected accepted length, and greedy decoding's tau replayed over the holdout."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from fasteagle import trace
from fasteagle.drafter import CascadedDrafter
from fasteagle.train.teacher import teach
from fasteagle.tree import TREE_BUILDERS

__all__ = ["drafted_trees", "evaluate"]


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
            outs = drafter.depth_outputs(feats[:, :-1].to(drafter.fc.weight.dtype), ids[:, 1:], cur_ids=ids[:, :-1])
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

"""A sparse mixture-of-experts target made from a dense one (MoEfication), for the MoE study:

    python -m fasteagle.train.moefy --out runs/moe/smollm2-135m-e16 --experts 16 --top-k 4,3,2,1

No MoE weights can be fetched here, so the nearest real sparse model is the default target's own MLPs split
into experts. Each MLP's neurons are clustered by when they fire (balanced k-means over their activations on
train conversations) into E experts of equal width; a router per layer is trained to pick, for each token, the
k experts whose outputs matter most, and to weigh them so that their sum stands in for the dense MLP's; then
the block's experts and router are trained together on that same aim (`--block-steps`). Layer by layer, each
block is fitted on the inputs that the sparse layers below it produce. Every k asked for is
built and measured against the dense model (perplexity on held-out chat replies; agreement of greedy
replies); the sparsest within `--max-ppl-ratio` of dense is saved to OUT/sparse as a stock `mixtral`
checkpoint, which our engine, the trainer and the bench load like any target. Each build is kept in
OUT/built-kK and the fine-tune resumes from its checkpoint, so a run stopped part way goes on where it was.

It is not a pretrained MoE: its experts were learned densely and only its routing is sparse. It shows what
sparse, token-dependent routing does to the features a drafter reads; not what MoE pretraining does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from fasteagle.errors import FastEagleError, Parser, run_command
from fasteagle.files import check_writable, write_text
from fasteagle.train.data import build_prompt_ids, encode_conversation
from fasteagle.train.sharegpt import first_user_prompt, in_split, iter_conversations


class _Captured(Exception):
    """Raised by a hook once it has the input it waited for: the layers above need not run."""


def conversations(tokenizer, split: str, n: int, max_len: int = 512) -> list[tuple[list[int], list[int]]]:
    """The first `n` ShareGPT conversations of `split` with a reply, as (ids, reply mask)."""
    out = []
    for conv in iter_conversations():
        if in_split(conv.id, split):
            ids, mask = encode_conversation(tokenizer, conv, max_len)
            if sum(mask) > 0:
                out.append((ids, mask))
                if len(out) == n:
                    break
    return out


@torch.no_grad()
def mlp_inputs(model, layer: int, seqs: Sequence[list[int]], limit: int, seed: int = 0) -> torch.Tensor:
    """[N, H]: what layer `layer`'s MLP reads, over every token of `seqs` (at most `limit` of them, drawn
    at random): the model runs up to that layer and stops there."""
    got = []

    def grab(_module, args):
        got.append(args[0].reshape(-1, args[0].shape[-1]).float())
        raise _Captured

    handle = model.model.layers[layer].mlp.register_forward_pre_hook(grab)
    try:
        for ids in seqs:
            try:
                model(torch.tensor([ids], device=model.device), use_cache=False)
            except _Captured:
                pass
    finally:
        handle.remove()
    x = torch.cat(got)
    if len(x) > limit:
        x = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:limit]]
    return x


def activations(mlp, x: torch.Tensor) -> torch.Tensor:
    """[N, I]: a gated MLP's neuron activations, act(gate(x)) * up(x)."""
    return mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)


def neuron_groups(acts: torch.Tensor, experts: int, iters: int = 25, seed: int = 0) -> torch.Tensor:
    """[E, I/E]: the neurons of one MLP in E groups of equal size, neurons that fire on the same tokens together
    (balanced k-means on the cosine of their |activation| profiles; each round fills the groups greedily from
    the most similar neuron-group pairs)."""
    n_neurons = acts.shape[1]
    if n_neurons % experts:
        raise FastEagleError(f"--experts {experts} does not divide the MLP's {n_neurons} neurons")
    size = n_neurons // experts
    feats = F.normalize(acts.abs().T, dim=1)  # [I, N]
    gen = torch.Generator().manual_seed(seed)
    centres = feats[torch.randperm(n_neurons, generator=gen)[:experts]]
    for _ in range(iters):
        sim = feats @ centres.T  # [I, E]
        order = sim.flatten().argsort(descending=True)
        owned, room = [-1] * n_neurons, [size] * experts
        for flat in order.tolist():
            neuron, group = divmod(flat, experts)
            if owned[neuron] < 0 and room[group]:
                owned[neuron] = group
                room[group] -= 1
        owner = torch.tensor(owned)
        centres = F.normalize(torch.stack([feats[owner == g].mean(0) for g in range(experts)]), dim=1)
    return torch.stack([torch.nonzero(owner == g).flatten() for g in range(experts)])


def mixtral_config(dense, experts: int, top_k: int):
    """The dense Llama-shaped config as a Mixtral one: the same attention, norms and vocabulary; E experts
    of 1/E the MLP's width, `top_k` of them per token."""
    from transformers import MixtralConfig

    d = dense.to_dict()
    if d.get("attention_bias") or d.get("mlp_bias"):
        raise FastEagleError("the target has biases in its attention or MLP; a Mixtral block has none")
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "pad_token_id", "bos_token_id",
            "eos_token_id", "tie_word_embeddings", "rope_parameters")
    config = MixtralConfig(**{k: d[k] for k in keep if k in d}, intermediate_size=dense.intermediate_size // experts,
                           num_local_experts=experts, num_experts_per_tok=top_k, sliding_window=None)
    config._experts_implementation = "eager"  # blocks built one by one, outside a model that would set it
    return config


@torch.no_grad()
def moe_block(config, mlp, groups: torch.Tensor):
    """A Mixtral block holding `mlp`'s neurons as experts (`groups`: [E, I/E]), each expert's output scaled by
    k: with equal routing weights (1/k each, as Mixtral renormalises over the top k) the block writes the sum
    of its chosen experts, and with k = E that sum is the dense MLP. The router starts at zero."""
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    block = MixtralSparseMoeBlock(config).to(mlp.gate_proj.weight)
    gate, up, down = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight  # [I, H], [I, H], [H, I]
    block.experts.gate_up_proj.copy_(torch.stack([torch.cat([gate[g], up[g]]) for g in groups]))
    block.experts.down_proj.copy_(torch.stack([down[:, g] for g in groups]) * config.num_experts_per_tok)
    block.gate.weight.zero_()
    return block


def mix(parts: torch.Tensor, logits: torch.Tensor, k: int) -> torch.Tensor:
    """[N, H]: what a Mixtral block writes, from each expert's unscaled output (`parts`: [N, E, H]) and the
    router's logits ([N, E]): k times the renormalised softmax-weighted sum of the top k."""
    top, idx = logits.softmax(-1).topk(k, dim=-1)
    w = top / top.sum(-1, keepdim=True)
    chosen = parts.gather(1, idx[..., None].expand(-1, -1, parts.shape[-1]))
    return k * (w[..., None] * chosen).sum(1)


def relative_error(out: torch.Tensor, dense: torch.Tensor, power: torch.Tensor | None = None) -> torch.Tensor:
    """A block's squared error over the dense MLP's output power (`out`, `dense`: [N, H]; `power`: that of all
    the tokens a batch is drawn from, default `dense`'s own): 0 is the dense MLP, 1 writing nothing."""
    power = dense.pow(2).sum(-1).mean() if power is None else power
    return (out - dense).pow(2).sum(-1).mean() / power


def fit_router(parts: torch.Tensor, x: torch.Tensor, k: int, steps: int = 300, lr: float = 1e-2,
               batch: int = 1024, seed: int = 0) -> tuple[torch.Tensor, float]:
    """A router ([E, H]) for one layer, and its error (the block's squared error over the dense MLP's output
    power, on all of `x`). It learns two things at once: which experts to pick (the k whose outputs are
    largest, as a multi-label target) and how to weigh them (the block's squared error, through the weights)."""
    dense = parts.sum(1)
    power = dense.pow(2).sum(-1).mean()
    label = torch.zeros(parts.shape[:2]).scatter_(1, parts.norm(dim=-1).topk(k, dim=-1).indices, 1.0)
    weight = torch.zeros(parts.shape[1], x.shape[1], requires_grad=True)
    opt = torch.optim.Adam([weight], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        rows = torch.randint(len(x), (min(batch, len(x)),), generator=gen)
        logits = x[rows] @ weight.T
        err = relative_error(mix(parts[rows], logits, k), dense[rows], power)
        loss = err + F.binary_cross_entropy_with_logits(logits, label[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        err = relative_error(mix(parts, x @ weight.T, k), dense)
    return weight.detach(), float(err)


def fit_block(block, x: torch.Tensor, dense: torch.Tensor, steps: int = 400, lr: float = 1e-3, batch: int = 512,
              seed: int = 0) -> float:
    """Train a built block's experts and router (in place) so that its output matches the dense MLP's (`dense`,
    [N, H]) on the inputs `x`, through the stock Mixtral block itself: no neuron group alone can stand in for
    the neurons a token's unchosen experts hold, but trained together the chosen ones can make up part of
    them. Returns the block's error afterwards (as `fit_router`'s) on all of `x`."""
    power = dense.pow(2).sum(-1).mean()
    block.requires_grad_(True)
    opt = torch.optim.Adam(block.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        rows = torch.randint(len(x), (min(batch, len(x)),), generator=gen)
        err = relative_error(block(x[rows][None])[0], dense[rows], power)
        opt.zero_grad()
        err.backward()
        opt.step()
    block.requires_grad_(False)
    with torch.no_grad():
        return float(relative_error(block(x[None])[0], dense))


@torch.no_grad()
def expert_parts(mlp, groups: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[N, E, H]: each neuron group's share of the dense MLP's output (their sum is the MLP's output)."""
    acts = activations(mlp, x)
    down = mlp.down_proj.weight
    return torch.stack([acts[:, g] @ down[:, g].T for g in groups], dim=1)


def moefy(model, seqs: Sequence[list[int]], experts: int, top_k: int, tokens: int = 8192, steps: int = 300,
          block_steps: int = 0, block_lr: float = 1e-3, seed: int = 0) -> list[dict]:
    """Turn `model` (a Llama-shaped causal LM, changed in place) into a Mixtral-shaped one, layer by layer from
    the bottom: cluster the layer's neurons, build its block, fit its router on the inputs the sparse layers
    below produce, then (`block_steps`) its experts and router together (`fit_block`). Returns each layer's
    error after each fit."""
    config = mixtral_config(model.config, experts, top_k)
    stats = []
    layers = model.model.layers
    for i in tqdm(range(len(layers)), desc=f"moefy k={top_k}/{experts}"):
        mlp = layers[i].mlp
        x = mlp_inputs(model, i, seqs, tokens, seed=seed + i)
        with torch.no_grad():
            groups = neuron_groups(activations(mlp, x[:4096]), experts, seed=seed)
        parts = expert_parts(mlp, groups, x)
        weight, err = fit_router(parts, x, top_k, steps=steps, seed=seed)
        block = moe_block(config, mlp, groups)
        with torch.no_grad():
            block.gate.weight.copy_(weight)
        stats.append({"layer": i, "router_error": round(err, 4)})
        if block_steps:
            stats[-1]["block_error"] = round(fit_block(block, x, parts.sum(1), block_steps, block_lr, seed=seed), 4)
        layers[i].mlp = block
    model.config = config
    return stats


def finetune(dense, sparse, seqs: Sequence[list[int]], minutes: float, folder: Path, lr: float = 5e-5,
             seed: int = 0, save_every: int = 100, max_steps: int | None = None) -> dict:
    """Train the sparse model's MLP blocks (routers and experts) to match the dense model's next-token
    distribution (KL divergence over every position of `seqs`, one sequence a step) for `minutes` of training
    time (or `max_steps` steps, if fewer), resuming from `folder`/checkpoint.pt when an earlier run left one.
    Returns the steps and minutes."""
    import time

    from fasteagle.files import torch_save

    params = [p for n, p in sparse.named_parameters() if ".mlp." in n]
    sparse.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    state = {"step": 0, "seconds": 0.0, "losses": []}
    ckpt = folder / "checkpoint.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        sparse.load_state_dict(saved["model"], strict=False)
        opt.load_state_dict(saved["optimizer"])
        state = saved["state"]
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(seed)).tolist()
    bar = tqdm(total=round(minutes * 60), initial=round(state["seconds"]), desc="fine-tune", unit="s")
    sparse.train()
    while state["seconds"] < minutes * 60 and (max_steps is None or state["step"] < max_steps):
        t0 = time.monotonic()
        ids = torch.tensor([seqs[order[state["step"] % len(order)]]])
        with torch.no_grad():
            want = F.log_softmax(dense(ids, use_cache=False).logits.float(), -1)
        got = F.log_softmax(sparse(ids, use_cache=False).logits.float(), -1)
        loss = F.kl_div(got, want, log_target=True, reduction="none").sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        state["step"] += 1
        state["losses"].append(round(loss.item(), 4))
        spent = time.monotonic() - t0
        state["seconds"] += spent
        bar.update(round(spent))
        bar.set_postfix(kl=f"{state['losses'][-1]:.3f}", step=state["step"])
        if state["step"] % save_every == 0 or state["seconds"] >= minutes * 60 or state["step"] == max_steps:
            mlp = {n: v for n, v in sparse.state_dict().items() if ".mlp." in n}
            torch_save({"model": mlp, "optimizer": opt.state_dict(), "state": state}, ckpt)
    bar.close()
    sparse.eval().requires_grad_(False)
    return {"steps": state["step"], "minutes": round(state["seconds"] / 60, 1), "lr": lr,
            "kl_first_last": [state["losses"][0], state["losses"][-1]] if state["losses"] else None}


def as_mixtral(model):
    """A stock `MixtralForCausalLM` with `model`'s weights (a model that `moefy` changed)."""
    from transformers import MixtralForCausalLM

    out = MixtralForCausalLM(model.config).to(model.dtype)
    out.load_state_dict(model.state_dict(), strict=True)
    return out.eval()


@torch.no_grad()
def perplexity(model, convs: Sequence[tuple[list[int], list[int]]]) -> float:
    """exp of the mean negative log-likelihood of the reply tokens of `convs`."""
    nll, count = 0.0, 0
    for ids, mask in convs:
        logits = model(torch.tensor([ids], device=model.device), use_cache=False).logits[0, :-1].float()
        keep = torch.tensor(mask[1:], dtype=torch.bool, device=logits.device)
        target = torch.tensor(ids[1:], device=logits.device)
        nll += float(F.cross_entropy(logits[keep], target[keep], reduction="sum"))
        count += int(keep.sum())
    return math.exp(nll / max(count, 1))


@torch.no_grad()
def greedy(model, prompt: list[int], n: int, stop: int | None) -> list[int]:
    out = model.generate(torch.tensor([prompt], device=model.device), max_new_tokens=n, do_sample=False,
                         eos_token_id=stop, pad_token_id=stop)
    return out[0, len(prompt):].tolist()


@torch.no_grad()
def agreement(dense, sparse, prompts: Sequence[list[int]], replies: Sequence[list[int]], n: int,
              stop: int | None) -> dict:
    """How alike the two models' greedy replies are: the share of the dense replies' tokens that the sparse
    model also ranks first (fed the dense reply so far), and how many greedy replies come out identical."""
    same = total = identical = 0
    for prompt, want in zip(prompts, replies):
        logits = sparse(torch.tensor([prompt + want], device=sparse.device), use_cache=False).logits[0]
        picks = logits[len(prompt) - 1:-1].argmax(-1).tolist()
        same += sum(a == b for a, b in zip(picks, want))
        total += len(want)
        identical += greedy(sparse, prompt, n, stop) == want
    return {"top1_agreement": round(same / max(total, 1), 4), "identical_replies": identical,
            "replies": len(prompts)}


def choose(dense_ppl: float, built: dict[int, dict], max_ratio: float) -> tuple[int, bool]:
    """(k, within): the sparsest k whose perplexity is within `max_ratio` of dense, or, when none is, the k with
    the lowest perplexity (the best reached)."""
    within = [k for k, q in built.items() if q["perplexity"] <= max_ratio * dense_ppl]
    if within:
        return min(within), True
    return min(built, key=lambda k: built[k]["perplexity"]), False


def build_once(model, tokenizer, calib, held, args, k: int):
    """(the top-`k` sparse copy of `model`, {settings, layers, perplexity_before_finetune}): built by `moefy` and
    saved to OUT/built-k{k} (a checkpoint our engine and vLLM load, the tokenizer beside it), or read back from
    there when an earlier run with the same build settings left it, so that a fine-tune resumed in a later
    session does not redo the build (most of 20 minutes here). A build with other settings makes the fine-tune
    checkpoint of the old one stale: it is removed."""
    import copy

    from transformers import MixtralForCausalLM

    folder = Path(args.out) / f"built-k{k}"
    settings = {"target": args.target, "experts": args.experts, "top_k": k, "max_len": args.max_len,
                "calib_conversations": args.calib_conversations, "calib_tokens": args.calib_tokens,
                "router_steps": args.router_steps, "block_steps": args.block_steps, "block_lr": args.block_lr,
                "seed": args.seed}
    record = folder / "build.json"
    if record.exists():
        made = json.loads(record.read_text())
        if made["settings"] == settings:
            tqdm.write(f"k={k}/{args.experts}: the build in {folder} has these settings: read back, not rebuilt")
            return MixtralForCausalLM.from_pretrained(folder, dtype=model.dtype).eval(), made
        stale = Path(args.out) / f"finetune-k{k}" / "checkpoint.pt"
        if stale.exists():
            stale.unlink()
            tqdm.write(f"removed {stale}: it fine-tuned a build with other settings")
    sparse = copy.deepcopy(model)
    layers = moefy(sparse, calib, args.experts, k, tokens=args.calib_tokens, steps=args.router_steps,
                   block_steps=args.block_steps, block_lr=args.block_lr, seed=args.seed)
    sparse = as_mixtral(sparse)
    made = {"settings": settings, "layers": layers, "perplexity_before_finetune": round(perplexity(sparse, held), 3)}
    record.unlink(missing_ok=True)  # no record beside weights half written
    sparse.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_text(record, json.dumps(made, indent=1) + "\n")
    return sparse, made


def build(args) -> dict:
    """Every k asked for, built and measured; the chosen one saved. Returns what quality.json holds."""
    from fasteagle.target import load_target

    dense = load_target(args.target, device="cpu", dtype="fp32", pack=False)
    tok, model = dense.tokenizer, dense.model
    extra = args.finetune_conversations if args.finetune_minutes else 0
    train_seqs = [ids for ids, _ in conversations(tok, "train", args.calib_conversations + extra, args.max_len)]
    calib, train_seqs = train_seqs[:args.calib_conversations], train_seqs[args.calib_conversations:]
    held = conversations(tok, "holdout", args.eval_conversations, args.max_len)
    prompts = holdout_prompts(tok, args.agree_prompts, args.max_len - args.agree_tokens)
    stop = tok.eos_token_id
    replies = [greedy(model, p, args.agree_tokens, stop) for p in tqdm(prompts, desc="dense replies")]
    dense_ppl = perplexity(model, held)
    built, models = {}, {}
    for k in args.top_k:
        sparse, made = build_once(model, tok, calib, held, args, k)
        built[k] = {"perplexity_before_finetune": made["perplexity_before_finetune"]}
        layers = made["layers"]
        tqdm.write(f"k={k}/{args.experts} before any fine-tune: perplexity "
                   f"{built[k]['perplexity_before_finetune']:.2f} (dense {dense_ppl:.2f})")
        if args.finetune_minutes:
            folder = Path(args.out) / f"finetune-k{k}"
            folder.mkdir(parents=True, exist_ok=True)
            built[k]["finetune"] = finetune(model, sparse, train_seqs, args.finetune_minutes, folder,
                                            lr=args.finetune_lr, seed=args.seed)
        built[k] |= {"perplexity": (round(perplexity(sparse, held), 3) if args.finetune_minutes
                                    else built[k]["perplexity_before_finetune"]), "layers": layers,
                    **agreement(model, sparse, prompts, replies, args.agree_tokens, stop)}
        built[k]["perplexity_ratio"] = round(built[k]["perplexity"] / dense_ppl, 3)
        models[k] = sparse
        tqdm.write(f"k={k}/{args.experts}: perplexity {built[k]['perplexity']:.2f} "
                   f"({built[k]['perplexity_ratio']:.2f}x dense {dense_ppl:.2f}), "
                   f"top-1 agreement {built[k]['top1_agreement']:.3f}")
    k, within = choose(dense_ppl, built, args.max_ppl_ratio)
    out = Path(args.out)
    models[k].save_pretrained(out / "sparse")
    tok.save_pretrained(out / "sparse")
    return {"target": dense.name, "experts": args.experts, "chosen_top_k": k, "within_ratio": within,
            "max_ppl_ratio": args.max_ppl_ratio, "dense_perplexity": round(dense_ppl, 3),
            "held_out": {"conversations": len(held), "reply_tokens": sum(sum(m[1:]) for _, m in held),
                         "agreement_prompts": len(prompts), "agreement_tokens": args.agree_tokens},
            "calibration": {"conversations": len(calib), "tokens_per_layer": args.calib_tokens,
                            "router_steps": args.router_steps, "block_steps": args.block_steps,
                            "block_lr": args.block_lr, "seed": args.seed},
            "finetune": {"minutes": args.finetune_minutes, "conversations": len(train_seqs)},
            "top_k": {str(k): q for k, q in built.items()}}


def holdout_prompts(tokenizer, n: int, max_tokens: int) -> list[list[int]]:
    """The first user turns of the first `n` held-out ShareGPT conversations whose turn fits `max_tokens`, as
    chat prompts."""
    out = []
    for conv in iter_conversations():
        if in_split(conv.id, "holdout"):
            ids = build_prompt_ids(tokenizer, first_user_prompt(conv))
            if len(ids) <= max_tokens:
                out.append(ids)
                if len(out) == n:
                    break
    return out


def parser() -> Parser:
    p = Parser(prog="python -m fasteagle.train.moefy", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder: OUT/sparse (the chosen model) and OUT/quality.json")
    p.add_argument("--target", default=None, help="the dense model (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--experts", type=int, default=16, help="E: experts per MLP")
    p.add_argument("--top-k", type=lambda s: sorted({int(v) for v in s.split(",")}, reverse=True), default=[4, 2],
                   help="the k to build, comma-separated; each must keep k/E <= 1/4")
    p.add_argument("--max-ppl-ratio", type=float, default=1.1, help="keep the sparsest k within this of dense")
    p.add_argument("--calib-conversations", type=int, default=24, help="train conversations the routers see")
    p.add_argument("--calib-tokens", type=int, default=8192, help="tokens per layer the routers are fitted on")
    p.add_argument("--router-steps", type=int, default=300)
    p.add_argument("--block-steps", type=int, default=400,
                   help="then train each block's experts and router together on its own output (0: routers only)")
    p.add_argument("--block-lr", type=float, default=1e-3)
    p.add_argument("--finetune-minutes", type=float, default=0,
                   help="then train routers and experts to match the dense model this long, for each k (resumes)")
    p.add_argument("--finetune-lr", type=float, default=1e-4)
    p.add_argument("--finetune-conversations", type=int, default=2000,
                   help="train conversations the fine-tune reads (after the routers' own)")
    p.add_argument("--eval-conversations", type=int, default=48, help="held-out conversations for perplexity")
    p.add_argument("--agree-prompts", type=int, default=24, help="held-out prompts for greedy agreement")
    p.add_argument("--agree-tokens", type=int, default=64)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if any(k < 1 or 4 * k > args.experts for k in args.top_k):
        p.error(f"--top-k: every k must be between 1 and --experts/4 ({args.experts // 4})")
    return run_command(lambda: _run(args))


def _run(args) -> int:
    check_writable(args.out, "--out", directory=True)
    quality = build(args)
    write_text(Path(args.out) / "quality.json", json.dumps(quality, indent=1) + "\n")
    k = quality["chosen_top_k"]
    print(f"saved {args.out}/sparse: top-{k} of {args.experts} experts, perplexity "
          f"{quality['top_k'][str(k)]['perplexity_ratio']}x dense"
          + ("" if quality["within_ratio"] else f" (no k within {args.max_ppl_ratio}x: the best reached)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

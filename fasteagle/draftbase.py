"""What both drafters are built on: their config, the target's frozen embedding and LM head, the
draft vocabulary, decoder layers with a lean inference forward, the layer-wise loss, CPU packing and
the files.

A drafter reads the target's hidden states of a few layers (`DrafterConfig.feature_layers`) and
predicts the tokens after the next one, one distribution per draft depth, through the target's own
LM head (frozen, borrowed with `attach`, never saved here) over a draft vocabulary: the target's
whole vocabulary or its most frequent tokens. How the depths are computed is the subclass's: the
cascade (`fasteagle.drafter`) runs N layers in series once, the EAGLE-3-style drafter
(`fasteagle.eagle3`) one layer once per depth. Both train with the same loss (`DrafterBase.loss`)
over their `depth_outputs`, and save to and load from a folder of config.json and safetensors
(`fasteagle.draftconfig` reads and checks the config).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from fasteagle import packing
from fasteagle.draftconfig import DrafterConfig, check_fingerprint, peek
from fasteagle.errors import FastEagleError
from fasteagle.files import atomic_path, write_text
from fasteagle.fused import FusedLayer
from fasteagle.kvcache import KVCache
from fasteagle.packing import PackedLinear, WeightCopy, copy_class, pack_linears
from fasteagle.tree import TREE_BUILDERS, DraftTree

COMPACT_VOCAB_KEY = "compact_vocab_ids"  # the tensor in model.safetensors that holds `compact_vocab`


def _linear(weight: torch.Tensor) -> nn.Linear:
    """A bias-free linear layer holding `weight` (out, in)."""
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    lin.weight.data.copy_(weight)
    return lin


def _most_frequent(token_counts: torch.Tensor, n: int, keep: torch.Tensor | None = None,
                   among: torch.Tensor | None = None) -> torch.Tensor:
    """The sorted ids of the `n` most frequent tokens by `token_counts`: every token of `keep` first,
    only tokens of `among` (default: any)."""
    dev = (among if among is not None else keep if keep is not None else token_counts).device
    counts = token_counts.float().to(dev).clone()
    if among is not None:
        allowed = torch.zeros_like(counts, dtype=torch.bool)
        allowed[among] = True
        counts[~allowed] = float("-inf")
    if keep is not None:
        counts[keep.to(dev)] = float("inf")
    return counts.topk(n).indices.sort().values


class DrafterBase(nn.Module):
    """The parts every drafter shares; a subclass adds its input layer, `depth_outputs` (training)
    and the drafter protocol of `fasteagle.generate` (reset, extend, draft, rewind)."""

    KIND = ""  # config.json's "kind" this class loads
    BLOCKS = False  # whether `depth_outputs` takes `wanted`: positions to compute, the rest left zero (DFlash)

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        # draft index -> target token id; saved with the weights, set by `set_vocab`
        self.register_buffer("vocab_ids", torch.arange(cfg.draft_vocab or cfg.vocab_size))
        self._head_w: torch.Tensor | None = None  # the target LM head's rows for vocab_ids
        # a smaller draft vocab (token ids) for devices where the head's size costs time (CPUs): the
        # trained vocab a whole-vocabulary drafter grew from; saved with the weights, used by `shrink_vocab`
        self.compact_vocab: torch.Tensor | None = None
        self._head_packed: WeightCopy | None = None  # the head's inference copy (CPU inference)
        # training only: draft indices the loss's softmax runs over, besides each batch's teacher tokens
        # (None: the whole draft vocab); see `loss`
        self.loss_vocab: torch.Tensor | None = None
        self.packing: str | None = None  # "fp32" or "int8" once `pack_for_cpu` ran (a `packing.KINDS` key)
        self._fused: list[FusedLayer] | None = None  # inference forwards of self.layers, made at first use
        # what the last `draft` did, for the trace (the app's cascade view): ms of each forward it ran
        # beyond the one `extend` ran before it (EAGLE-3: depths 2..N; the cascade: none), and per depth
        # its best candidates through the head, [[token id, prob], ...] (the cascade's layers L1..LN)
        self.inner_passes: list[float] = []
        self.layer_top: list[list[list]] = []
        self._frozen: tuple[nn.Module, nn.Module] | None = None  # target's (embedding, lm_head), not ours
        self.feature_layers = tuple(cfg.feature_layers)
        # top-k candidates per depth (an int, or one per depth; EAGLE-2's 10 unless a subclass says
        # otherwise) and tree nodes per step, root included (the paper's 60)
        self.tree_k: list[int] | int = 10
        self.tree_budget = 60

    def _add_decoder(self) -> None:
        """The decoder layers (`cfg.num_layers`), each with its own final norm, the projection to the
        target's width when the layers are narrower, and the rotary embedding. A subclass makes its
        input layer first: modules made in that order draw the same initial weights from a seed."""
        cfg = self.cfg
        lc = cfg.layer_config()
        self.layers = nn.ModuleList(LlamaDecoderLayer(lc, i) for i in range(cfg.num_layers))
        self.norms = nn.ModuleList(LlamaRMSNorm(cfg.width, eps=cfg.rms_norm_eps) for _ in range(cfg.num_layers))
        self.proj = nn.Linear(cfg.width, cfg.target_hidden, bias=False) if cfg.width != cfg.target_hidden else None
        self.rotary = LlamaRotaryEmbedding(lc)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)

    @property
    def device(self) -> torch.device:
        return self.norms[0].weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.norms[0].weight.dtype

    @torch.no_grad()
    def init_from_target(self, target_model: nn.Module) -> DrafterBase:
        """Start each layer from one of the target's top layers (MLP channels cut to our width):
        a pretrained starting point trains far faster than random weights."""
        src = target_model.model.layers[-self.cfg.num_layers:]
        if self.cfg.width != self.cfg.target_hidden:
            return self
        for mine, theirs in zip(self.layers, src):
            theirs_params = dict(theirs.named_parameters())
            for name, p in mine.named_parameters():
                if (q := theirs_params.get(name)) is None:  # EAGLE-3's hidden_norm: the target has none
                    continue
                if name.endswith(("gate_proj.weight", "up_proj.weight")):
                    q = q[: p.shape[0]]
                elif name.endswith("down_proj.weight"):
                    q = q[:, : p.shape[1]]
                if q.shape == p.shape:
                    p.copy_(q.to(p.dtype))
        for norm in self.norms:
            norm.weight.copy_(target_model.model.norm.weight.to(norm.weight.dtype))
        return self

    @torch.no_grad()
    def grow_mlp(self, intermediate: int, target_model: nn.Module | None = None) -> DrafterBase:
        """Widen every layer's MLP to `intermediate` channels without changing what the drafter
        computes, so a trained drafter gains capacity and training goes on from where it was.

        The new channels' down-projection columns start at zero (their output is exactly 0); their
        gate/up rows are the target's next MLP channels (the ones `init_from_target` cut) when the
        shapes allow, else small random weights, so they get gradients from the first step."""
        old = self.cfg.intermediate
        if self.packing:
            raise FastEagleError("grow the MLP before packing the drafter for CPU inference")
        if intermediate < old:
            raise FastEagleError(f"cannot shrink the drafter's MLP from {old} to {intermediate} channels")
        if intermediate == old:
            return self
        src = list(target_model.model.layers[-len(self.layers):]) if target_model is not None else []
        for i, layer in enumerate(self.layers):
            mlp, theirs = layer.mlp, (src[i].mlp if i < len(src) else None)
            for name in ("gate_proj", "up_proj"):  # grow in rows (output channels)
                w = getattr(mlp, name).weight
                ref = getattr(theirs, name).weight if theirs is not None else None
                if ref is not None and ref.shape[0] >= intermediate and ref.shape[1] == w.shape[1]:
                    extra = ref[old:intermediate].to(w.device, w.dtype)
                else:
                    extra = nn.init.normal_(w.new_empty(intermediate - old, w.shape[1]), std=0.02)
                setattr(mlp, name, _linear(torch.cat([w, extra], 0)))
            w = mlp.down_proj.weight  # grows in columns (input channels), zero: the output stays the same
            mlp.down_proj = _linear(torch.cat([w, w.new_zeros(w.shape[0], intermediate - old)], 1))
            mlp.intermediate_size = intermediate
        self.cfg.intermediate = intermediate
        self._fused = None
        return self

    @torch.no_grad()
    def set_vocab(self, token_counts: torch.Tensor) -> DrafterBase:
        """Keep the `draft_vocab` most frequent tokens (counts over the training replies): the LM
        head is the drafter's costliest part, and rare tokens are almost never accepted anyway."""
        keep = token_counts.float().topk(self.vocab_ids.numel()).indices.sort().values
        self.vocab_ids.copy_(keep.to(self.vocab_ids.device))
        self._head_w = None
        return self

    @torch.no_grad()
    def grow_vocab(self, n: int, token_counts: torch.Tensor | None = None) -> DrafterBase:
        """Draft over more of the target's vocabulary: the current tokens plus the most frequent others
        (`token_counts`) up to `n`, or all of it when `n` reaches the vocabulary size.

        The head is the target's own frozen LM head, so the new tokens need no new weights, and the
        drafter's layers already aim at the target's next tokens. Why: a 6144-token draft vocab
        leaves about one reply token in ten undraftable (ShareGPT and HumanEval replies of
        SmolLM2), which caps how far a draft can run; training on the whole vocabulary lets the
        drafter learn those tokens too."""
        have, full = self.vocab_ids.numel(), self.cfg.vocab_size
        if n <= have and n < full:
            raise FastEagleError(f"the draft vocab has {have} tokens already; it can only grow")
        if n >= full:
            ids = torch.arange(full, device=self.vocab_ids.device)
        else:
            if token_counts is None:
                raise FastEagleError("growing the draft vocab to part of the vocabulary needs token counts")
            ids = _most_frequent(token_counts, n, keep=self.vocab_ids)  # the current tokens stay
        if self.compact_vocab is None and ids.numel() > have:  # the vocab it grew from, for CPUs
            self.compact_vocab = self.vocab_ids.detach().clone()
        return self._use_vocab(ids)

    @torch.no_grad()
    def set_compact_vocab(self, n: int, token_counts: torch.Tensor) -> DrafterBase:
        """Make the compact vocab (what `shrink_vocab` drafts over by default, a CPU's choice) the `n`
        most frequent draft tokens by `token_counts`, keeping the current compact tokens first.

        Why: the size is a trade the device decides. Each token more costs a head row per depth in
        every draft step, and each reply token outside the compact vocab ends an accepted run."""
        if n > self.vocab_ids.numel():
            raise FastEagleError(f"a compact vocab of {n} tokens does not fit the {self.vocab_ids.numel()}-token "
                                 "draft vocab")
        keep = self.compact_vocab if self.compact_vocab is not None and n >= self.compact_vocab.numel() else None
        self.compact_vocab = _most_frequent(token_counts, n, keep=keep, among=self.vocab_ids).cpu()
        return self

    @torch.no_grad()
    def shrink_vocab(self, ids: torch.Tensor | None = None) -> DrafterBase:
        """Draft over `ids`, part of the current draft vocab, only (default: `compact_vocab`).

        Why: on a CPU the whole head's product costs more draft time than the rare tokens it adds
        are worth at the CPU's small trees (docs/design.md, "A compact draft vocabulary"); restricting
        the softmax to a subset keeps every subset token's ranking, so no weights change."""
        ids = self.compact_vocab if ids is None else ids
        if ids is None:
            raise FastEagleError("shrink_vocab: no token ids given and the drafter has no compact vocab")
        ids = torch.as_tensor(ids, dtype=torch.long).to(self.vocab_ids.device).unique()  # sorted
        if not bool(torch.isin(ids, self.vocab_ids).all()):
            raise FastEagleError("shrink_vocab: some tokens are not in the drafter's draft vocab")
        return self._use_vocab(ids)

    def _use_vocab(self, ids: torch.Tensor) -> DrafterBase:
        """Draft over the sorted token ids `ids` from now on (the head's rows are sliced again)."""
        self.vocab_ids = ids
        self.cfg.draft_vocab = 0 if ids.numel() == self.cfg.vocab_size else ids.numel()
        self._head_w = None
        return self

    def to_draft_ids(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids -> draft indices (-1 where the token is outside the draft vocab)."""
        table = torch.full((self.cfg.vocab_size,), -1, dtype=torch.long, device=self.vocab_ids.device)
        table[self.vocab_ids] = torch.arange(self.vocab_ids.numel(), device=self.vocab_ids.device)
        return table[token_ids.long()]

    @property
    def num_depths(self) -> int:
        """How many depths one draft covers (one per layer unless a subclass says otherwise)."""
        return self.cfg.num_layers

    @property
    def draft_depths(self) -> int:
        """Depths a draft at `tree_budget` can use: a tree of B nodes (root included) keeps none deeper
        than B-1 (every kept node's ancestors are kept too), so work for deeper ones is wasted."""
        return max(1, min(self.num_depths, int(self.tree_budget) - 1))

    @property
    def max_k(self) -> int:
        """The largest top-k of any depth."""
        return self.tree_k if isinstance(self.tree_k, int) else max(self.tree_k)

    def depth_ks(self, n: int) -> list[int] | int:
        """top-k per depth for a tree over n depths (an int: the same at every depth)."""
        return self.tree_k if isinstance(self.tree_k, int) else (list(self.tree_k) + [1] * n)[:n]

    def one_pass_tree(self, root: int, probs: torch.Tensor) -> DraftTree:
        """The tree of `tree_shape` (the product tree by default) over each depth's top-k of `probs` (depths,
        V_draft): a drafter whose one forward gives every depth a distribution that does not depend on the path
        drafted (DFlash, parallel EAGLE; the cascade's dynamic step too)."""
        ks = self.depth_ks(probs.shape[0])
        top_p, top_i = probs.topk(ks if isinstance(ks, int) else max(ks), -1)
        ids = self.vocab_ids[top_i]
        self.inner_passes, self.layer_top = [], layer_top(ids, top_p)
        return TREE_BUILDERS[self.tree_shape](root, ids, top_p, ks, self.tree_budget)

    # -- network --------------------------------------------------------------------------------
    def attach(self, target_model: nn.Module, check: bool = True) -> DrafterBase:
        """Borrow the target's frozen embedding and LM head (refusing a different target)."""
        if check:
            check_fingerprint(self.cfg, target_model)
        self._frozen = (target_model.get_input_embeddings(), target_model.get_output_embeddings())
        self._head_w = None
        return self

    def head_weight(self) -> torch.Tensor:
        """The frozen LM head restricted to the draft vocab (sliced once, not per call), or the drafter's own."""
        if self.cfg.own_head:
            return self.lm_head.weight
        w = self._frozen[1].weight
        if self.vocab_ids.numel() == w.shape[0]:
            return w
        if self._head_w is None or self._head_w.device != w.device or self._head_w.dtype != w.dtype:
            self._head_w = w.detach()[self.vocab_ids.to(w.device)]
        return self._head_w

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's (frozen) embeddings of token ids, or the drafter's own."""
        return self.embed_tokens(ids) if self.cfg.own_embed else self._frozen[0](ids)

    def run_layer(self, i: int, x: torch.Tensor, position_ids: torch.Tensor, pe: tuple[torch.Tensor, torch.Tensor],
                  mask: torch.Tensor | None, cache, attn_in: torch.Tensor | None = None) -> torch.Tensor:
        """Decoder layer i on x; without autograd through the lean forward of `fasteagle.fused`
        (same weights, same result, a third fewer ops), with it through the stock layer. With `attn_in`
        the attention's products read it instead of the input norm of x, and x is the residual only
        (EAGLE-3's first layer)."""
        if not torch.is_grad_enabled():
            return self.fused_layers()[i](x, pe, mask, cache, attn_in)
        layer = self.layers[i]
        if attn_in is not None:
            x = x + layer.self_attn(attn_in, position_embeddings=pe, attention_mask=mask, past_key_values=cache)[0]
            return x + layer.mlp(layer.post_attention_layernorm(x))
        y = layer(x, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                  use_cache=cache is not None, position_embeddings=pe)
        return y[0] if isinstance(y, tuple) else y

    def embed_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.cfg.own_embed else self._frozen[0].weight

    def fused_layers(self) -> list[FusedLayer]:
        if self._fused is None:
            self._fused = [FusedLayer(layer) for layer in self.layers]
        return self._fused

    def head(self, h: torch.Tensor, depth: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the draft vocab of depth `depth` (1-based) from that layer's output (over the
        draft indices `rows` only, if given)."""
        z = self.norms[depth - 1](h)
        if self.proj is not None:
            z = self.proj(z)
        if rows is not None:
            w = self.head_weight()
            w = w[rows.to(w.device)]
            return F.linear(z.to(w.dtype), w)
        return self.vocab_logits(z)

    def vocab_logits(self, z: torch.Tensor) -> torch.Tensor:
        """The frozen LM head over the draft vocab (through the `packing` kind's copy once
        `pack_for_cpu` ran; the target's own head is never changed)."""
        w = self.head_weight()
        if not self.packing:
            return F.linear(z.to(w.dtype), w)
        cls = copy_class(self.packing, w.shape[1])
        if type(self._head_packed) is not cls or self._head_packed.weight is not w:
            # kept out of the module tree: as a child module its `weight`, the target's own head, would join
            # this drafter's parameters and saved file, and the drafter's `.to()` would convert it
            object.__setattr__(self, "_head_packed", cls(w))
        return self._head_packed(z.to(w.dtype))

    @property
    def packed(self) -> bool:
        return self.packing is not None

    def pack_for_cpu(self, int8: bool | None = None) -> DrafterBase:
        """Give the linear layers and the head inference copies for fp32 CPU work (`fasteagle.packing`):
        int8 weights where available (default; `int8=False` or FASTEAGLE_DRAFT_INT8=0: fp32 prepacked).
        Int8 changes the draft's numbers a little, never the output: the fp32 target verifies it.
        Training still works (the copies step aside under autograd)."""
        want_int8 = packing.int8_wanted() if int8 is None else int8 and packing.int8_available()
        n_int8 = pack_linears(self, "int8") if want_int8 else 0
        n_fp32 = pack_linears(self, "fp32")  # what int8 skipped or could not take
        self.packing = "int8" if n_int8 else "fp32" if n_fp32 else None
        return self

    def forward(self, *args, **kwargs):
        """Training entry point (so that wrappers such as DDP see the call): the layer-wise loss."""
        return self.loss(*args, **kwargs)

    def inference_tensors(self) -> list[torch.Tensor]:
        """Every tensor a decode step without autograd reads: parameters, buffers, the target's embedding,
        the head's draft-vocab rows and the fused layers' merged weights (made again first if stale). A
        CUDA graph replays their addresses, so one that changed needs a new capture."""
        fused = self.fused_layers()
        for f in fused:
            f.refresh()
        return [*self.parameters(), *self.buffers(), self.head_weight(), self.embed_weight(),
                *(m.weight for f in fused for m in (f.qkv, f.gate_up))]

    def depth_outputs(self, feats: torch.Tensor, next_ids: torch.Tensor,
                      true_tokens: bool = False, cur_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Teacher-forced outputs for every depth over whole sequences (B, L): entry i-1 at position t
        predicts token t+1+i. The subclass's own network; `true_tokens`: where a depth reads the token the
        one before it drafted, it reads the sequence's own there (`token_source` "true"); `cur_ids`: token t
        at position t, for a network that reads it (`DrafterConfig.current_token`)."""
        raise NotImplementedError

    def loss(self, feats: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
             teacher_ids: torch.Tensor, teacher_probs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Layer-wise supervision on whole sequences (B, L).

        Position t pairs feats[t] with token t+1; depth i there predicts token t+1+i, whose target
        distribution is the teacher's top-k at position t+i, counted only where loss_mask[t+1+i].
        The LM head runs only on the counted positions (prompts cost attention, not vocabulary).
        Teacher tokens outside the draft vocab carry no loss; acc{i} counts them as misses. With
        `loss_targets` "hard" the target is the teacher's top-1 token alone. With `token_source` "true" a
        token-conditioned cascade's layers read the sequence's own tokens where they would read their drafts.
        """
        L = input_ids.shape[1]
        extra = {}
        if self.BLOCKS:  # only where some depth's token counts: position t's depth i predicts t+1+i
            counted, n = F.pad(loss_mask[:, 2:].bool(), (0, self.num_depths)), L - 2
            extra["wanted"] = F.pad(torch.stack([counted[:, i:i + n] for i in range(self.num_depths)]).any(0), (0, 1))
        outs = self.depth_outputs(feats[:, :-1].to(self.dtype), input_ids[:, 1:], self.cfg.token_source == "true",
                                  cur_ids=input_ids[:, :-1], **extra)
        rows, to_row = self._loss_rows(teacher_ids)
        stats, per_depth = {}, []  # (depth, counted (B, n), ce (M,), argmax hit (M,), p of the teacher's top-1 (M,))
        for i, h in enumerate(outs, start=1):
            n = L - 1 - i  # positions t with a token t+1+i
            if n <= 0:
                break
            m = loss_mask[:, i + 1:i + 1 + n].bool()
            if not bool(m.any()):
                continue
            d_ids = self.to_draft_ids(teacher_ids[:, i:i + n][m])  # (M, K), -1 outside the vocab
            t_p = teacher_probs[:, i:i + n][m].float() * (d_ids >= 0)
            if self.cfg.loss_targets == "hard":  # the teacher's top-1 token as a one-hot target
                d_ids, t_p = d_ids[:, :1], (d_ids[:, :1] >= 0).float()
            t_p = t_p / t_p.sum(-1, keepdim=True).clamp_min(1e-9)
            if to_row is not None:  # draft indices -> rows of the candidate head
                d_ids = torch.where(d_ids >= 0, to_row[d_ids.clamp_min(0)], d_ids)
            hits = d_ids[:, 0]
            args = (h[:, :n][m], i, d_ids.clamp_min(0), t_p, hits, rows)
            n_rows = self.head_weight().shape[0] if rows is None else rows.numel()
            if torch.is_grad_enabled() and n_rows * args[0].shape[0] > self.LEAN_LOSS_ELEMENTS:
                # recompute this depth's logits in the backward instead of keeping them: a whole-vocab
                # head would otherwise hold every depth's (M, V) logits at once (tens of GB at 32k tokens)
                ce, correct, p_top = checkpoint(self._depth_loss, *args, use_reentrant=False)
            else:
                ce, correct, p_top = self._depth_loss(*args)
            per_depth.append((i, m, ce, correct, p_top * (hits >= 0)))  # a teacher token outside: p 0, a miss
            stats[f"acc{i}"] = float(correct.float().mean())
            stats[f"loss{i}"] = float(ce.mean().detach())
        total = 0.0
        for (_, _, ce, _, _), w in zip(per_depth, self._depth_weights(per_depth)):
            total = total + (w * ce).mean() if torch.is_tensor(w) else total + w * ce.mean()
        return total, stats

    def _depth_weights(self, per_depth: list) -> list:
        """Each depth's loss weight (`DrafterConfig.loss_weights`): a number, or one weight per counted position.

        decay       loss_decay ** (i - 1) at depth i.
        until-fail  Accept-Until-Fail: depth i counts at position t only while depths 1..i-1 there drafted the
                    teacher's top-1, i.e. up to the chain's first miss (a depth not counted there does not stop it).
        dpace       the chain's expected accepted length E = sum_k prod_{j<=k} q_j, q_j the drafter's probability
                    of the teacher's top-1 at depth j (detached, floored at DPACE_FLOOR so untrained depths still
                    learn): depth i weighs dE/dlog q_i = sum_{k>=i} prod_{j<=k} q_j, scaled to a mean of 1 over
                    the batch's counted positions of every depth (our reading of D-PACE's weights)."""
        scheme = self.cfg.loss_weights
        if scheme == "decay":
            return [self.cfg.loss_decay ** (i - 1) for i, *_ in per_depth]
        if not per_depth:
            return []
        full = per_depth[0][1].shape[0], max(m.shape[1] for _, m, *_ in per_depth)

        def spread(m, values, fill):  # (M,) at the counted positions -> (B, n_max)
            out = torch.full(full, fill, dtype=values.dtype, device=values.device)
            out[:, :m.shape[1]][m] = values
            return out

        if scheme == "until-fail":
            alive, out = torch.ones(full, dtype=torch.bool, device=per_depth[0][2].device), []
            for _, m, _, correct, _ in per_depth:
                out.append(alive[:, :m.shape[1]][m].float())
                alive &= spread(m, correct, True)
            return out
        q = [spread(m, p.detach().float().clamp_min(self.DPACE_FLOOR), 1.0) for _, m, _, _, p in per_depth]
        prefix = torch.stack(q).cumprod(0)  # prod_{j<=k} q_j, (depths, B, n_max)
        tail = prefix.flip(0).cumsum(0).flip(0)  # sum_{k>=i} prefix_k
        out = [tail[d, :, :m.shape[1]][m] for d, (_, m, *_) in enumerate(per_depth)]
        scale = torch.cat(out).mean().clamp_min(1e-9)
        return [w / scale for w in out]

    def _loss_rows(self, teacher_ids: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The draft rows the loss's softmax covers, and a draft index -> row table (None, None: all).

        Why: on a CPU a whole-vocabulary head is most of a training step, and most of its rows are
        tokens the replies rarely hold, so with `loss_vocab` set (the most frequent reply tokens'
        draft indices) the softmax runs over those plus every teacher token of the batch (a sampled
        softmax whose negatives are the frequent tokens). Rows outside get no gradient: meant for
        continuing a drafter trained on the whole vocab."""
        if self.loss_vocab is None:
            return None, None
        in_vocab = self.to_draft_ids(teacher_ids.reshape(-1))
        rows = torch.unique(torch.cat([self.loss_vocab.to(in_vocab.device), in_vocab[in_vocab >= 0]]))
        to_row = torch.full((self.vocab_ids.numel(),), -1, dtype=torch.long, device=rows.device)
        to_row[rows] = torch.arange(rows.numel(), device=rows.device)
        return rows, to_row

    DPACE_FLOOR = 0.05  # "dpace" weights: the least probability a depth counts with (untrained depths still learn)
    LEAN_LOSS_ELEMENTS = 1 << 28  # logits (M positions x V draft tokens) above which a depth's loss is recomputed

    def _depth_loss(self, h: torch.Tensor, depth: int, ids: torch.Tensor, probs: torch.Tensor,
                    hits: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Cross-entropy of depth `depth`'s draft distribution against the teacher's top-k (`ids`,
        `probs`, (M, K)) at the M counted positions, whether its argmax is the teacher's top-1 (`hits`) and the
        probability it gives that token;
        with `rows`, over those rows of the draft vocab only (`ids` and `hits` index `rows`)."""
        logp = F.log_softmax(self.head(h, depth, rows).float(), -1)  # (M, V_draft) or (M, rows)
        ce = -(probs * logp.gather(-1, ids)).sum(-1)
        top = logp.detach().gather(-1, hits.clamp_min(0)[:, None])[:, 0].exp()  # p of the teacher's top-1
        return ce, logp.detach().argmax(-1) == hits, top

    # -- files ----------------------------------------------------------------------------------
    def save(self, out: str | Path, extra: dict | None = None, dtype: torch.dtype = torch.float16,
             shard_mb: float | None = None) -> None:
        """Write config.json and model.safetensors (or model-00000.safetensors... shards of at most
        `shard_mb` MB each, for transports with a per-file limit). Each file is replaced whole, the
        weights before the config, and stale shards go last: an interrupted save (rewriting a drafter
        in place) leaves the old drafter loadable."""
        from safetensors.torch import save_file

        out = Path(out)
        state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous().clone()
                 for k, v in self.state_dict().items()}  # clones: a tensor two modules share is written twice
        if self.compact_vocab is not None:
            state[COMPACT_VOCAB_KEY] = self.compact_vocab.detach().to("cpu").contiguous()
        shards, cur, size = [], {}, 0
        for k, v in state.items():
            nbytes = v.numel() * v.element_size()
            if shard_mb and cur and size + nbytes > shard_mb * 2**20:
                shards.append(cur)
                cur, size = {}, 0
            cur[k], size = v, size + nbytes
        shards.append(cur)
        names = [f"model-{i:05d}.safetensors" for i in range(len(shards))] if len(shards) > 1 else ["model.safetensors"]
        for name, shard in zip(names, shards):
            with atomic_path(out / name) as tmp:
                save_file(shard, str(tmp))
        write_text(out / "config.json", json.dumps(asdict(self.cfg) | (extra or {}), indent=2))
        for old in out.glob("model*.safetensors"):
            if old.name not in names:
                old.unlink()

    @classmethod
    def load(cls, path: str | Path, target_model: nn.Module | None = None, int8: bool | None = None) -> DrafterBase:
        """Load from a directory; with `target_model`, attach to it (refusing a mismatch). A drafter
        of a prepacked (fp32 CPU) target is packed too, with int8 weights unless `int8` is False."""
        path = Path(path)
        raw, cfg, files = peek(path)
        if cfg.kind != cls.KIND:
            raise FastEagleError(f"{path} holds a drafter of kind {cfg.kind!r}, not {cls.KIND!r}")
        drafter = cls(cfg)
        state = {k: v.float() if v.is_floating_point() else v for f in files for k, v in _read_weights(f).items()}
        drafter.compact_vocab = state.pop(COMPACT_VOCAB_KEY, None)
        try:
            drafter.load_state_dict(state)
        except RuntimeError as exc:  # tensors of other shapes or names than config.json describes
            detail = str(exc).splitlines()[1:2] or [str(exc)]
            raise FastEagleError(f"the weights at {path} do not match its config.json: {detail[0].strip()}") from None
        drafter.info, drafter.path = raw, str(path)
        return finish_load(drafter, target_model, int8)


def finish_load(drafter: DrafterBase, target_model: nn.Module | None, int8: bool | None) -> DrafterBase:
    """A loaded drafter attached to `target_model` (refusing a mismatch), on its device and dtype, and
    packed when the target is (a prepacked fp32 CPU target), with int8 weights unless `int8` is False."""
    if target_model is not None:
        drafter.attach(target_model)
        p = next(target_model.parameters())
        drafter.to(p.device, p.dtype).eval()
        if any(isinstance(m, PackedLinear) for m in target_model.modules()):
            drafter.pack_for_cpu(int8)
    return drafter



def _read_weights(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(file)
    except (SafetensorError, OSError) as exc:
        raise FastEagleError(f"the drafter weights {file} are corrupt or truncated ({exc}); copy them again or "
                             "train the drafter again") from None



def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (B, H, T, D) at the positions cos/sin (B, T, D) were made for."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def layer_top(ids: torch.Tensor, probs: torch.Tensor) -> list[list[list]]:
    """Each layer's candidates, [[token id, prob], ...] per depth best first, from the (N, k) top-k lists
    the tree was built from: the stage shows the best few, the what-if model (`fasteagle.whatif`)
    rebuilds from all of them the tree any budget would have drafted. Four significant digits."""
    return [[[t, float(f"{p:.4g}")] for t, p in zip(i, q)] for i, q in zip(ids.tolist(), probs.float().tolist())]


def reuse_cache(cache: KVCache | None, layers: int, capacity: int, dtype: torch.dtype,
                device: torch.device) -> KVCache:
    """`cache` reset, or a new one where it is missing, too small or was made for another dtype or
    device (a drafter moved since: its keys would be cast on write, and attention fail)."""
    if cache is None or cache.capacity < capacity or any(
            layer.is_initialized and (layer.keys.dtype, layer.keys.device) != (dtype, device)
            for layer in cache.layers):
        cache = KVCache(layers, capacity)
    cache.reset()
    return cache

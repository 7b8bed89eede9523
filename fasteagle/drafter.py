"""FastEagle's cascaded drafter: N small decoder layers in series, one draft depth per layer.

    g_t   = concat(target hidden states of a low, a middle and a high layer at position t)
    h_1   = L1(FC(concat(g_t, embed(x_{t+1}))))        h_i = L_i(h_{i-1})
    p_i   = softmax(lm_head(norm_i(h_i)))   ->  the token at position t+1+i

With `token_conditioned`, layer i+1 also reads the token depth i drafts (its top-1, known within the
same forward): h_{i+1} = L_{i+1}(h_i + T_i(embed(argmax p_i))), T_i a linear map that starts at zero,
so a plain cascade grows into one without changing its function. By default it trains on its own top-1;
with `token_source` "true" on the sequence's own token at that depth: the one the deeper targets are
conditioned on and, on the target's greedy replies, the one depth i must draft for depth i+1 to count at all
(EAGLE-3's training-time test likewise feeds its steps the true tokens, beside its own hidden states).
Drafting always reads its own top-1; side branches of the tree are not conditioned.

With `current_token`, row t reads its own token too: h_1 = L1(FC(concat(g_t, embed(x_{t+1}))) + C(embed(x_t))),
C a linear map that starts at zero (a plain cascade grows into one without changing its function).
Copying the context (the target restating a document) is an induction match: find the earlier row whose
token is the one being continued, and read the token after it. Row j holds x_{j+1}, which the match must
read, and now x_j in the clear, which it must match: one attention layer can copy, where without it the
match had to be learned through the target's features of x_j.

With `kv_inject`, every layer's keys and values come from each row's fused input FC(concat(g_t, embed(x_{t+1})))
(through the layer's own input norm and k/v projections), as DFlash's layers read the target's features; the
queries still flow down the cascade (layer i's from h_{i-1}). Each layer then sees the target's features of the
whole context directly, and a decode step feeds accepted rows' keys and values to every layer but runs the
stack on the last row alone (the dynamic step; the fixed-shape one runs its few padded rows through them all,
as for a plain cascade, which must: each layer's output there is the next layer's keys).

One forward yields every depth's distribution (an EAGLE-style drafter needs one forward per
depth). Each layer is a stock `LlamaDecoderLayer` attending causally over the accepted prefix with
its own KV cache; the embedding and LM head are the target's own, frozen, and not saved here
(`fasteagle.draftbase`). What a decode keeps between steps (the caches, how a step runs, each
layer's last output) is the drafter's `CascadeState`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from fasteagle.draftbase import DrafterBase, layer_top, reuse_cache, rope
from fasteagle.draftconfig import DrafterConfig
from fasteagle.draftgraph import DraftStep, device_tree_wanted, graphs_wanted
from fasteagle.kvcache import KVCache, attention_mask, causal_ancestors, limit_to_window
from fasteagle.tree import DEFAULT_TREE_SHAPE, TREE_BUILDERS, DraftTree, per_depth_k, product_fits

__all__ = ["CascadeState", "CascadedDrafter", "DrafterConfig"]


class CascadedDrafter(DrafterBase):
    """The cascade network, and (with `attach`) a drafter for the generation loop."""

    KIND = "fasteagle"

    def __init__(self, cfg: DrafterConfig):
        super().__init__(cfg)
        self.fc = nn.Linear(len(cfg.feature_layers) * cfg.target_hidden + cfg.target_hidden, cfg.width, bias=False)
        self._add_decoder()
        self.apply(self._init)
        if cfg.current_token:  # zero at the start: the plain cascade's function (docstring above)
            self._add_cur_fc()
        if cfg.token_conditioned:  # zero at the start: the plain cascade's function (docstring above)
            self.tok_fc = nn.ModuleList(nn.Linear(cfg.target_hidden, cfg.width, bias=False)
                                        for _ in range(cfg.num_layers - 1))
            for lin in self.tok_fc:
                nn.init.zeros_(lin.weight)
        # EAGLE 3.1's norms: each target feature normalized before fc (`fc_norm`), and each layer passing its
        # normalized output, what its head reads, to the next (`norm_output`)
        self.fc_norm = nn.ModuleList(LlamaRMSNorm(cfg.target_hidden, eps=cfg.rms_norm_eps)
                                     for _ in cfg.feature_layers) if cfg.fc_norm else None
        # The tree keeps the budget's most probable paths whatever k is, so k only caps the choice; 32
        # accepts more than EAGLE's 10 at 60 nodes (docs/design.md), and small trees never reach k.
        self.tree_k = 32
        self.tree_shape = DEFAULT_TREE_SHAPE  # or "backbone": the paper's constrained tree (side branches are leaves)
        # each layer attends over only its last this many positions (0: all); trained with it, or set to
        # draft so with a drafter that trained on shorter contexts than it drafts over (`bench --diagnose`)
        self.attention_window = cfg.attention_window
        # read only a prompt's last this many tokens (0: all): the drafter's own prefill costs at most that many
        # positions however long the prompt (`bench --draft-step --prefixes`, `bench --diagnose tailT`)
        self.prefill_tail = 0
        self.state = CascadeState(self)

    @property
    def step_mode(self) -> str | None:
        """How decode steps run: `CascadeState.step_mode`."""
        return self.state.step_mode

    @step_mode.setter
    def step_mode(self, mode: str | None) -> None:
        self.state.step_mode = mode

    @property
    def tree_on_device(self) -> bool | None:
        """Whether a fixed-shape step builds the tree itself: `CascadeState.tree_on_device`."""
        return self.state.tree_on_device

    @tree_on_device.setter
    def tree_on_device(self, wanted: bool | None) -> None:
        self.state.tree_on_device = wanted

    @property
    def last(self) -> torch.Tensor | None:
        """Each active layer's output at the last accepted position (active layers, width)."""
        return self.state.last

    # -- network --------------------------------------------------------------------------------
    def hidden(self, feats: torch.Tensor, next_ids: torch.Tensor, position_ids: torch.Tensor,
               mask: torch.Tensor | None = None, cache: KVCache | None = None,
               layers: int | None = None, depth_tokens: list[torch.Tensor] | None = None,
               cur_ids: torch.Tensor | None = None, last_only: bool = False) -> list[torch.Tensor]:
        """Outputs of the first `layers` layers (all by default), (B, L, width) each. mask=None means
        plain causal attention, within the drafter's `attention_window` where it has one. A token-conditioned
        layer i+1 reads `depth_tokens[i]` (B, L) where given, else depth i's own top-1. `cur_ids` (B, L): each
        row's own token, which a `current_token` cascade reads beside `next_ids`. `last_only`: only the last
        row's outputs are wanted; a `kv_inject` cascade then runs its layers on that row alone (B, 1, width)."""
        if mask is None and cache is None and self.attention_window:
            n = next_ids.shape[1]
            mask = attention_mask(causal_ancestors(n, next_ids.device), 0, feats.dtype)
            limit_to_window(mask, position_ids[0], self.attention_window)
        embed = self.embed(next_ids).to(feats.dtype)
        if self.fc_norm is not None:
            feats = torch.cat([n(c) for n, c in zip(self.fc_norm, feats.chunk(len(self.fc_norm), -1))], -1)
        x = self.fc(torch.cat([feats, embed], -1))
        if self.cfg.current_token:
            if cur_ids is None:
                raise ValueError("a current_token cascade reads each row's own token: pass cur_ids")
            x = x + self.cur_fc(self.embed(cur_ids).to(feats.dtype))
        pe = self.rotary(x, position_ids)
        kv = x if self.cfg.kv_inject else None
        if kv is not None and last_only:
            x = x[:, -1:]
        outs = []
        run = range(len(self.layers))[:layers]
        for i in run:
            if kv is None:
                x = self.run_layer(i, x, position_ids, pe, mask, cache)
            else:
                x = self.injected_layer(i, x, kv, pe, mask, cache)
            outs.append(x)
            if self.cfg.norm_output and i + 1 < len(run):
                x = self.norms[i](x)
            if self.cfg.token_conditioned and i + 1 < len(run):
                tok = self.top_token_embedding(x, i + 1) if depth_tokens is None else self.embed(depth_tokens[i])
                x = x + self.tok_fc[i](tok.to(x.dtype))
        return outs

    def injected_layer(self, i: int, x: torch.Tensor, kv: torch.Tensor, pe: tuple[torch.Tensor, torch.Tensor],
                       mask: torch.Tensor | None, cache: KVCache | None) -> torch.Tensor:
        """Layer i (the stock layer's weights) with its queries from x (B, Q, W), the last Q of the rows kv
        (B, T, W) holds, and its keys and values from kv, the fused input, joined to `cache`'s; `pe` and the
        additive `mask` (.., T, past+T) are the T rows' (None: causal)."""
        layer, a = self.layers[i], self.layers[i].self_attn
        (b, q), t = x.shape[:2], kv.shape[1]
        cos, sin = pe
        heads = (-1, self.cfg.head_dim)
        h, c = layer.input_layernorm(x), layer.input_layernorm(kv)
        qs = rope(a.q_proj(h).view(b, q, *heads).transpose(1, 2), cos[:, -q:], sin[:, -q:])
        ks = rope(a.k_proj(c).view(b, t, *heads).transpose(1, 2), cos, sin)
        vs = a.v_proj(c).view(b, t, *heads).transpose(1, 2)
        if cache is not None:
            ks, vs = cache.update(ks, vs, i)
        if mask is not None:
            mask = mask[..., -q:, :]
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=mask is None and q > 1,
                                           scale=a.scaling, enable_gqa=True)
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, q, -1))
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def top_token_embedding(self, h: torch.Tensor, depth: int) -> torch.Tensor:
        """The target's embedding of depth `depth`'s top-1 draft from that layer's output h (no gradient)."""
        with torch.no_grad():
            return self.embed(self.vocab_ids[self.head(h, depth).argmax(-1)])

    def depth_outputs(self, feats: torch.Tensor, next_ids: torch.Tensor,
                      true_tokens: bool = False, cur_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Teacher-forced outputs for every depth over whole sequences: entry i-1 at position t
        predicts token t+1+i. For the cascade that is simply layer i's output. With `true_tokens` a
        token-conditioned layer i+1 reads the sequence's token t+1+i at slot t (`token_source` "true"),
        not depth i's draft of it. `cur_ids`: token t at slot t (`hidden`)."""
        b, n = next_ids.shape
        depth_tokens = None
        if true_tokens and self.cfg.token_conditioned:
            pad = F.pad(next_ids, (0, len(self.layers)))  # next_ids[t] is token t+1
            depth_tokens = [pad[:, d:d + n] for d in range(1, len(self.layers))]
        return self.hidden(feats, next_ids, torch.arange(n, device=next_ids.device)[None].expand(b, -1),
                           depth_tokens=depth_tokens, cur_ids=cur_ids)

    def add_current_token(self) -> None:
        """Grow a plain cascade into a `current_token` one: `cur_fc` starts at zero, so the drafter's function
        is unchanged until it trains."""
        self._add_cur_fc()
        self.cfg.current_token = True

    def _add_cur_fc(self) -> None:
        w = self.fc.weight
        self.cur_fc = nn.Linear(self.cfg.target_hidden, self.cfg.width, bias=False, device=w.device, dtype=w.dtype)
        nn.init.zeros_(self.cur_fc.weight)

    # -- drafter protocol -----------------------------------------------------------------------
    def reset(self, capacity: int = 4096) -> None:
        """Start a sequence of at most `capacity` positions (`CascadeState.reset`)."""
        self.state.reset(capacity)

    def rewind(self, length: int) -> None:
        """Forget every position from `length` on (a benchmark repeating one step)."""
        self.state.rewind(length)

    def extend(self, tokens: torch.Tensor, features: torch.Tensor | None, next_token: int) -> None:
        """Feed newly accepted positions (`CascadeState.extend`)."""
        self.state.extend(tokens, features, next_token)

    @torch.no_grad()
    def depth_probs(self, last: torch.Tensor | None = None) -> torch.Tensor:
        """(D, V_draft) draft distributions for depths 1..D from each layer's output `last` (D, W)
        (default: the last extend's; index with `vocab_ids` for token ids)."""
        last = self.state.last if last is None else last
        norms = self.norms[:last.shape[0]]  # each depth's own final norm, all in one op
        z = F.rms_norm(last.float(), last.shape[-1:], eps=norms[0].variance_epsilon)
        z = (z * torch.stack([n.weight for n in norms]).float()).to(last.dtype)
        if self.proj is not None:
            z = self.proj(z)
        return torch.softmax(self.vocab_logits(z).float(), -1)  # every depth in one product

    @torch.no_grad()
    def draft(self, root: int) -> DraftTree:
        last = self.state.last
        ks = self.depth_ks(last.shape[0])
        k = ks if isinstance(ks, int) else max(ks)
        build = TREE_BUILDERS[self.tree_shape]
        step = self.state.fixed_step()
        if step is not None and step.tree is not None and step.tree_spec == self.state.tree_spec():
            self.layer_top = []  # the step built the tree on its device: no top-k lists came back
            return DraftTree(*step.tree)  # built by the step itself, on its device (valid until the next extend)
        if step is not None and step.topk is not None and step.k >= k:
            # the step's top-k came with it: one copy to the host, the tree built there and sent back
            top = step.topk[:, :, :k].cpu()
            self.layer_top = layer_top(top[1].long(), top[0])
            return build(root, top[1].long(), top[0], ks, self.tree_budget).to(last.device)
        return self.one_pass_tree(root, self.depth_probs())


class CascadeState:
    """A cascade's decoding between `reset`s, and how its steps run.

    `step_mode`: "dynamic" (a growing KV cache, the CPU's fastest), "static" (fixed shapes,
    `fasteagle.draftgraph.DraftStep`), "graph" (static, replayed as a CUDA graph); None: "graph" on a
    GPU (unless FASTEAGLE_DRAFT_GRAPH=0), "dynamic" elsewhere.
    `tree_on_device`: whether a fixed-shape step builds the product tree itself (`tree.product_fixed`),
    not the host from its top-k; None: in a CUDA graph (unless FASTEAGLE_DEVICE_TREE=0), where it
    spares the step a host round trip; on a CPU the host's heap is faster.
    The keys and values are in `cache` (dynamic) or `step` (fixed shapes; kept for the next sequence
    where it fits). `last` holds each active layer's output at the last accepted position,
    `active_layers` the layers run per decode (fixed at `reset`: every layer with `all_layers`, else
    those the tree can use), `capacity` the positions this sequence may hold.
    """

    def __init__(self, drafter: CascadedDrafter):
        self.drafter = drafter
        self.step_mode: str | None = None
        self.tree_on_device: bool | None = None
        self.all_layers = False
        self.cache: KVCache | None = None
        self.step: DraftStep | None = None
        self.last: torch.Tensor | None = None
        self.active_layers = drafter.cfg.num_layers
        self.capacity = 0
        self.skipped = 0  # prompt positions the drafter never read (`prefill_tail`); the dynamic cache starts after

    def mode(self) -> str:
        """The decode step's kind this sequence (see `step_mode`)."""
        if self.drafter.cfg.current_token:  # the fixed-shape step feeds next tokens only
            return "dynamic"
        if self.step_mode is not None:
            return self.step_mode
        return "graph" if graphs_wanted(self.drafter.device) else "dynamic"

    def fixed_step(self) -> DraftStep | None:
        """The fixed-shape step this sequence runs on (None: the dynamic step runs, or none is made yet)."""
        return self.step if self.mode() != "dynamic" else None

    def tree_spec(self) -> tuple | None:
        """(per-depth k, budget) for a fixed step that builds its own tree, or None (the host builds it)."""
        d = self.drafter
        wanted = self.tree_on_device
        if wanted is None:
            wanted = self.mode() == "graph" and device_tree_wanted()
        n = self.active_layers
        ks = per_depth_k(d.depth_ks(n), n, d.max_k)
        if not wanted or d.tree_shape != "product" or not product_fits(ks, n, d.tree_budget):
            return None
        return tuple(ks), d.tree_budget

    def reset(self, capacity: int) -> None:
        """Start a sequence. A tree of `tree_budget` nodes reaches at most depth budget-1, so only
        that many layers run until the next reset: the deeper ones could never place a node, and
        skipping them (caches included) makes small trees' drafts cheaper at no loss."""
        d = self.drafter
        self.last = None
        self.skipped = 0
        self.active_layers = d.cfg.num_layers if self.all_layers else d.draft_depths
        self.capacity = capacity
        if self.step is not None:
            self.step.reset(capacity)
        if self.mode() == "dynamic":
            self.cache = reuse_cache(self.cache, d.cfg.num_layers, capacity, d.dtype, d.device)

    def rewind(self, length: int) -> None:
        step = self.fixed_step()
        if step is not None:
            step.rewind(length)
        else:
            self.cache.truncate(max(0, length - self.skipped))

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, features: torch.Tensor | None, next_token: int) -> None:
        """Feed newly accepted positions through the active layers (see `reset`); keep each one's last output."""
        d = self.drafter
        skip = tokens.numel() - d.prefill_tail if self.last is None and d.prefill_tail else 0
        if skip > 0:  # the prompt: only its last `prefill_tail` tokens are read, at their true positions
            tokens, features = tokens[skip:], features[skip:]
        if self.mode() != "dynamic":
            step = self._fitting_step()
            if skip > 0:
                step.skip(skip)
            step.extend(tokens, features, next_token)
            self.last = step.last
            return
        self.skipped += max(skip, 0)
        n = tokens.numel()
        nxt = torch.cat([tokens[1:], tokens.new_tensor([next_token])])
        past = self.cache.length
        self.cache.reserve(n)
        pos = torch.arange(self.skipped + past, self.skipped + past + n, device=tokens.device)[None]
        mask = None  # a prefill of the whole context: causal attention, without an (n, n) mask to add
        if past or d.attention_window:  # cache rows are positions less the `skipped` ones
            mask = limit_to_window(attention_mask(causal_ancestors(n, tokens.device), past, d.dtype),
                                   pos[0] - self.skipped, d.attention_window)
        outs = d.hidden(features[None].to(d.dtype), nxt[None], pos, mask, self.cache, self.active_layers,
                        cur_ids=tokens[None], last_only=True)
        self.last = torch.stack([o[0, -1] for o in outs])  # (active layers, width)

    def _fitting_step(self) -> DraftStep:
        """The fixed step, made anew at the start of a sequence it does not fit."""
        d, step, spec = self.drafter, self.step, self.tree_spec()
        if step is None or (step.length == 0 and not step.fits(self.capacity, self.active_layers, d.max_k, spec)):
            room = -(-self.capacity // 1024) * 1024  # rounded up: a longer prompt rarely needs a new capture
            self.step = step = DraftStep(d, room, self.active_layers, d.max_k, graph=self.mode() == "graph", tree=spec)
            step.reset(self.capacity)
        return step

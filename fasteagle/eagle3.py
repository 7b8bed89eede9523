"""The EAGLE-3-style baseline: one decoder layer run once per depth (autoregressive drafting).

    g_t = FC(target low|mid|high hidden states at t)                       (step 1)
    h   = g_t + Attn([norm(embed(x_{t+1})); norm(g_t)]), then its MLP       -> p(x_{t+2})
    step a > 1 feeds the layer its own previous output as g, with the next token's embedding.

Training-time test (TTT): the layer is unrolled for `depth` steps over whole sequences, each step
fed the previous step's outputs, so training sees what drafting sees; step a's loss is the same
layer-wise loss as the cascade's depth a (`DrafterBase.loss`). Drafting grows an EAGLE-2
dynamic tree: per depth expand the top-k frontier nodes by cumulative log-probability, then a
global rerank keeps the best `tree_budget - 1` nodes.

That is EAGLE-3's own network (layout "eagle3", what `fasteagle.eagle3_format` reads and writes), built
from a stock `LlamaDecoderLayer` with wider q/k/v (no forked modeling code); the LM head is the target's
frozen one over the draft vocab unless an imported checkpoint brings its own. Layout "proj", our
first drafter's, puts a linear projection of that concatenation in front of a stock layer instead.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from fasteagle.draftbase import DrafterBase, reuse_cache
from fasteagle.draftconfig import DrafterConfig
from fasteagle.kvcache import KVCache, attention_mask, causal_ancestors
from fasteagle.tree import DraftTree, dynamic

LAYOUTS = ("proj", "eagle3")  # `DrafterConfig.layout`


class AutoregressiveDrafter(DrafterBase):
    """EAGLE-3 style drafter: one decoder layer, run once per depth."""

    KIND = "eagle3"

    def __init__(self, cfg: DrafterConfig):
        if cfg.layout not in LAYOUTS:
            raise ValueError(f"unknown EAGLE-3 layout {cfg.layout!r}; one of {', '.join(LAYOUTS)}")
        if cfg.layout == "proj" and cfg.num_layers != 1:
            raise ValueError("the EAGLE-3-style drafter has exactly one decoder layer (num_layers=1)")
        super().__init__(cfg)
        if cfg.layout == "eagle3":
            self._eagle3_modules()
        else:
            self._proj_modules()
        self.cache: KVCache | None = None
        self.last: torch.Tensor | None = None  # the layer's output at the last accepted position (W,)

    def _proj_modules(self) -> None:
        """Ours: x = Proj(concat(norm(embed), norm(g))) into a stock decoder layer."""
        cfg = self.cfg
        w, h = cfg.width, cfg.target_hidden
        self.register_module("fc", None)  # made below, first in the parameter order all the same
        # A seed's first draws go to a cascade-shaped input layer, made and dropped here: so a seed gives
        # the initial weights the shipped drafter and the recorded traces (tests/golden) were made from.
        spare = nn.Linear(len(cfg.feature_layers) * h + h, w, bias=False)
        self._add_decoder()
        nn.init.normal_(spare.weight, std=0.02)
        self.apply(self._init)
        self.fc = nn.Linear(len(cfg.feature_layers) * h, w, bias=False)
        self.in_proj = nn.Linear(h + w, w, bias=False)
        self.norm_embed = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.norm_g = LlamaRMSNorm(w, eps=cfg.rms_norm_eps)
        nn.init.normal_(self.fc.weight, std=0.02)
        nn.init.normal_(self.in_proj.weight, std=0.02)

    def _eagle3_modules(self) -> None:
        """EAGLE-3's own (the EAGLE repository's `midlayer`, vLLM's `llama_eagle3.py`): layer 0's query,
        key and value products read [input_layernorm(embed); hidden_norm(g)] (2W wide), its residual is
        g; layers 1.. are stock; one final norm. Module names follow the format's weight names."""
        cfg = self.cfg
        w, feats = cfg.width, len(cfg.feature_layers) * cfg.target_hidden
        if cfg.width != cfg.target_hidden and not cfg.own_embed:
            raise ValueError("an EAGLE-3 layer narrower or wider than the target needs an embedding of its own")
        self._add_decoder()
        self.norms = self.norms[:1]  # one final norm, whatever the depth
        self.proj = None  # the head (own, or the target's over a width-matched drafter) reads W
        attn = self.layers[0].self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * w, old.out_features, bias=cfg.attention_bias))
        self.layers[0].hidden_norm = LlamaRMSNorm(w, eps=cfg.rms_norm_eps)
        self.input_norm = LlamaRMSNorm(feats, eps=cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc_norm = nn.ModuleList(LlamaRMSNorm(cfg.target_hidden, eps=cfg.rms_norm_eps)
                                     for _ in cfg.feature_layers) if cfg.fc_norm else None
        self.fc = nn.Linear(feats, w, bias=False)
        if cfg.own_head:
            self.lm_head = nn.Linear(w, cfg.draft_vocab or cfg.vocab_size, bias=False)
        if cfg.own_embed:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, w)
        self.apply(self._init)

    @torch.no_grad()
    def to_eagle3_layout(self) -> AutoregressiveDrafter:
        """A drafter of EAGLE-3's layout that starts near this "proj" one, for training to go on from it:
        the same fc, norms, MLP and attention output; layer 0's q/k/v fold in the projection (its input
        norm taken as a constant scale, measured on unit inputs). Not the same function: EAGLE-3's
        residual is g, ours the projection, so it needs training before it drafts as well."""
        if self.cfg.layout == "eagle3":
            return self
        cfg = replace(self.cfg, layout="eagle3")
        new = AutoregressiveDrafter(cfg).to(self.fc.weight.device)
        new.load_state_dict({k: v for k, v in self.state_dict().items() if k in new.state_dict()
                             and v.shape == new.state_dict()[k].shape}, strict=False)
        first, old = new.layers[0], self.layers[0]
        first.input_layernorm.weight.copy_(self.norm_embed.weight)
        first.hidden_norm.weight.copy_(self.norm_g.weight)
        u = torch.randn(256, self.in_proj.in_features, device=self.fc.weight.device) * torch.cat(
            [self.norm_embed.weight, self.norm_g.weight])
        scale = self.in_proj(u).pow(2).mean(-1).sqrt().mean()  # the input norm's divisor, typically
        fold = old.input_layernorm.weight[:, None] * self.in_proj.weight / scale  # (W, 2W)
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(first.self_attn, name).weight.copy_(getattr(old.self_attn, name).weight @ fold)
        new.vocab_ids, new.compact_vocab = self.vocab_ids.clone(), self.compact_vocab
        new.info, new._frozen = getattr(self, "info", {}), self._frozen
        return new

    @classmethod
    def config_for(cls, base: DrafterConfig, depth: int = 7) -> DrafterConfig:
        base.kind, base.num_layers, base.depth = cls.KIND, 1, depth
        return base

    @property
    def num_depths(self) -> int:
        return self.cfg.depth

    def head(self, h: torch.Tensor, depth: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        return super().head(h, 1, rows)  # one layer, one norm, whatever the depth

    def combine(self, feats: torch.Tensor) -> torch.Tensor:
        """g from the target's concatenated features (..., F*H): `fc`, after the format's norms if any."""
        if self.cfg.layout == "eagle3":
            if self.input_norm is not None:
                feats = self.input_norm(feats)
            if self.fc_norm is not None:
                feats = torch.cat([n(c) for n, c in zip(self.fc_norm, feats.chunk(len(self.fc_norm), -1))], -1)
        return self.fc(feats)

    def step(self, g: torch.Tensor, next_ids: torch.Tensor, position_ids: torch.Tensor,
             mask: torch.Tensor | None, cache) -> torch.Tensor:
        """One pass of the layer(s): g (B, T, W) with the embeddings of next_ids (B, T)."""
        e = self.embed(next_ids).to(g.dtype)
        if self.cfg.layout == "proj":
            x = self.in_proj(torch.cat([self.norm_embed(e), self.norm_g(g)], -1))
            return self.run_layer(0, x, position_ids, self.rotary(x, position_ids), mask, cache)
        first = self.layers[0]
        hn = first.hidden_norm(g)
        pe = self.rotary(g, position_ids)
        x = self.run_layer(0, hn if self.cfg.norm_before_residual else g, position_ids, pe, mask, cache,
                           attn_in=torch.cat([first.input_layernorm(e), hn], -1))
        for i in range(1, len(self.layers)):
            x = self.run_layer(i, x, position_ids, pe, mask, cache)
        return x

    def depth_outputs(self, feats: torch.Tensor, next_ids: torch.Tensor,
                      true_tokens: bool = False, cur_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Training-time test: `depth` unrolled steps over whole sequences (each step reads the sequence's
        own token, so `true_tokens` changes nothing).

        Step a at slot t stands at position t+a-1, reads token t+a and the previous step's output
        at slot t, and attends to step 1's slots <= t (the real prefix) plus its own chain's
        earlier steps (the diagonal), exactly what drafting a chain from position t sees.
        """
        b, n = next_ids.shape
        dev, dtype = next_ids.device, self.fc.weight.dtype
        full_ids = torch.cat([next_ids, next_ids.new_zeros(b, self.cfg.depth)], 1)  # pad beyond the end
        cache = DynamicCache()
        g = self.combine(feats)
        slots = torch.arange(n, device=dev)
        eye = slots[:, None] == slots[None]
        outs = []
        for a in range(1, self.cfg.depth + 1):
            allowed = [slots[None] <= slots[:, None]] + [eye] * (a - 1)  # step 1 causal, later steps diagonal
            allowed = torch.cat(allowed, 1)
            mask = torch.zeros(n, a * n, dtype=dtype, device=dev).masked_fill_(~allowed, torch.finfo(dtype).min)
            pos = (slots + a - 1)[None].expand(b, -1)
            g = self.step(g, full_ids[:, a - 1:a - 1 + n], pos, mask[None, None], cache)
            outs.append(g)
        return outs

    # -- drafter protocol -----------------------------------------------------------------------
    def reset(self, capacity: int = 4096) -> None:
        room = capacity + self.cfg.depth * self.max_k  # the draft's own temporary rows too
        self.cache = reuse_cache(self.cache, len(self.layers), room, self.dtype, self.device)
        self.last = None

    def rewind(self, length: int) -> None:
        """Forget every position from `length` on (a benchmark repeating one step)."""
        self.cache.truncate(length)

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, features: torch.Tensor | None, next_token: int) -> None:
        """Feed newly accepted positions (real target features) through the layer once."""
        n = tokens.numel()
        nxt = torch.cat([tokens[1:], tokens.new_tensor([next_token])])
        past = self.cache.length
        self.cache.reserve(n)
        pos = torch.arange(past, past + n, device=tokens.device)[None]
        dtype = self.fc.weight.dtype
        # a prefill of the whole context attends causally, without an (n, n) mask to add
        mask = attention_mask(causal_ancestors(n, tokens.device), past, dtype) if past else None
        g = self.combine(features[None].to(dtype))
        self.last = self.step(g, nxt[None], pos, mask, self.cache)[0, -1]  # (W,)

    @torch.no_grad()
    def draft(self, root: int) -> DraftTree:
        """EAGLE-2 dynamic tree: one layer pass per depth over the k best frontier nodes."""
        k, dev = self.max_k, self.last.device
        prefix = self.cache.length
        logp = F.log_softmax(self.head(self.last, 1).float(), -1)
        top_lp, top_i = logp.topk(k)
        tokens, parents, scores, depths = self.vocab_ids[top_i], torch.full((k,), -1, device=dev), top_lp, \
            torch.ones(k, dtype=torch.long, device=dev)
        g_in = self.last.expand(k, -1)  # the g each candidate would be expanded with
        frontier = torch.arange(k, device=dev)  # candidate indices to expand next
        expanded = torch.empty(0, dtype=torch.long, device=dev)  # candidates with rows in the cache
        anc = torch.eye(k, dtype=torch.bool, device=dev)  # anc[c, a]: a is c or an ancestor of c
        self.inner_passes = []
        for d in range(2, self.draft_depths + 1):  # no pass for depths the tree budget cannot keep
            t_pass = time.perf_counter()
            f = frontier.numel()
            rows = torch.cat([expanded, frontier])
            mask = attention_mask(anc[frontier][:, rows], prefix, self.fc.weight.dtype)  # prefix + ancestors
            pos = torch.full((1, f), prefix + d - 2, device=dev)
            self.cache.reserve(f)
            h = self.step(g_in[frontier][None], tokens[frontier][None], pos, mask, self.cache)[0]
            expanded = rows
            child_lp, child_i = F.log_softmax(self.head(h, d).float(), -1).topk(k, -1)  # (f, k)
            # strictly below the parent, so the final rerank keeps ancestors (ties cannot break it); the
            # margin grows with the score, since a fixed 1e-6 is lost in float32 below a score of -32
            parent_scores = scores[frontier][:, None]
            child_scores = (parent_scores + child_lp - 1e-6 * (1 + parent_scores.abs())).reshape(-1)
            c0 = tokens.numel()
            new = torch.arange(c0, c0 + f * k, device=dev)
            new_parents = frontier.repeat_interleave(k)
            tokens = torch.cat([tokens, self.vocab_ids[child_i.reshape(-1)]])
            parents = torch.cat([parents, new_parents])
            scores = torch.cat([scores, child_scores])
            depths = torch.cat([depths, torch.full((f * k,), d, dtype=torch.long, device=dev)])
            g_in = torch.cat([g_in, h.repeat_interleave(k, 0)])
            grown = torch.zeros(c0 + f * k, c0 + f * k, dtype=torch.bool, device=dev)
            grown[:c0, :c0] = anc
            grown[new] = grown[new_parents]
            grown[new, new] = True
            anc = grown
            frontier = new[child_scores.topk(min(k, f * k)).indices]
            self.inner_passes.append((time.perf_counter() - t_pass) * 1e3)  # host time (a GPU: launches)
        self.cache.truncate(prefix)  # drop the draft's own rows; `extend` adds the accepted ones
        probs = torch.exp(scores - torch.where(parents >= 0, scores[parents.clamp_min(0)], torch.zeros_like(scores)))
        return dynamic(root, tokens, parents, scores, probs.clamp(max=1.0), depths, self.tree_budget)

"""Parallel EAGLE (P-EAGLE): EAGLE-3's layer run ONCE over [accepted | bonus | mask x (k-1)].

    real row  at position t:    (g_t = fc(target features at t), token x_{t+1})     -> x_{t+2}    depth 1
    mask row  j at position p+j: (fc(mask_hidden), the mask token), j = 1 .. k-1     -> x_{p+2+j}  depth j+1

The layer is EAGLE-3's own (`fasteagle.eagle3`, layout "eagle3"), causal over every row; the mask rows
carry one learned `mask_hidden` (F*H, before `fc`, as vLLM's buffer holds it) and the embedding of
`mask_token_id`. So one forward drafts k tokens, each depth's distribution independent of the tokens
drafted before it: the cascade's product tree applies, where EAGLE-3 grows its tree one pass per depth.
vLLM 0.32 serves it as it is on the `eagle3` path with `parallel_drafting` (`llm_base_proposer.py` feeds
the same rows; `llama_eagle3.py` loads `mask_hidden`), which `fasteagle.eagle3_format.export` writes for.

Training (`DrafterBase.loss` through `depth_outputs`): the real rows run causally over the sequence as
EAGLE-3's first step does (depth 1); a block of k-1 mask rows is anchored wherever a counted token
follows, seeing the real rows up to its anchor and its own earlier rows, and mask row j learns x_{a+2+j}.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn
from transformers import DynamicCache

from fasteagle.draftconfig import DrafterConfig
from fasteagle.eagle3 import AutoregressiveDrafter
from fasteagle.kvcache import attention_mask, causal_ancestors
from fasteagle.tree import DEFAULT_TREE_SHAPE, DraftTree

ANCHOR_CHUNK = 256  # training: blocks per attention call; bounds the scores' memory on long replies


class ParallelEagleDrafter(AutoregressiveDrafter):
    """EAGLE-3 layers drafting a chain of k in one forward from k-1 learned mask rows after the bonus row."""

    KIND = "peagle"
    BLOCKS = True

    def __init__(self, cfg: DrafterConfig):
        if cfg.layout != "eagle3":
            raise ValueError("parallel EAGLE is EAGLE-3's network: layout 'eagle3'")
        super().__init__(cfg)  # the same draws as EAGLE-3's from one seed, then the mask row's
        self.mask_hidden = nn.Parameter(torch.randn(len(cfg.feature_layers) * cfg.target_hidden) * 0.02)
        self.tree_k = 32
        self.tree_shape = DEFAULT_TREE_SHAPE

    @classmethod
    def config_for(cls, base: DrafterConfig, depth: int = 7, mask_token_id: int = 0) -> DrafterConfig:
        """`base` as a parallel EAGLE drafter's: chains of up to `depth` (k-1 = depth-1 mask rows)."""
        base = super().config_for(base, depth)
        base.kind, base.mask_token_id = cls.KIND, mask_token_id
        return base

    @classmethod
    @torch.no_grad()
    def from_eagle3(cls, drafter: AutoregressiveDrafter, mask_token_id: int) -> ParallelEagleDrafter:
        """A parallel EAGLE drafter that starts from a trained EAGLE-3 one of layout "eagle3" (ours or an
        imported checkpoint): the same layer, head and vocab, so its first depth drafts as that one did; only the
        mask row (`mask_hidden`) is new, for training to go on from there."""
        if drafter.cfg.layout != "eagle3":
            raise ValueError("parallel EAGLE starts from EAGLE-3's own layout; move it there first")
        cfg = replace(drafter.cfg, kind=cls.KIND, mask_token_id=mask_token_id)
        new = cls(cfg).to(drafter.fc.weight.device)
        new.load_state_dict(drafter.state_dict(), strict=False)  # all but mask_hidden
        new.vocab_ids, new.compact_vocab = drafter.vocab_ids.clone(), drafter.compact_vocab
        new.info, new._frozen = getattr(drafter, "info", {}), drafter._frozen
        return new

    def mask_rows(self, n: int, positions: torch.Tensor, mask: torch.Tensor | None, cache) -> torch.Tensor:
        """n mask rows (1, n, W) at `positions` (1, n) through the layer, attending as `mask` allows."""
        g = self.combine(self.mask_hidden.to(self.fc.weight.dtype)).expand(1, n, -1)
        ids = torch.full((1, n), self.cfg.mask_token_id, dtype=torch.long, device=positions.device)
        return self.step(g, ids, positions, mask, cache)

    # -- training -------------------------------------------------------------------------------
    def depth_outputs(self, feats: torch.Tensor, next_ids: torch.Tensor, true_tokens: bool = False,
                      cur_ids: torch.Tensor | None = None, wanted: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Teacher-forced, as `DrafterBase.depth_outputs`: entry 0 at t is the real row t (causal over the
        sequence), entry j at t mask row j of the block anchored at t, for the positions `wanted` (B, L)
        marks (None: all; zeros elsewhere), a chunk of blocks per attention call."""
        (b, n), dev, dtype = next_ids.shape, next_ids.device, self.fc.weight.dtype
        m = self.cfg.depth - 1
        slots = torch.arange(n, device=dev)
        causal = attention_mask(causal_ancestors(n, dev), 0, dtype)
        cache = DynamicCache()
        real = self.step(self.combine(feats), next_ids, slots[None].expand(b, -1), causal, cache)  # (B, n, W)
        rows = []
        for r in range(b):
            at = wanted[r].nonzero()[:, 0] if wanted is not None else slots
            out = real.new_zeros(n, m, self.cfg.width)
            if at.numel():
                c_len = int(at.max()) + 1
                ctx = [(layer.keys[r:r + 1, :, :c_len], layer.values[r:r + 1, :, :c_len]) for layer in cache.layers]
                for chunk in at.split(ANCHOR_CHUNK):
                    out = out.index_copy(0, chunk, self._blocks(chunk, ctx))
            rows.append(out)
        return [real, *torch.stack(rows).unbind(2)]

    def _blocks(self, anchors: torch.Tensor, ctx: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The mask rows' outputs (A, k-1, W) of the blocks at `anchors`, all in one pass: a block's rows see
        the real rows up to their anchor and their own block's rows up to themselves."""
        m, dev, dtype = self.cfg.depth - 1, anchors.device, self.fc.weight.dtype
        cache = DynamicCache()
        for i, (k, v) in enumerate(ctx):
            cache.update(k, v, i)
        a = anchors.numel()
        pos = (anchors[:, None] + torch.arange(1, m + 1, device=dev)).reshape(1, -1)
        owner = torch.arange(a, device=dev).repeat_interleave(m)
        step = torch.arange(m, device=dev).repeat(a)
        sees = torch.cat([torch.arange(ctx[0][0].shape[2], device=dev)[None] <= anchors[owner][:, None],
                          (owner[:, None] == owner[None]) & (step[:, None] >= step[None])], 1)
        mask = torch.zeros(sees.shape, dtype=dtype, device=dev).masked_fill_(~sees, torch.finfo(dtype).min)
        return self.mask_rows(a * m, pos, mask[None, None], cache).view(a, m, -1)

    # -- drafter protocol -----------------------------------------------------------------------
    @torch.no_grad()
    def depth_probs(self, root: int, depths: int | None = None) -> torch.Tensor:
        """(depths, V_draft): the bonus row's distribution (the last `extend` left it) and the next depths-1
        mask rows', in one pass of the layer over the mask rows after the cache's positions."""
        p, m = self.cache.length, (depths or self.cfg.depth) - 1
        h = self.last[None]
        if m > 0:
            self.cache.reserve(m)
            pos = torch.arange(p, p + m, device=self.device)[None]
            rows = self.mask_rows(m, pos, attention_mask(causal_ancestors(m, self.device), p, self.fc.weight.dtype),
                                  self.cache)
            self.cache.truncate(p)
            h = torch.cat([h, rows[0]])
        return self.head(h, 1).float().softmax(-1)

    @torch.no_grad()
    def draft(self, root: int) -> DraftTree:
        """The product tree over each depth's candidates (the cascade's builder), from as many mask rows as
        the tree can use (a chain of k: vLLM's k)."""
        return self.one_pass_tree(root, self.depth_probs(root, self.draft_depths))

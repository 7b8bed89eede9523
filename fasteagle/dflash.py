"""DFlash, a block-diffusion drafter: one forward drafts a whole block (vLLM's `method: "dflash"`).

    context  c_j = hidden_norm(fc(target low|mid|high hidden states at j))            j < p
    block    [x_p, m, m, ..., m] at positions p .. p+K     (x_p: the bonus token; m: a learned mask embedding)
    layer l  queries from the block only; keys and values over [kv_l(c_0 .. c_{p-1}) | kv_l(block)], the block
             attending both ways within itself. "KV injection": every layer reads the target's features
             through its own k/v projections (k-norm and rotary at the context's positions).
    out      norm(h) at block row i -> the target's LM head -> x_{p+i}                 i = 1 .. K

Where the cascade's layer i sees the target only through layers 1..i-1, each DFlash layer reads the
target's features of the whole context. Like the cascade, one forward yields every depth's distribution,
and each depth's is independent of the tokens drafted before it, so the cascade's product tree applies.

Training (`DrafterBase.loss`, through `depth_outputs`): a block is anchored wherever a counted token follows
([x_a, m, ...] at a .. a+K, its context the features before a); the blocks of a row run together, each
attending to its context and to itself, and mask row i learns the teacher's distribution for x_{a+i},
weighed loss_decay**(i-1) as the cascade's depth i.

The network is vLLM 0.32's (`model_executor/models/qwen3_dflash.py`: Qwen3 layers with q/k norms, `fc`,
`hidden_norm`, `norm`, the target's embedding and head shared), so `fasteagle.eagle3_format.export_dflash`
writes a folder stock vLLM serves as it is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

from fasteagle.draftbase import DrafterBase, reuse_cache, rope
from fasteagle.draftconfig import DrafterConfig
from fasteagle.tree import DEFAULT_TREE_SHAPE, DraftTree

ARCHITECTURE = "DFlashDraftModel"  # the name vLLM's registry maps to its Qwen3 DFlash drafter
ANCHOR_CHUNK = 256  # training: anchors (blocks) per attention call; bounds the scores' memory on long replies


class DFlashDrafter(DrafterBase):
    """A block of K masks after the bonus token, drafted in one forward over the target's context features."""

    KIND = "dflash"
    BLOCKS = True

    def __init__(self, cfg: DrafterConfig):
        if cfg.width != cfg.target_hidden:
            raise ValueError("a DFlash drafter is as wide as its target (vLLM shares the target's embedding with it)")
        super().__init__(cfg)
        self.fc = nn.Linear(len(cfg.feature_layers) * cfg.target_hidden, cfg.width, bias=False)
        self.hidden_norm = LlamaRMSNorm(cfg.width, eps=cfg.rms_norm_eps)
        qc = self.qwen3_config(cfg)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(qc, i) for i in range(cfg.num_layers))
        # One k-norm for every layer: vLLM 0.32's CPU kernel normalizes all layers' context keys with layer 0's
        # (its grouped `rms_norm` reads one weight row; tests/test_vllm.py checks it), so only a shared one makes
        # the drafter the same network there, on a GPU and here. It is saved once per layer, as vLLM loads it.
        for layer in self.layers[1:]:
            layer.self_attn.k_norm = self.layers[0].self_attn.k_norm
        self.norms = nn.ModuleList([LlamaRMSNorm(cfg.width, eps=cfg.rms_norm_eps)])  # vLLM's `norm`
        self.proj = None
        self.rotary = LlamaRotaryEmbedding(cfg.layer_config())
        self.mask_embedding = nn.Parameter(torch.zeros(cfg.width))  # what every mask row reads
        self.apply(self._init)
        nn.init.normal_(self.mask_embedding, std=0.02)
        self.tree_k = 32
        self.tree_shape = DEFAULT_TREE_SHAPE
        self.cache = None

    @staticmethod
    def qwen3_config(cfg: DrafterConfig) -> Qwen3Config:
        """The layers' config (what vLLM reads from the exported config.json too)."""
        qc = Qwen3Config(
            hidden_size=cfg.width, intermediate_size=cfg.intermediate, num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, num_hidden_layers=cfg.num_layers,
            rms_norm_eps=cfg.rms_norm_eps, max_position_embeddings=cfg.max_positions, vocab_size=cfg.vocab_size,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta} | cfg.rope,
            attention_bias=False, layer_types=["full_attention"] * cfg.num_layers, hidden_act="silu")
        qc._attn_implementation = "sdpa"
        return qc

    @classmethod
    def config_for(cls, base: DrafterConfig, depth: int = 6, mask_token_id: int = 0) -> DrafterConfig:
        """`base` as a DFlash drafter's: blocks of `depth` masks (vLLM's num_speculative_tokens)."""
        base.kind, base.depth, base.mask_token_id = cls.KIND, depth, mask_token_id
        return base

    @property
    def num_depths(self) -> int:
        return self.cfg.depth

    def head(self, h: torch.Tensor, depth: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        return super().head(h, 1, rows)  # one final norm for every block row

    # -- network --------------------------------------------------------------------------------
    def context_kv(self, feats: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's keys and values (B, kv heads, T, D) of context rows: the target's features (B, T, F*H)
        at `positions` (B, T), through `fc`, `hidden_norm` and the layer's own k/v projections and k-norm."""
        c = self.hidden_norm(self.fc(feats))
        cos, sin = self.rotary(c, positions)
        shape = (*c.shape[:2], -1, self.cfg.head_dim)
        out = []
        for layer in self.layers:
            a = layer.self_attn
            k = a.k_norm(a.k_proj(c).view(shape)).transpose(1, 2)
            out.append((rope(k, cos, sin), a.v_proj(c).view(shape).transpose(1, 2)))
        return out

    def block(self, x: torch.Tensor, positions: torch.Tensor, ctx: list[tuple[torch.Tensor, torch.Tensor]],
              mask: torch.Tensor | None) -> torch.Tensor:
        """Block rows x (B, Q, W) at `positions` (B, Q) through every layer, each attending to its context keys
        and values `ctx` (B, kv heads, C, D) and to the block's rows, as the boolean `mask` (.., Q, C+Q) allows
        (None: everything, as in drafting); the final norm is the head's."""
        cos, sin = self.rotary(x, positions)
        b, q = x.shape[:2]
        shape = (b, q, -1, self.cfg.head_dim)
        for layer, (ck, cv) in zip(self.layers, ctx):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            qs = rope(a.q_norm(a.q_proj(h).view(shape)).transpose(1, 2), cos, sin)
            ks = rope(a.k_norm(a.k_proj(h).view(shape)).transpose(1, 2), cos, sin)
            vs = a.v_proj(h).view(shape).transpose(1, 2)
            o = F.scaled_dot_product_attention(qs, torch.cat([ck, ks], 2), torch.cat([cv, vs], 2), attn_mask=mask,
                                               enable_gqa=True)
            x = x + a.o_proj(o.transpose(1, 2).reshape(b, q, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x

    def block_inputs(self, bonus: torch.Tensor, masks: int) -> torch.Tensor:
        """(A, 1+masks, W): each bonus token's embedding followed by `masks` mask rows."""
        e = self.embed(bonus).to(self.mask_embedding.dtype)
        return torch.cat([e[:, None], self.mask_embedding.expand(bonus.numel(), masks, -1)], 1)

    # -- training -------------------------------------------------------------------------------
    def depth_outputs(self, feats: torch.Tensor, next_ids: torch.Tensor, true_tokens: bool = False,
                      cur_ids: torch.Tensor | None = None, wanted: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Teacher-forced, as `DrafterBase.depth_outputs`: entry i-1 at position t (B, L, W) is mask row i of the
        block whose bonus is next_ids[t] (token t+1, at position t+1) over the features 0..t, so it predicts
        token t+1+i. Blocks run only at the positions `wanted` (B, L) marks (None: all; zeros elsewhere), a
        chunk of them per attention call, each block seeing its context and its own rows."""
        K, (B, L) = self.cfg.depth, next_ids.shape
        rows = []
        for b in range(B):
            at = wanted[b].nonzero()[:, 0] if wanted is not None else torch.arange(L, device=next_ids.device)
            out = feats.new_zeros(L, K, self.cfg.width, dtype=self.fc.weight.dtype)
            if at.numel():
                c_len = int(at.max()) + 1
                ctx = self.context_kv(feats[b:b + 1, :c_len], torch.arange(c_len, device=feats.device)[None])
                for chunk in at.split(ANCHOR_CHUNK):
                    out = out.index_copy(0, chunk, self._blocks(next_ids[b, chunk], chunk + 1, ctx))
            rows.append(out)
        return list(torch.stack(rows).unbind(2))

    def _blocks(self, bonus: torch.Tensor, anchors: torch.Tensor, ctx) -> torch.Tensor:
        """The mask rows' outputs (A, K, W) of the blocks [bonus, mask x K] at `anchors`, all in one attention
        call: a block's rows see the context before its anchor and every row of their own block."""
        K, dev = self.cfg.depth, anchors.device
        x = self.block_inputs(bonus, K).reshape(1, -1, self.cfg.width)
        pos = (anchors[:, None] + torch.arange(K + 1, device=dev)).reshape(1, -1)
        owner = torch.arange(anchors.numel(), device=dev).repeat_interleave(K + 1)
        sees_ctx = torch.arange(ctx[0][0].shape[2], device=dev)[None] < anchors[owner][:, None]
        mask = torch.cat([sees_ctx, owner[:, None] == owner[None]], 1)[None, None]
        return self.block(x, pos, ctx, mask).view(anchors.numel(), K + 1, -1)[:, 1:]

    # -- drafter protocol -----------------------------------------------------------------------
    def reset(self, capacity: int = 4096) -> None:
        self.cache = reuse_cache(self.cache, len(self.layers), capacity, self.dtype, self.device)

    def rewind(self, length: int) -> None:
        """Forget every position from `length` on."""
        self.cache.truncate(length)

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, features: torch.Tensor | None, next_token: int) -> None:
        """Newly accepted positions: their features' keys and values join every layer's cache."""
        past, n = self.cache.length, tokens.numel()
        self.cache.reserve(n)
        pos = torch.arange(past, past + n, device=tokens.device)[None]
        for i, (k, v) in enumerate(self.context_kv(features[None].to(self.dtype), pos)):
            self.cache.update(k, v, i)

    @torch.no_grad()
    def depth_probs(self, root: int, masks: int | None = None) -> torch.Tensor:
        """(masks, V_draft): each mask row's distribution in the block [root, mask x masks] (default: the
        block trained on) at the positions after the cache's. vLLM runs num_speculative_tokens masks; rows
        attend both ways, so a shorter block than trained on changes every row a little, in both engines."""
        p, K = self.cache.length, masks or self.cfg.depth
        x = self.block_inputs(torch.tensor([root], device=self.device), K)
        ctx = [(layer.keys[:, :, :p], layer.values[:, :, :p]) for layer in self.cache.layers]
        h = self.block(x, torch.arange(p, p + K + 1, device=self.device)[None], ctx, None)[0, 1:]
        return self.head(h, 1).float().softmax(-1)

    @torch.no_grad()
    def draft(self, root: int) -> DraftTree:
        """The product tree over the block's per-depth candidates (the cascade's builder), from a block of as
        many masks as the tree can use (a chain of k: vLLM's k)."""
        return self.one_pass_tree(root, self.depth_probs(root, self.draft_depths))

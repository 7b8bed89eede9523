"""FastEagle's cascade as a vLLM draft model, run by vLLM's EAGLE-3 path in parallel-drafting mode.

With `parallel_drafting` on, vLLM (0.32) drafts k tokens in ONE drafter forward: per request it
feeds [accepted rows | bonus row | k-1 mask rows] (`v1/spec_decode/llm_base_proposer.py`) and
samples the last k rows. A cascade needs only the bonus row: its N layers run in series over
every row, and the j-th mask row after a bonus row answers with layer j+1's output AT that bonus
row. So one forward yields depths 1..k, as in our own engine's chain. Only the first k layers are built
(k = num_speculative_tokens, at most N): the deeper ones answer depths vLLM never asks for, so they cost
neither a forward nor KV cache (`kv_bytes_per_token` in `fasteagle.bench.batches` counts the same).

    row r:  (hidden g_r, token x_{r+1})  ->  h_1 = L1(fc(g_r) + embed_fc(embed(x_{r+1})))  h_i = L_i(h_{i-1})
    out[r] = norm_d(h_d[anchor(r)])      d = 1 for a real row, j+1 for the j-th mask row after anchor(r)

Mask rows are the ones vLLM fills with the mask token and `combine_hidden_states(mask_hidden)`,
which is exactly zero here (mask_hidden is zeros and `fc` has no bias): a real row never is.

A token-conditioned cascade (`token_conditioned` in its config) adds, before layer i+1, `tok_fc.i` of the
target's embedding of depth i's top-1 draft at that row: depth i's norm, the draft head's argmax, d2t
to the target's id, as our engine's `CascadedDrafter.hidden` does. It is still one forward.

With EAGLE 3.1's norms (`fc_norm`, `norm_output` in its config) `combine_hidden_states` normalizes each
target feature before `fc` (mask_hidden's zeros stay zero), and layer i+1 reads depth i's normed output.

With `kv_inject` in its config every layer's keys and values come from each row's fused input (its own input
norm and k/v projections of fc(g) + embed_fc(embed(x))), its queries from the layer before, as in our engine.

vLLM imports this module only through `fasteagle.vllm_plugin`; `python -m fasteagle export` writes
the checkpoint it loads (`fasteagle.eagle3_format.export`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.llama import LlamaDecoderLayer
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM
from vllm.model_executor.models.utils import (
    AutoWeightsLoader,
    WeightsMapper,
    get_draft_quant_config,
    maybe_prefix,
    process_eagle_weight,
)


class CascadeLayer(LlamaDecoderLayer):
    """A stock vLLM Llama layer that takes the drafter's quantization, not the target's."""

    def get_quant_config(self, vllm_config: VllmConfig):
        return get_draft_quant_config(vllm_config)

    def injected(self, positions: torch.Tensor, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """The layer's output (T, W) with queries from x and keys and values from kv, both (T, W) (`kv_inject`).
        Both go through the norm and the fused projection in one call, which reads the weights once."""
        a, t = self.self_attn, x.shape[0]
        qkv = a.qkv_proj(self.input_layernorm(torch.cat([x, kv])))[0]
        q = qkv[:t, :a.q_size]
        _, k, v = qkv[t:].split([a.q_size, a.kv_size, a.kv_size], dim=-1)
        q, k = a.rotary_emb(positions, q, k)
        x = x + a.o_proj(a.attn(q, k, v))[0]
        return x + self.mlp(self.post_attention_layernorm(x))


class CascadeModel(nn.Module):
    """fc + embed_fc, N layers in series, one final norm per depth (and `proj` when narrower than the target)."""

    stacked = WeightsMapper(orig_to_new_stacked={
        ".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
        ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)})

    def __init__(self, vllm_config: VllmConfig, prefix: str, start_layer_id: int):
        super().__init__()
        cfg = vllm_config.speculative_config.draft_model_config.hf_config
        quant = get_draft_quant_config(vllm_config)
        width, target = cfg.hidden_size, cfg.target_hidden_size
        self.depths = built_depths(vllm_config)
        n_aux = len((getattr(cfg, "eagle_config", None) or {})["eagle_aux_hidden_state_layer_ids"])
        self.fc_input_size = n_aux * target
        self.mask_token_id = cfg.mask_token_id
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, target, prefix=maybe_prefix(prefix, "embed_tokens"))
        self.fc = ReplicatedLinear(self.fc_input_size, width, bias=False, quant_config=quant,
                                   prefix=maybe_prefix(prefix, "fc"), return_bias=False)
        self.embed_fc = ReplicatedLinear(target, width, bias=False, quant_config=quant,
                                         prefix=maybe_prefix(prefix, "embed_fc"), return_bias=False)
        self.layers = nn.ModuleList(
            CascadeLayer(vllm_config, prefix=maybe_prefix(prefix, f"layers.{i + start_layer_id}"), config=cfg)
            for i in range(self.depths))
        self.norms = nn.ModuleList(RMSNorm(width, eps=cfg.rms_norm_eps) for _ in range(self.depths))
        self.proj = None if width == target else ReplicatedLinear(
            width, target, bias=False, quant_config=quant, prefix=maybe_prefix(prefix, "proj"), return_bias=False)
        self.eps = cfg.rms_norm_eps
        self.tok_fc = nn.ModuleList(
            ReplicatedLinear(target, width, bias=False, quant_config=quant, prefix=maybe_prefix(prefix, f"tok_fc.{i}"),
                             return_bias=False)
            for i in range(self.depths - 1)) if getattr(cfg, "token_conditioned", False) else None
        self.top_token = None  # token-conditioned: hidden (T, W) at depth i -> target ids (T,), set by the model
        # EAGLE 3.1's norms: an RMSNorm per target feature before fc; each layer passing its normed output on
        self.fc_norm = nn.ModuleList(RMSNorm(target, eps=cfg.rms_norm_eps) for _ in range(n_aux)) if getattr(
            cfg, "fc_norm", False) else None
        self.norm_output = getattr(cfg, "norm_output", False)
        self.kv_inject = getattr(cfg, "kv_inject", False)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        x, residual, outs = hidden_states + self.embed_fc(inputs_embeds), None, []  # = our fc(cat(g, embed))
        kv = x if self.kv_inject else None
        for i, layer in enumerate(self.layers):
            if kv is not None:
                x = layer.injected(positions, x, kv)
                outs.append(x)
            else:
                x, residual = layer(positions, x, residual)
                outs.append(x + residual)  # the layer's output (vLLM keeps the residual add for the next norm)
            if self.norm_output and i + 1 < len(self.layers):
                x, residual = self.norms[i](outs[-1]), None
            if self.tok_fc is not None and i + 1 < len(self.layers):  # + T_i(embed(top-1 of depth i))
                x = x + self.tok_fc[i](self.embed_tokens(self.top_token(outs[-1], i)))
        stack = torch.stack(outs)  # (N, T, W)
        idx = torch.arange(stack.shape[1], device=stack.device)
        is_mask = (hidden_states == 0).all(-1)
        if input_ids is not None:
            is_mask &= input_ids == self.mask_token_id
        anchor = torch.cummax(torch.where(is_mask, 0, idx), 0).values  # the last real row at or before each row
        depth = (idx - anchor).clamp(max=stack.shape[0] - 1)  # 0-based: 0 on real rows, j on the j-th mask row
        z = self.depth_head_input(stack[depth, anchor], torch.stack([n.weight for n in self.norms])[depth])
        return z, z

    def depth_head_input(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """What the draft head reads of outputs h (T, W): each row's depth norm (weight (T, W) or (W,)), then proj."""
        z = (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + self.eps) * weight.float()).to(h.dtype)
        return z if self.proj is None else self.proj(z)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.stacked)


def built_depths(vllm_config: VllmConfig) -> int:
    """How many of the cascade's N layers vLLM can use: one per drafted token, at most N."""
    spec = vllm_config.speculative_config
    n = spec.draft_model_config.hf_config.num_hidden_layers
    return min(n, spec.num_speculative_tokens or n)


def unbuilt(name: str, depths: int) -> bool:
    """Whether checkpoint tensor `name` belongs to a layer, norm or tok_fc past the first `depths` built."""
    m = re.match(r"(layers|norms|tok_fc)\.(\d+)\.", name)
    return m is not None and int(m[2]) >= depths - (m[1] == "tok_fc")


class FastEagleCascadeForCausalLMEagle3(Eagle3LlamaForCausalLM):
    """What vLLM's EAGLE-3 proposer expects (its class, `combine_hidden_states`, `compute_logits` over the
    draft vocab with d2t, `mask_hidden`), around the cascade."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        nn.Module.__init__(self)
        spec = vllm_config.speculative_config
        self.config = spec.draft_model_config.hf_config
        if not spec.parallel_drafting:
            raise ValueError("FastEagle's cascade drafts every depth in one forward: run it with "
                             "speculative_config parallel_drafting=True")
        self.model = CascadeModel(vllm_config, maybe_prefix(prefix, "model"),
                                  vllm_config.model_config.get_total_num_hidden_layers())
        draft_vocab = self.config.draft_vocab_size
        self.lm_head = ParallelLMHead(draft_vocab, self.config.target_hidden_size,
                                      quant_config=get_draft_quant_config(vllm_config),
                                      prefix=maybe_prefix(prefix, "lm_head"))
        self.logits_processor = LogitsProcessor(draft_vocab, scale=1.0)
        self.draft_id_to_target_id = None if draft_vocab == vllm_config.model_config.get_vocab_size() else \
            nn.Parameter(torch.zeros(draft_vocab, dtype=torch.long), requires_grad=False)
        self.use_parallel_drafting = True
        self.model.top_token = self.top_token
        self.register_buffer("mask_hidden", torch.zeros(1, self.model.fc_input_size), persistent=False)

    def top_token(self, h: torch.Tensor, i: int) -> torch.Tensor:
        """The target's id of depth i+1's top-1 draft from layer i's output h (T, W) (0-based i)."""
        z = self.model.depth_head_input(h, self.model.norms[i].weight)
        ids = torch.nn.functional.linear(z, self.lm_head.weight[:self.config.draft_vocab_size]).argmax(-1)  # no padding
        return ids if self.draft_id_to_target_id is None else ids + self.draft_id_to_target_id[ids]

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        norms = self.model.fc_norm
        if norms is not None:  # mask_hidden (zeros) stays zero: a mask row is still known by it
            hidden_states = torch.cat([n(c) for n, c in zip(norms, hidden_states.chunk(len(norms), -1))], -1)
        return self.model.fc(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        named = {}
        for name, w in weights:
            if name == "t2d" or unbuilt(name, self.model.depths):
                continue
            if name == "mask_hidden":
                self.mask_hidden.copy_(w.view(1, -1))
                continue
            if name == "d2t" and self.draft_id_to_target_id is None:
                continue  # a whole-vocabulary head: d2t is all zeros
            name = "draft_id_to_target_id" if name == "d2t" else name if name.startswith("lm_head") else "model." + name
            process_eagle_weight(self, name)  # an embedding of its own, or the target's shared
            named[name] = w
        # like vLLM's EAGLE-3 loader, no "every weight loaded" set: the shared embedding comes after loading
        AutoWeightsLoader(self).load_weights(named.items())

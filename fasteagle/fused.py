"""A lean inference forward for the drafters' stock `LlamaDecoderLayer`s.

Why: a drafter step multiplies each weight by a handful of rows (the 1-8 newly accepted positions,
or an EAGLE-style frontier), so the time goes to the number of operations, not to arithmetic. The
stock layer runs seven separate products and a dozen bookkeeping ops per call; this forward reads
the same weights with the query/key/value and the gate/up products merged into one each (four
products per layer) and nothing else around them. On this project's 2-core CPU it cut the
cascade's five-layer two-token `extend` from about 7.4 ms to 6.2 ms.

Training keeps the stock layer (autograd, checkpoints and `state_dict` see no change); the merged
weights are copies made at first use and made again when the stock weights change.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, apply_rotary_pos_emb

from fasteagle.packing import WeightCopy


class FusedLayer:
    """Merged products of one stock decoder layer, for inference under `torch.no_grad`."""

    def __init__(self, layer: LlamaDecoderLayer):
        self.layer = layer
        self._version: tuple | None = None
        self.qkv: nn.Module | None = None
        self.gate_up: nn.Module | None = None

    def _sources(self) -> tuple[nn.Module, ...]:
        a, m = self.layer.self_attn, self.layer.mlp
        return a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj

    def _refresh(self) -> None:
        """(Re)build the merged weights when a source changed since: its weight (training, `.to`,
        loading) or its kind (`pack_linears` swapped it for a prepacked or int8 one)."""
        srcs = self._sources()
        version = tuple((type(s), id(s.weight), s.weight.dtype, s.weight.device,
                         0 if s.weight.is_inference() else s.weight._version) for s in srcs)
        if version == self._version:
            return
        with torch.no_grad():
            self.qkv, self.gate_up = _merge(srcs[:3]), _merge(srcs[3:])
        for s in srcs:  # their own inference copies are not used by this forward: free them
            if isinstance(s, WeightCopy):
                s.release()
        self._version = version

    def __call__(self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                 mask: torch.Tensor | None, cache=None) -> torch.Tensor:
        """The stock layer's output for x (B, T, W), attending to `cache`'s rows and x's own under
        the additive 4D `mask` (None: causal within x), writing x's keys/values into `cache`."""
        self._refresh()
        layer = self.layer
        attn, mlp = layer.self_attn, layer.mlp
        b, t, _ = x.shape
        d = attn.head_dim
        h = _rms_norm(layer.input_layernorm, x)
        q, k, v = self.qkv(h).split([attn.q_proj.out_features, attn.k_proj.out_features,
                                     attn.v_proj.out_features], -1)
        q = q.view(b, t, -1, d).transpose(1, 2)
        k = k.view(b, t, -1, d).transpose(1, 2)
        v = v.view(b, t, -1, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        if cache is not None:
            k, v = cache.update(k, v, attn.layer_idx)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and t > 1,
                                           scale=attn.scaling, enable_gqa=q.shape[1] != k.shape[1])
        x = x + attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up(_rms_norm(layer.post_attention_layernorm, x)).chunk(2, -1)
        return x + mlp.down_proj(mlp.act_fn(gate) * up)


def _merge(linears: tuple[nn.Module, ...]) -> nn.Module:
    """One linear layer whose output is the concatenation of `linears`' outputs (of their kind:
    prepacked or int8 if they are)."""
    weight = torch.cat([m.weight.detach() for m in linears])
    biases = [m.bias for m in linears]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else weight.new_zeros(m.out_features) for m, b in zip(linears, biases)])
    if isinstance(linears[0], WeightCopy):
        return type(linears[0])(weight, bias)
    merged = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    merged.weight, merged.bias = nn.Parameter(weight, requires_grad=False), \
        None if bias is None else nn.Parameter(bias, requires_grad=False)
    return merged


def _rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`LlamaRMSNorm` in one op, computed in fp32 as the stock module does."""
    return F.rms_norm(x.float(), (x.shape[-1],), norm.weight.float(), norm.variance_epsilon).to(x.dtype)

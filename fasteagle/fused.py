"""A lean inference forward for the drafters' stock `LlamaDecoderLayer`s.

Why: a drafter step multiplies each weight by a handful of rows (the 1-8 newly accepted positions,
or an EAGLE-style frontier), so the time goes to the number of operations, not to arithmetic. The
stock layer runs seven separate products and a dozen bookkeeping ops per call; this forward reads
the same weights with the query/key/value and the gate/up products merged into one each (four
products per layer) and nothing else around them (docs/design.md, "A lean draft step").

Training keeps the stock layer (autograd, checkpoints and `state_dict` see no change); the merged
weights are copies made at first use and made again when the stock weights change.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, rotate_half

from fasteagle.packing import WeightCopy, weight_stamp


class FusedLayer:
    """Merged products of one stock decoder layer, for inference under `torch.no_grad`."""

    def __init__(self, layer: LlamaDecoderLayer):
        self.layer = layer
        self._stamp: tuple | None = None  # (sources, their weights, (dtype, device, version) of each)
        self.qkv: nn.Module | None = None
        self.gate_up: nn.Module | None = None

    def _sources(self) -> tuple[nn.Module, ...]:
        a, m = self.layer.self_attn._modules, self.layer.mlp._modules
        return a["q_proj"], a["k_proj"], a["v_proj"], m["gate_proj"], m["up_proj"]

    def refresh(self) -> None:
        """(Re)build the merged weights when a source changed since: its weight (training, `.to`,
        loading) or its kind (`pack_linears` swapped it for a prepacked or int8 one). Checked on
        every call, so it reads plain attributes only (a few microseconds, not tens)."""
        srcs = self._sources()
        weights = tuple(m.weight for m in srcs)
        stamp = [weight_stamp(w) for w in weights]
        held = self._stamp
        if held and stamp == held[2] and all(a is b for a, b in zip(held[0] + held[1], srcs + weights)):
            return  # the same objects (compared as objects: an id can be reused), unchanged
        with torch.no_grad():
            self.qkv, self.gate_up = _merge(srcs[:3]), _merge(srcs[3:])
        for s in srcs:  # their own inference copies are not used by this forward: free them
            if isinstance(s, WeightCopy):
                s.release()
        self._stamp = (srcs, weights, stamp, [w.untyped_storage() for w in weights])  # storages: see `weight_stamp`

    def __call__(self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                 mask: torch.Tensor | None, cache=None, attn_in: torch.Tensor | None = None) -> torch.Tensor:
        """The stock layer's output for x (B, T, W), attending to `cache`'s rows and x's own under
        the additive 4D `mask` (None: causal within x), writing x's keys/values into `cache`. With
        `attn_in` (B, T, W') the query/key/value products read it in place of the input norm of x
        (EAGLE-3's first layer: x is then the residual only)."""
        self.refresh()
        layer = self.layer
        attn, mlp = layer.self_attn, layer.mlp
        b, t, _ = x.shape
        d = attn.head_dim
        y = _linear(self.qkv, _rms_norm(layer.input_layernorm, x) if attn_in is None else attn_in)
        # queries and keys sit side by side in the merged product: rotate them in one go
        n_q, n_k = attn.q_proj.out_features, attn.k_proj.out_features
        qk = _rotate(y[..., :n_q + n_k].view(b, t, -1, d).transpose(1, 2), *position_embeddings)
        q, k = qk.split([n_q // d, n_k // d], 1)
        v = y[..., n_q + n_k:].view(b, t, -1, d).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, attn.layer_idx)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and t > 1,
                                           scale=attn.scaling, enable_gqa=q.shape[1] != k.shape[1])
        x = x + _linear(attn.o_proj, o.transpose(1, 2).reshape(b, t, -1))
        gate, up = _linear(self.gate_up, _rms_norm(layer.post_attention_layernorm, x)).chunk(2, -1)
        return x + _linear(mlp.down_proj, mlp.act_fn(gate) * up)


def _linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` without `nn.Module.__call__`'s hook bookkeeping (a drafter step makes ~20 of these)."""
    return module.forward(x)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of x (B, H, T, D), as `apply_rotary_pos_emb` applies it to q or k."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


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

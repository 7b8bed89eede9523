"""Prepacked linear layers for fp32 CPU inference.

Why: speculative decoding multiplies every weight by a few rows at a time (a tree of 2-64 nodes,
a drafter step of 1-8 positions). On x86 CPUs the default fp32 GEMM is poor at that shape: on this
project's 2-core machine one 16-row product with the LM head took 2.4x as long as the same product
with the weight reordered once into oneDNN's blocked layout (`python -m fasteagle bench --verify-cost`
shows the whole-model effect). Reordering is what PyTorch's own compiler does when it freezes a CPU
model; here it is done once at load time, without compiling anything.

`PackedLinear` keeps the original `weight` Parameter (tied weights, `state_dict`, and code that reads
`lm_head.weight` see no change) and falls back to the plain product whenever the packed one does not
apply: another device or dtype, autograd, or a weight changed in place since it was packed.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def available() -> bool:
    """Whether this PyTorch build has oneDNN's linear ops."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def wanted(device: torch.device, dtype: torch.dtype) -> bool:
    """Pack by default for fp32 on the CPU; FASTEAGLE_PACK=0 turns it off (to compare, or to save memory)."""
    return device.type == "cpu" and dtype == torch.float32 and os.environ.get("FASTEAGLE_PACK", "1") != "0" \
        and available()


class PackedLinear(nn.Module):
    """`y = x W^T + b` with W also held in oneDNN's blocked layout (one extra copy of W in memory)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight  # the caller's Parameter/tensor itself, not a copy
        self.bias = bias
        self._packed: torch.Tensor | None = None
        self._version = -1

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear:
        return cls(linear.weight, linear.bias)

    def _usable(self, x: torch.Tensor) -> bool:
        w = self.weight
        if not available() or {x.device.type, w.device.type} != {"cpu"} or {x.dtype, w.dtype} != {torch.float32}:
            return False
        return not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))

    def packed_weight(self) -> torch.Tensor:
        """The blocked copy of `weight`, made again if the weight changed in place since."""
        version = 0 if self.weight.is_inference() else self.weight._version  # inference tensors never change
        if self._packed is None or self._version != version:
            with torch.no_grad():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
            self._version = version
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._usable(x):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, self.in_features)  # the op wants rows; 1-D and 3-D inputs are reshaped
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed_weight(), self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linears(module: nn.Module) -> int:
    """Swap every `nn.Linear` under `module` for a `PackedLinear` (in place); returns how many.

    Only fp32 CPU modules are packed, and only after a numerical check on the first layer: a build
    whose packed product disagrees with the plain one (or lacks the ops) is left untouched (0).
    """
    targets = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear]
    if not targets or not available():
        return 0
    first = targets[0][2]
    if first.weight.device.type != "cpu" or first.weight.dtype != torch.float32:
        return 0
    x = torch.randn(3, first.in_features, dtype=first.weight.dtype, device=first.weight.device)
    try:
        with torch.no_grad():
            same = torch.allclose(PackedLinear.from_linear(first)(x), first(x), rtol=1e-4, atol=1e-4)
    except (RuntimeError, NotImplementedError):
        return 0
    if not same:
        return 0
    for parent, name, child in targets:
        layer = PackedLinear.from_linear(child)
        layer.packed_weight()  # now, at load time, not in the first timed forward
        setattr(parent, name, layer)
    return len(targets)

"""Linear layers with a copy of their weight laid out for small-batch CPU inference.

Why: speculative decoding multiplies every weight by a few rows at a time (a tree of 2-64 nodes,
a drafter step of 1-8 positions). On x86 CPUs the default fp32 GEMM is poor at that shape, and the
same product with the weight reordered once into oneDNN's blocked layout is much faster
(`python -m fasteagle bench --verify-cost --compare-packing` measures the whole-model effect; see
docs/design.md, "Prepacked linear layers"). Reordering is what PyTorch's own compiler does when it freezes a CPU
model; here it is done once at load time, without compiling anything.

Two kinds of copy:
- `PackedLinear`: the fp32 weight in oneDNN's blocked layout. Same numbers; used for the target
  (whose outputs must stay exact) and for drafters.
- `Int8Linear`: the weight as int8 with one scale per output row, multiplied with bf16 activations.
  Not the same numbers, so only drafters get it: a draft is a proposal the fp32 target checks, so
  an approximate drafter can cost acceptance but never correctness. It reads a quarter of the
  bytes, which makes a drafter's step cheaper at the same acceptance (docs/design.md, "Int8 drafter
  weights"). Memory: each drafter weight then lives as fp32, prepacked fp32 and int8 (about 2.25x
  its fp32 size).

Both keep the original `weight` Parameter (tied weights, `state_dict`, and code that reads
`lm_head.weight` see no change) and fall back to the plain product whenever the copy does not
apply: another device or dtype, autograd, or a weight changed in place since the copy was made.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F
from torch import nn

from fasteagle.env import env


@functools.cache
def available() -> bool:
    """Whether this PyTorch build has oneDNN's linear ops."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@functools.cache
def int8_available() -> bool:
    """Whether this PyTorch build and CPU have a vectorised int8-weight product (without AVX2 the
    kernel is scalar and slower than fp32)."""
    if not hasattr(torch, "_weight_int8pack_mm") or torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        return False
    try:
        with torch.no_grad():
            w = torch.randn(48, 64, generator=torch.Generator().manual_seed(0))
            x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
            return _relative_error(Int8Linear(w)(x), x @ w.T) < 0.05
    except (RuntimeError, NotImplementedError):
        return False


def wanted(device: torch.device, dtype: torch.dtype) -> bool:
    """Pack by default for fp32 on the CPU; FASTEAGLE_PACK=0 turns it off (to compare, or to save memory)."""
    return device.type == "cpu" and dtype == torch.float32 and env().pack \
        and available()


def int8_wanted() -> bool:
    """Int8 drafter weights by default wherever drafters are packed; FASTEAGLE_DRAFT_INT8=0 keeps fp32."""
    return env().draft_int8 and int8_available()


def weight_stamp(w: torch.Tensor) -> tuple:
    """What a copy made from `w` depends on: its address, dtype and device (`.to()` or `.float()` swap a
    parameter's data, version untouched) and its in-place version (inference tensors never change). A
    holder of the stamp holds `w.untyped_storage()` too, so no swapped-in copy can reuse the address unnoticed."""
    return w.data_ptr(), w.dtype, w.device, 0 if w.is_inference() else w._version


class WeightCopy(nn.Module):
    """`y = x W^T + b` through a copy of W made for inference (`_make`, `_product`), remade when W
    changes in place, and the plain product wherever the copy does not apply (`_usable`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape[-2:]  # an ExpertsCopy's weight is 3D
        self.weight = weight  # the caller's Parameter/tensor itself, not a copy
        self.bias = bias
        self._copy = None
        self._version = -1
        self._storage = None

    @classmethod
    def from_linear(cls, linear: nn.Module) -> WeightCopy:
        return cls(linear.weight, linear.bias)

    def _usable(self, x: torch.Tensor) -> bool:
        w = self.weight
        if not (x.device.type == w.device.type == "cpu" and x.dtype == w.dtype == torch.float32):
            return False
        return not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))

    def prepared(self):
        """The inference copy of `weight`, made again if the weight changed in place since."""
        w = self.weight
        version = weight_stamp(w)
        if self._copy is None or self._version != version:
            with torch.no_grad():
                self._copy = self._make(w.detach())
            self._version, self._storage = version, w.untyped_storage()
        return self._copy

    def release(self) -> None:
        """Free the copy (it is made again on the next product that needs it)."""
        self._copy, self._version, self._storage = None, -1, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._usable(x):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, self.in_features)  # the ops want rows; 1-D and 3-D inputs are reshaped
        y = self._product(flat, self.prepared())
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class PackedLinear(WeightCopy):
    """The fp32 weight also held in oneDNN's blocked layout (one extra copy of W in memory)."""

    def _usable(self, x: torch.Tensor) -> bool:
        return available() and super()._usable(x)

    def _make(self, w: torch.Tensor) -> torch.Tensor:
        return _blocked(w)

    def _product(self, flat: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return _blocked_product(flat, packed, self.bias)


def _blocked(w: torch.Tensor) -> torch.Tensor:
    """`w` reordered into oneDNN's blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(w, None)


def _blocked_product(flat: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(flat, blocked, bias, "none", [], "")


class Int8Linear(WeightCopy):
    """The weight also held as int8 with a bf16 scale per output row (symmetric, per channel), for
    products of at most `INT8_ROWS` rows; wider products use a prepacked fp32 copy. For drafters only.

    PyTorch's int8 kernel takes activations in bf16 (fp32 ones hit a slow path), computes 4 rows per
    pass over the weight, and reads rows 16 values at a time with aligned loads. So it pays for the
    1-4 positions of a drafter step but not for a prompt, where it measured slower than prepacked fp32
    (commit 7360d9f), and it needs `in_features` to be a multiple of 16 (else it reads past the row,
    or crashes).
    """

    @staticmethod
    def supports(in_features: int) -> bool:
        return in_features % 16 == 0

    def _usable(self, x: torch.Tensor) -> bool:
        return self.supports(self.in_features) and super()._usable(x)

    def _make(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        scale = (w.float().abs().amax(1) / 127).clamp_min(1e-12)
        q = (w.float() / scale[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous()
        wide = _blocked(w) if available() else None
        return q, scale.to(torch.bfloat16), wide

    def _product(self, flat: torch.Tensor, prepared) -> torch.Tensor:
        q, scale, wide = prepared
        if flat.shape[0] > INT8_ROWS:
            if wide is None:
                return F.linear(flat, self.weight, self.bias)
            return _blocked_product(flat, wide, self.bias)
        y = torch._weight_int8pack_mm(flat.to(torch.bfloat16).contiguous(), q, scale).float()
        return y if self.bias is None else y + self.bias


INT8_ROWS = 4  # the int8 kernel's row block: more rows take more passes over the weight


KINDS = {"fp32": PackedLinear, "int8": Int8Linear}


def copy_class(kind: str, in_features: int) -> type[WeightCopy]:
    """The class giving a layer `kind`'s copy: int8 where its kernel applies, prepacked fp32 elsewhere."""
    cls = KINDS[kind]
    return cls if cls is not Int8Linear or Int8Linear.supports(in_features) else PackedLinear


def pack_linears(module: nn.Module, kind: str = "fp32") -> int:
    """Swap every `nn.Linear` (and, for int8, every `PackedLinear`) under `module` for the `kind`
    of copy (in place); returns how many. Int8 skips layers its kernel cannot take (`copy_class`).

    Only fp32 CPU modules are packed, and only after a numerical check on the first layer: a build
    whose packed product disagrees with the plain one (or lacks the ops) is left untouched (0).
    """
    cls = KINDS[kind]
    swappable = (nn.Linear,) if cls is PackedLinear else (nn.Linear, PackedLinear)
    targets = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
               if type(child) in swappable and copy_class(kind, child.in_features) is cls]
    if not targets or not (available() if cls is PackedLinear else int8_available()):
        return 0
    first = targets[0][2]
    if first.weight.device.type != "cpu" or first.weight.dtype != torch.float32:
        return 0
    x = torch.randn(3, first.in_features, dtype=first.weight.dtype, device=first.weight.device)
    try:
        with torch.no_grad():
            err = _relative_error(cls.from_linear(first)(x), F.linear(x, first.weight, first.bias))
    except (RuntimeError, NotImplementedError):
        return 0
    if not err < (1e-5 if cls is PackedLinear else 0.05):
        return 0
    for parent, name, child in targets:
        layer = cls.from_linear(child)
        layer.prepared()  # now, at load time, not in the first timed forward
        setattr(parent, name, layer)
    return len(targets)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm().clamp_min(1e-12))


class ExpertsCopy(WeightCopy):
    """A mixture-of-experts weight stored as one 3D tensor (experts, out, in), each expert's matrix also held in
    oneDNN's blocked layout; `prepared()` gives the list, remade when the tensor changes."""

    def _usable(self, x: torch.Tensor) -> bool:
        return available() and super()._usable(x)

    def _make(self, w: torch.Tensor) -> list[torch.Tensor]:
        return [_blocked(w[e]) for e in range(len(w))]


def pack_experts(module: nn.Module) -> int:
    """Give every mixture-of-experts block under `module` prepacked copies of its router's and its experts'
    weights, and forwards that use them; returns how many expert sets were packed.

    Why: the stock forwards multiply the router's weight by all the tokens at once and each expert's weight by
    the rows routed to it, so a token's numbers depend on which other tokens come with it. A verify forward of a
    tree and a decode step of one token then round differently, and a near-tie in the target's logits (or its
    routing) can pick another token: greedy output would no longer equal vanilla's. The blocked product gives
    each row the same numbers whatever rows come with it. Experts: transformers 5's 3D tensors (`gate_up_proj`,
    `down_proj`; concatenated, untransposed, no bias). Routers: modules named `...Router` with a 2D `weight`
    that their forward multiplies with `F.linear` (Mixtral's, Qwen3-MoE's, OLMoE's).
    """
    if not available():
        return 0
    routers = [m for m in module.modules() if type(m).__name__.endswith("Router") and not isinstance(m, nn.Linear)
               and _fp32_cpu(getattr(m, "weight", None)) and m.weight.dim() == 2]
    for m in routers:
        m._packed_router = PackedLinear(m.weight)
        m._packed_router.prepared()  # now, at load time, not in the first timed forward
        m._eager_forward = m.forward
        m.forward = types.MethodType(_blocked_router_forward, m)
    experts = [m for m in module.modules() if _fp32_cpu(getattr(m, "gate_up_proj", None))
               and _fp32_cpu(getattr(m, "down_proj", None)) and m.gate_up_proj.dim() == 3
               and not getattr(m, "is_transposed", True) and getattr(m, "is_concatenated", False)
               and getattr(m, "has_gate", False) and not getattr(m, "has_bias", True)]
    for m in experts:
        m._packed_experts = ExpertsCopy(m.gate_up_proj), ExpertsCopy(m.down_proj)
        for copy in m._packed_experts:
            copy.prepared()
        m._eager_forward = m.forward
        m.forward = types.MethodType(_blocked_experts_forward, m)
    return len(experts)


def _fp32_cpu(w) -> bool:
    return isinstance(w, torch.Tensor) and w.device.type == "cpu" and w.dtype == torch.float32


class _RouterProduct(torch.overrides.TorchFunctionMode):
    """While a router's own forward runs: its `F.linear(x, weight)` through the prepacked copy (which takes the
    plain product itself wherever the copy does not apply)."""

    def __init__(self, packed: PackedLinear):
        super().__init__()
        self.packed = packed

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear and len(args) == 2 and args[1] is self.packed.weight and not kwargs:
            return self.packed(args[0])
        return func(*args, **(kwargs or {}))


def _blocked_router_forward(self, hidden_states: torch.Tensor, *args, **kwargs):
    with _RouterProduct(self._packed_router):
        return self._eager_forward(hidden_states, *args, **kwargs)


def _blocked_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' eager experts loop (the same experts in the same order), each product through the prepacked
    copy; the eager forward wherever the copy does not apply (`WeightCopy._usable`)."""
    gate_up_copy, down_copy = self._packed_experts
    if not (gate_up_copy._usable(hidden_states) and down_copy._usable(hidden_states)):
        return self._eager_forward(hidden_states, top_k_index, top_k_weights)
    gate_ups, downs = gate_up_copy.prepared(), down_copy.prepared()
    out = torch.zeros_like(hidden_states)  # (tokens, hidden)
    experts = len(gate_ups)
    mask = F.one_hot(top_k_index, num_classes=experts + 1).permute(2, 1, 0)  # (experts + 1, k, tokens)
    for e in mask.sum(dim=(-1, -2)).gt(0).nonzero()[:, 0].tolist():
        if e == experts:
            continue
        slot, tokens = torch.where(mask[e])
        h = self._apply_gate(_blocked_product(hidden_states[tokens].contiguous(), gate_ups[e], None))
        h = _blocked_product(h.contiguous(), downs[e], None) * top_k_weights[tokens, slot, None]
        out.index_add_(0, tokens, h)
    return out

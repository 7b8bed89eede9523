"""A preallocated KV cache that stock transformers models write into, with an accepted-path commit.

Each forward appends its rows at the current length (the tree's nodes during verification); after
verification `keep(idx)` moves only the accepted nodes' rows to the prefix end and sets the length.
Nothing is reallocated per step, and `reserve(n)` refuses a forward that would not fit before any
layer has written into the cache.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from fasteagle.errors import FastEagleError


class ContextOverflowError(FastEagleError):
    """The prompt plus the reply would not fit into the cache's capacity."""


class SlotLayer(CacheLayerMixin):
    """One attention layer's keys and values in a fixed (B, H, capacity, D) buffer."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0  # rows that hold valid keys/values
        self.start = 0  # where the last forward began writing

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states.new_zeros(b, h, self.capacity, d)
        self.values = value_states.new_zeros(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ContextOverflowError(f"KV cache overflow: {end} positions needed, capacity {self.capacity}")
        self.keys[:, :, self.length:end] = key_states
        self.values[:, :, self.length:end] = value_states
        self.start, self.length = self.length, end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def keep(self, idx: torch.Tensor) -> None:
        """Keep rows start+idx of the last forward (in this order) and drop the rest of it."""
        n = idx.numel()
        src = idx + self.start
        # Advanced indexing copies first, so overlapping source/destination rows are safe.
        self.keys[:, :, self.start:self.start + n] = self.keys[:, :, src]
        self.values[:, :, self.start:self.start + n] = self.values[:, :, src]
        self.length = self.start + n

    def truncate(self, length: int) -> None:
        self.length = self.start = min(self.length, length)

    def get_mask_sizes(self, query_length: int, *args) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def reset(self) -> None:
        self.length = self.start = 0


class KVCache(Cache):
    """A transformers `Cache` of `SlotLayer`s whose buffers are views into one preallocated pool
    (2, layers, B, H, capacity, D) when every layer's keys and values have one shape, as in the
    Llama family; a layer of another shape gets a buffer of its own."""

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[SlotLayer(capacity) for _ in range(num_layers)])
        self.capacity = capacity
        self.pool: torch.Tensor | None = None
        self.pooled = [False] * num_layers

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        if not layer.is_initialized:
            self._place(layer_idx, key_states, value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def _place(self, i: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hand layer i its slice of the pool (made on the first layer's first write), so that `keep`
        moves every layer's accepted rows in one gather instead of two per layer: 60 small ops a step
        on SmolLM2, each a kernel launch on a GPU."""
        b, h, _, d = keys.shape
        if values.shape != keys.shape:
            return  # SlotLayer.update allocates this layer's own buffer
        if self.pool is None:
            self.pool = keys.new_zeros(2, len(self.layers), b, h, self.capacity, d)
        pool = self.pool
        if pool.shape[2:4] + pool.shape[5:] != (b, h, d) or pool.dtype != keys.dtype or pool.device != keys.device:
            return  # another shape than the pool's: its own buffer too
        layer = self.layers[i]
        layer.keys, layer.values = pool[0, i], pool[1, i]
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        self.pooled[i] = True

    @classmethod
    def for_model(cls, model: torch.nn.Module, capacity: int) -> KVCache:
        return cls(model.config.num_hidden_layers, capacity)

    @property
    def length(self) -> int:
        return self.layers[0].length

    def reserve(self, n: int) -> None:
        """Raise before a forward of n new rows that would not fit: nothing is written, nothing lost."""
        if self.length + n > self.capacity:
            raise ContextOverflowError(
                f"context too long: {self.length} cached + {n} new positions exceed the cache capacity "
                f"{self.capacity}; shorten the prompt or lower max_new_tokens"
            )

    def keep(self, idx: torch.Tensor) -> None:
        """Commit the accepted rows (indices into the last forward's rows) as the new prefix end.

        Rows 0..n-1 already sit where they belong (always so in plain decoding, and whenever a
        draft is rejected at depth 1 or accepted only there): then nothing moves. Otherwise one
        gather moves the rows of every pooled layer at once (two copies per layer outside the pool)."""
        n = idx.numel()
        if idx.tolist() == list(range(n)):
            for layer in self.layers:
                layer.length = layer.start + n
            return
        start = self.layers[0].start
        if all(self.pooled) and all(layer.start == start for layer in self.layers):
            self.pool[..., start:start + n, :] = self.pool[..., idx + start, :]
            for layer in self.layers:
                layer.length = start + n
            return
        for layer in self.layers:
            layer.keep(idx)

    def truncate(self, length: int) -> None:
        for layer in self.layers:
            layer.truncate(length)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].length

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()


def attention_mask(ancestors: torch.Tensor, past: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive float mask (1, 1, T, past+S): each of T rows sees the whole prefix and, of the S rows
    after it, those `ancestors` (T, S) marks (for a tree, S = T: its own ancestors).

    A causal chain is the special case `ancestors = lower-triangular ones`. The mask must be float
    (0 / dtype-min): a boolean 4D mask is silently added to the scores by eager attention. Its rows
    start at multiples of 8 elements (a view into a slightly wider buffer): CUDA's memory-efficient
    attention copies any mask whose strides are not, once per layer and forward.
    """
    t, s = ancestors.shape
    mask = aligned_empty(t, past + s, dtype, ancestors.device).fill_(torch.finfo(dtype).min)
    mask[:, :past] = 0
    mask[:, past:].masked_fill_(ancestors, 0)
    return mask[None, None]


MASK_ALIGN = 8  # elements: the row stride CUDA's memory-efficient attention takes a mask with, uncopied


def limit_to_window(mask: torch.Tensor, rows: torch.Tensor, window: int) -> torch.Tensor:
    """Hide from each row of an additive mask (..., R, C) the columns `window` or more positions before
    its own position `rows` (R,): a sliding window over absolute positions (0: leave it whole). In place."""
    if window:
        cols = torch.arange(mask.shape[-1], device=mask.device)
        mask.masked_fill_(cols[None] <= rows[:, None] - window, torch.finfo(mask.dtype).min)
    return mask


def aligned(n: int) -> int:
    """n rounded up to a multiple of MASK_ALIGN."""
    return -(-n // MASK_ALIGN) * MASK_ALIGN


def aligned_empty(rows: int, cols: int, dtype: torch.dtype, device: torch.device | str, *lead: int) -> torch.Tensor:
    """An uninitialised (*lead, rows, cols) tensor whose rows start every MASK_ALIGN elements."""
    return torch.empty(*lead, rows, aligned(cols), dtype=dtype, device=device)[..., :cols]


def causal_ancestors(t: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()

"""The cascade's decode step with fixed shapes, so that a CUDA graph can replay it in one launch.

Why: on a GPU a small drafter's step is bound by kernel launches, not arithmetic: the six-layer
`extend` plus the per-depth top-k is a kernel per small op, and replayed from a graph they cost one
launch (docs/design.md, "The draft step as one CUDA graph", links the profile that measured it).

A graph fixes every shape and address, so this step
- writes keys/values into one preallocated buffer per layer at positions held in a tensor
  (`StaticKV`) and attends over the whole buffer, masked by those positions;
- always runs `rows` rows: the accepted path (at most one node per draft depth plus the root)
  padded with stale rows. A padded row writes beyond the prefix end, where the next step writes
  its own rows before any row reads there, and its output is never read;
- ends with the per-depth top-k packed into one tensor, so the host reads it in one copy, or, given
  a tree spec, with the product tree itself (`tree.product_fixed`): then no host round trip sits
  between the draft and the target's forward, which the host queues while the GPU still drafts.

A prefill (more rows than that) runs the same code eagerly. Without CUDA (or with `graph=False`)
the whole step runs eagerly: the tests compare it with the dynamic step that way.
"""

from __future__ import annotations

import warnings

import torch

from fasteagle.env import env
from fasteagle.kvcache import ContextOverflowError, aligned
from fasteagle.tree import product_fixed


def graphs_wanted(device: torch.device) -> bool:
    """CUDA graphs for the drafter step on a GPU, unless FASTEAGLE_DRAFT_GRAPH=0."""
    return device.type == "cuda" and env().draft_graph


def device_tree_wanted() -> bool:
    """The graph builds the product tree too, unless FASTEAGLE_DEVICE_TREE=0 (then the host builds it
    from the top-k: the same tree, for comparing the two)."""
    return env().device_tree


class StaticKV:
    """Every drafter layer's keys and values in fixed (1, H, capacity, D) buffers, written at the
    positions in `pos` (set before each forward) and returned whole: the shapes never change."""

    def __init__(self, layers: int, capacity: int, heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        self.capacity = capacity
        self.keys = torch.zeros(layers, 1, heads, capacity, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.pos: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.pos, key_states)
        v.index_copy_(2, self.pos, value_states)
        return k, v


class DraftStep:
    """`extend` + per-depth top-k of a `CascadedDrafter` over a `StaticKV`, optionally as a CUDA graph.
    It uses the drafter's public interface only: `cfg`, `device`, `dtype`, `num_depths`, `hidden`,
    `depth_probs`, `vocab_ids` and `inference_tensors`.

    `length` counts the accepted positions held (the prefix end); `last` and `topk` hold the last
    step's outputs: each active layer's output at the last accepted position, and (2, layers, k)
    with the top-k probabilities in row 0 and their token ids (as floats) in row 1. With a `tree`
    spec (per-depth k, budget), `tree` holds the step's product tree as `DraftTree` fields, rooted
    at the last extend's `next_token`; a graph's next replay overwrites them.
    """

    def __init__(self, drafter, capacity: int, layers: int, k: int, graph: bool, tree: tuple | None = None):
        cfg = drafter.cfg
        dev, dtype = drafter.device, drafter.dtype
        self.drafter, self.layers, self.k, self.graph, self.tree_spec = drafter, layers, k, graph, tree
        self.rows = drafter.num_depths + 1  # the root plus one accepted node per depth
        # aligned columns, so the mask's rows are aligned for CUDA's attention (see `kvcache.attention_mask`)
        self.kv = StaticKV(layers, aligned(capacity + self.rows), cfg.num_kv_heads, cfg.head_dim, dtype, dev)
        self.capacity = capacity  # what the buffers hold
        self.limit = capacity  # what this sequence may use (`reset` lowers it)
        self.cols = torch.arange(self.kv.capacity, device=dev)
        self.first = torch.zeros((), dtype=torch.long, device=dev)  # the first position held (`skip`)
        self.length = 0
        self.last: torch.Tensor | None = None
        self.topk: torch.Tensor | None = None
        self.tree: tuple[torch.Tensor, ...] | None = None
        # the graph's inputs live at fixed addresses; a step copies its data into them
        self.in_feats = torch.zeros(1, self.rows, len(cfg.feature_layers) * cfg.target_hidden, dtype=dtype,
                                    device=dev)
        self.in_ids = torch.zeros(1, self.rows, dtype=torch.long, device=dev)
        self.in_pos = torch.arange(self.rows, device=dev)
        self.in_last = torch.zeros(1, dtype=torch.long, device=dev)
        self.offsets = torch.arange(self.rows, device=dev)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_out: tuple | None = None
        self._graph_key: tuple | None = None

    def fits(self, capacity: int, layers: int, k: int, tree: tuple | None = None) -> bool:
        d = self.drafter
        return (capacity <= self.capacity and layers == self.layers and k == self.k and tree == self.tree_spec
                and (d.dtype, d.device) == (self.in_feats.dtype, self.in_feats.device))

    def reset(self, limit: int | None = None) -> None:
        self.length = 0
        self.first.zero_()
        self.limit = self.capacity if limit is None else min(limit, self.capacity)
        self.last = self.topk = self.tree = None

    def skip(self, n: int) -> None:
        """Start the sequence `n` positions in: they are never written and never attended to (a drafter that
        reads only a prompt's tail, `prefill_tail`)."""
        self.length += n
        self.first.fill_(self.length)

    def rewind(self, length: int) -> None:
        """Forget every position from `length` on."""
        self.length = min(self.length, length)

    def forward(self, feats: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, last: torch.Tensor):
        """Rows `ids` (1, R) with target features `feats` (1, R, F) at positions `pos` (R,): write their
        keys/values, and return (each layer's output at row `last`, the packed per-depth top-k, the
        tree's fields or None); the tree's root is `ids` at `last`, the token that follows them."""
        d = self.drafter
        self.kv.pos = pos
        # additive, made once for all layers: row i sees every position up to its own
        mask = torch.zeros(1, 1, pos.shape[0], self.kv.capacity, dtype=self.in_feats.dtype, device=pos.device)
        hidden = (self.cols[None] > pos[:, None]) | (self.cols[None] < self.first)
        mask.masked_fill_(hidden, torch.finfo(mask.dtype).min)
        if d.attention_window:
            mask.masked_fill_(self.cols[None] <= pos[:, None] - d.attention_window, torch.finfo(mask.dtype).min)
        outs = d.hidden(feats, ids, pos[None], mask, self.kv, self.layers)
        rows = torch.cat([o[0].index_select(0, last) for o in outs])  # (layers, W)
        top_p, top_i = d.depth_probs(rows).topk(self.k, -1)
        tokens = d.vocab_ids[top_i]
        tree = None
        if self.tree_spec is not None:
            ks, budget = self.tree_spec
            t = product_fixed(ids[0].index_select(0, last), tokens, top_p, ks, budget)
            tree = (t.tokens, t.parents, t.depths, t.draft_probs, t.sources, t.ancestors)
        return rows, torch.stack([top_p, tokens.float()]), tree  # token ids < 2**24 are exact as floats

    def extend(self, tokens: torch.Tensor, features: torch.Tensor, next_token: int) -> None:
        """The drafter protocol's `extend`: feed the accepted positions, keep the outputs."""
        n = tokens.numel()
        if self.length + n > self.limit:
            raise ContextOverflowError(
                f"context too long: {self.length} cached + {n} new positions exceed the drafter cache capacity "
                f"{self.limit}; shorten the prompt or lower max_new_tokens")
        nxt = torch.cat([tokens[1:], tokens.new_tensor([next_token])])
        feats = features.to(self.in_feats.dtype)
        if n > self.rows:  # a prefill: eager, at its own length
            pos = torch.arange(self.length, self.length + n, device=tokens.device)
            self.last, self.topk, self.tree = self.forward(feats[None], nxt[None], pos, pos.new_tensor([n - 1]))
        else:
            self.in_ids[0, :n] = nxt
            self.in_feats[0, :n] = feats
            torch.add(self.offsets, self.length, out=self.in_pos)
            self.in_last.fill_(n - 1)
            self.last, self.topk, self.tree = self._run()
        self.length += n

    def _run(self) -> tuple:
        args = (self.in_feats, self.in_ids, self.in_pos, self.in_last)
        if not self.graph:
            return self.forward(*args)
        key = self._weights_key()
        if self._graph is None or key != self._graph_key:
            try:
                self._capture(args)
            except RuntimeError as exc:  # a setup that cannot capture still drafts, eagerly
                warnings.warn(f"fasteagle: the drafter step could not be captured as a CUDA graph ({exc}); "
                              "running it eagerly", stacklevel=2)
                self.graph = False
                return self.forward(*args)
            self._graph_key = key
        self._graph.replay()
        return self._graph_out

    def _weights_key(self) -> tuple:
        """Where the tensors the graph reads live: a graph replays raw addresses, so weights moved,
        merged again, or a vocabulary changed since the capture need a new one."""
        return tuple(t.data_ptr() for t in self.drafter.inference_tensors())

    def _capture(self, args) -> None:
        """Warm up on a side stream (lazy initialisations, cuBLAS workspaces), then record the step.
        The warm-up runs compute this step's real rows, which the replay writes again."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.forward(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # the app decodes on worker threads
            out = self.forward(*args)
        self._graph, self._graph_out = graph, out

"""One decoding loop for every method: draft a tree, verify it in one target forward, keep the
accepted path, repeat. Plain decoding is the same loop with no drafter (a one-node tree).

The loop yields a `StepTrace` per step (`fasteagle.trace`: the fields and every metric on them);
the CLI, the benchmark and the app all consume these.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from fasteagle.errors import FastEagleError
from fasteagle.kvcache import ContextOverflowError, KVCache
from fasteagle.target import Target
from fasteagle.trace import NEVER_REACHED, StepTrace
from fasteagle.tree import DraftTree, make_tree, root_only, select
from fasteagle.verify import SamplingParams, Verdict, prefill_forward, tree_forward, verify


class Drafter(Protocol):
    """What the loop needs from a drafter.

    `feature_layers`: indices into the target's `hidden_states` the drafter wants (empty: none).
    `reset(capacity)`: forget the previous sequence; at most `capacity` positions will follow.
    `extend(tokens, features, next_token)`: `tokens` just entered the target's KV cache (with the
        target's hidden features at those positions); `next_token` follows them and is the root of
        the next tree.
    `draft(root)`: a tree rooted at `root` (the last `next_token`).
    """

    feature_layers: tuple[int, ...]

    def reset(self, capacity: int) -> None: ...

    def extend(self, tokens: torch.Tensor, features: torch.Tensor | None, next_token: int) -> None: ...

    def draft(self, root: int) -> DraftTree: ...


def chat_prompt_ids(target: Target, prompt: str, system: str | None = None) -> torch.Tensor:
    """The prompt as the chat template renders it, ending with the assistant turn's header."""
    if not prompt or not prompt.strip():
        raise FastEagleError("the prompt is empty")
    tok = target.tokenizer
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        if not isinstance(ids, list):  # some tokenizers return a BatchEncoding / tensor
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    else:
        ids = tok(prompt)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def check_context(target: Target, prompt_len: int, max_new_tokens: int) -> int:
    """The model's number of positions, once it is clear the prompt and reply fit in them."""
    max_pos = getattr(target.model.config, "max_position_embeddings", None) or 1 << 30
    if prompt_len + max_new_tokens > max_pos:
        raise FastEagleError(f"context too long: {prompt_len} prompt + {max_new_tokens} new tokens exceed the "
                             f"model's {max_pos} positions; shorten the prompt or lower max new tokens")
    return max_pos


def max_tree_nodes(target: Target) -> int:
    """The largest draft tree one verify forward can take here: no more nodes than the model has
    positions (each node is a row of the attention mask and a slot of the cache), and the forward's
    attention scores, heads x nodes x (positions + nodes) in the model's dtype, within a quarter of
    the memory now free on the target's device."""
    cfg = target.model.config
    max_pos = getattr(cfg, "max_position_embeddings", None) or 1 << 20
    row = getattr(cfg, "num_attention_heads", 1) * torch.finfo(target.dtype).bits // 8
    room = free_memory(target.device) / 4 / row  # nodes * (max_pos + nodes) must stay under this
    by_memory = int((-max_pos + math.sqrt(max_pos * max_pos + 4 * room)) / 2)
    return max(2, min(max_pos, by_memory))


def free_memory(device: torch.device) -> int:
    """Bytes free on `device` now (a CPU: the system's available memory)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a clock read after it times the work (no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Decode:
    """What one decode carries from step to step: its setup, fixed for the whole reply, and its
    running counts, which each step advances."""

    model: torch.nn.Module
    device: torch.device
    cache: KVCache
    drafter: Drafter | None
    capacity: int  # cache positions (the drafter's too)
    sampling: SamplingParams
    generator: torch.Generator
    stop_ids: set[int]
    max_new_tokens: int
    feature_layers: tuple[int, ...]  # the target's hidden states the drafter reads
    detokenizer: _Detokenizer
    sync_phases: bool = False  # wait for the device between phases, so each phase's time is its own
    extend_ms: float = 0.0  # ms of the drafter's last `extend`: the forward that readied the next draft
    step: int = 0
    generated: int = 0  # tokens emitted so far
    forwards: int = 0  # target forwards so far, prefill excluded


def generate(
    target: Target,
    input_ids: torch.Tensor,
    drafter: Drafter | None = None,
    max_new_tokens: int = 128,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    capacity: int | None = None,
    stop_ids: set[int] | None = None,
    tree_room: int = 128,
    sync_phases: bool = False,
) -> Iterator[StepTrace]:
    """Decode up to `max_new_tokens` after `input_ids` (1-D), yielding one StepTrace per step.

    Step 0 is the prefill (its token is the target's own). Stops after a stop token (which is
    emitted) or exactly at `max_new_tokens`. `sync_phases`: wait for the device after the draft and
    after `extend`, so that draft_ms holds the drafter's GPU time (a cost measurement wants it; a
    decode does not, the forward's launch overlaps the draft).
    """
    sampling = sampling or SamplingParams()
    if input_ids.dim() != 1 or input_ids.numel() == 0:
        raise FastEagleError(f"input_ids must be a non-empty 1-D tensor of token ids (got shape "
                             f"{tuple(input_ids.shape)})")
    if max_new_tokens < 1:
        raise FastEagleError("max_new_tokens must be at least 1")
    max_pos = check_context(target, input_ids.numel(), max_new_tokens)
    capacity = capacity or min(input_ids.numel() + max_new_tokens + tree_room, max_pos + tree_room)
    if input_ids.numel() + max_new_tokens - 1 > capacity:  # the last token never enters the cache
        raise ContextOverflowError(
            f"context too long: {input_ids.numel()} prompt + {max_new_tokens} new tokens exceed the cache "
            f"capacity {capacity}; shorten the prompt or lower max_new_tokens"
        )
    state = Decode(
        model=target.model, device=target.device, cache=KVCache.for_model(target.model, capacity),
        drafter=drafter, capacity=capacity, sampling=sampling, generator=torch.Generator().manual_seed(seed),
        stop_ids=target.stop_ids() if stop_ids is None else stop_ids, max_new_tokens=max_new_tokens,
        feature_layers=tuple(drafter.feature_layers) if drafter else (),
        detokenizer=_Detokenizer(target.tokenizer), sync_phases=sync_phases,
    )

    # Each step runs under inference_mode on its own, never across a yield: the mode is per thread,
    # and a consumer such as a Gradio handler may resume the generator on another thread.
    with torch.inference_mode():
        trace = _prefill(state, input_ids.to(state.device))
    yield trace
    while not trace.finished:
        with torch.inference_mode():
            trace = _step(state, trace.bonus)
        yield trace


def _prefill(state: Decode, ids: torch.Tensor) -> StepTrace:
    """The prompt is a causal chain whose last logits give the first token (the next tree's root)."""
    t0 = time.perf_counter()
    logits, feats = prefill_forward(state.model, state.cache, ids, state.feature_layers)
    state.cache.keep(torch.arange(ids.numel(), device=state.device))
    root = _sample(logits[-1:], state.sampling, state.generator)
    synchronize(state.device)
    verify_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    if state.drafter:
        state.drafter.reset(state.capacity)
        state.drafter.extend(ids, feats, root)
    synchronize(state.device)
    draft_ms = state.extend_ms = (time.perf_counter() - t0) * 1e3
    state.generated = 1
    return StepTrace(step=0, tokens=[root], token_depths=[0], text=state.detokenizer.add([root]),
                     draft_ms=draft_ms, verify_ms=verify_ms, generated=1, forwards=0,
                     finished=_finish_reason([root], state.stop_ids, 1, state.max_new_tokens), bonus=root)


def _step(state: Decode, root: int) -> StepTrace:
    """Draft a tree from `root`, verify it in one target forward, keep the accepted path."""
    dev = state.device
    t0 = time.perf_counter()
    tree = state.drafter.draft(root) if state.drafter else root_only(root, dev)
    tree = _fit(_shallow(tree, state.max_new_tokens - state.generated - 1), state.capacity - state.cache.length)
    # No device sync here or after `extend`: a drafter that builds its tree on the GPU (a CUDA graph)
    # lets the host queue the target's forward while the GPU drafts. So on a GPU draft_ms is what the
    # host spent or waited for, and the draft's GPU time the forward did not hide counts as verify_ms.
    if state.sync_phases:
        synchronize(dev)
    t1 = time.perf_counter()
    logits, feats = tree_forward(state.model, state.cache, tree, state.feature_layers)
    verdict: Verdict = verify(logits, tree, state.sampling, state.generator)
    state.cache.keep(verdict.path)
    synchronize(dev)
    t2 = time.perf_counter()
    drawn = tree.to_dict()  # before `extend`: a drafter may build its next tree in these tensors' place
    t_trace = time.perf_counter() - t2  # the trace's cost, in neither phase
    path_tokens = tree.tokens[verdict.path]
    new = path_tokens[1:].tolist() + [verdict.bonus]
    depths = tree.depths[verdict.path][1:].tolist() + [0]
    new, depths, finished = _clip(new, depths, state.stop_ids, state.generated, state.max_new_tokens)
    path, status, bonus = _end_at_stop(verdict.path.tolist(), verdict.status.tolist(), drawn["depths"],
                                       verdict.bonus, len(new))
    if state.drafter and not finished:
        state.drafter.extend(path_tokens, feats[verdict.path] if feats is not None else None, verdict.bonus)
    if state.sync_phases:
        synchronize(dev)
    t3 = time.perf_counter()
    # the forwards that made this tree: none for a drafter that reads no target features (prompt lookup)
    passes = [state.extend_ms, *getattr(state.drafter, "inner_passes", [])] if state.feature_layers else []
    state.extend_ms = (t3 - t2 - t_trace) * 1e3
    state.step, state.generated, state.forwards = state.step + 1, state.generated + len(new), state.forwards + 1
    return StepTrace(
        step=state.step, tokens=new, token_depths=depths, text=state.detokenizer.add(new),
        draft_ms=((t1 - t0) + (t3 - t2) - t_trace) * 1e3, verify_ms=(t2 - t1) * 1e3,
        tree=drawn, status=status, target_probs=verdict.target_probs.tolist(),
        path=path, generated=state.generated, forwards=state.forwards, finished=finished, bonus=bonus,
        draft_passes=[round(ms, 3) for ms in passes], layer_top=list(getattr(state.drafter, "layer_top", [])),
        bonus_kind=verdict.bonus_kind if bonus >= 0 else "bonus", draws=_round(verdict.draws, status),
        dists=verdict.dists or [],
    )


def _round(draws: list[float] | None, status: list[int]) -> list[float]:
    """The verdict's draws as a trace keeps them: 6 decimals, none (-1) where the node counts as never
    reached (a stop token cut the path before it)."""
    if not draws:
        return []
    return [round(u, 6) if s != NEVER_REACHED else -1.0 for u, s in zip(draws, status)]


def _end_at_stop(path: list[int], status: list[int], depths: list[int], bonus: int, emitted: int):
    """The verdict as the trace keeps it when a stop token cut the chunk: the reply ended there, so the
    path stops at the last emitted token, nodes deeper than it count as never reached (whatever the
    target thought of them), and the bonus token, not emitted, is none (-1). Every count drawn from the
    trace (tau, per-depth acceptance, the picture) then agrees with the emitted tokens."""
    if emitted >= len(path):  # every accepted draft and the bonus were emitted: nothing cut
        return path, status, bonus
    return path[:emitted + 1], [NEVER_REACHED if d > emitted else v for v, d in zip(status, depths)], -1


def _shallow(tree: DraftTree, max_depth: int) -> DraftTree:
    """Drop nodes deeper than the tokens still to emit (the bonus token covers the last one): they
    could never count, and their positions could pass the model's last one, where a dynamic RoPE
    would rescale the whole forward. Only the last steps can have such nodes, so only they read
    the depths back."""
    if tree.size - 1 <= max_depth:
        return tree
    return select(tree, tree.depths <= max_depth)


def _fit(tree: DraftTree, room: int) -> DraftTree:
    """The tree's first `room` nodes (a topological prefix is a tree too) when the cache has no room
    for all of it, so a tight cache or a big tree shortens the draft instead of failing mid-reply."""
    if tree.size <= room:
        return tree
    n = max(room, 1)
    return DraftTree(tree.tokens[:n], tree.parents[:n], tree.depths[:n], tree.draft_probs[:n], tree.sources[:n],
                     tree.ancestors[:n, :n])


def _sample(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator) -> int:
    """The target's own next token from one row of logits (the same rule as a tree with no children)."""
    one = make_tree(torch.zeros(1, dtype=torch.long, device=logits.device),
                    torch.tensor([-1], device=logits.device))
    return verify(logits, one, sampling, generator).bonus


def _finish_reason(tokens: list[int], stop_ids: set[int], generated: int, max_new: int) -> str | None:
    if tokens and tokens[-1] in stop_ids:
        return "eos"
    return "length" if generated >= max_new else None


def _clip(new: list[int], depths: list[int], stop_ids: set[int], generated: int, max_new: int):
    """Cut an accepted chunk at the first stop token (kept) and at max_new_tokens."""
    for i, tok in enumerate(new):
        if tok in stop_ids:
            new, depths = new[: i + 1], depths[: i + 1]
            break
    room = max_new - generated
    new, depths = new[:room], depths[:room]
    return new, depths, _finish_reason(new, stop_ids, generated + len(new), max_new)


class _Detokenizer:
    """Incremental decoding that never splits a multi-byte character across deltas."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.text = tokenizer, [], ""

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        delta, self.text = text[len(self.text):], text
        return delta


def run(target: Target, input_ids: torch.Tensor, **kwargs) -> tuple[list[int], list[StepTrace]]:
    """Decode to the end; returns the generated token ids and the traces."""
    traces = list(generate(target, input_ids, **kwargs))
    return [t for tr in traces for t in tr.tokens], traces

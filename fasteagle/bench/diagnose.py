"""Where a drafter's acceptance goes, kind by kind: against the position in the reply, the context
length, and whether the next token is copyable; and with its context cut at inference.

    python -m fasteagle bench --diagnose window256,tail256 --prompts assets/prompts/mix_heldout.jsonl --limit 24 \
        --methods fasteagle --max-new-tokens 64 --tree-budget 6 --out bench/results/X.json

The target writes each reply greedily (plain decoding, fp32). Greedy speculative decoding of that reply
is then replayed without running the target per step (`trace.replay_walk`): one target forward over
prompt + reply gives the features, one drafter forward over the whole sequence gives every position's
draft. That is exactly the drafter's state at each step of a real decode (it extends its cache with the
accepted positions' features), so the replayed tau is the decode's, which decoding the first prompts for real
confirms (`check`). Prompt lookup (`fasteagle.lookup`) is replayed on the same replies.

Measured per reply slot t (the root x[t+1] in the reply; depth i drafts x[t+1+i]):
- hit at depth 1, and the chain's conditional acceptance at depths 2 and 3;
- copyable: prompt lookup, drafting from the same context, proposes x[t+2] at depth 1.
Variants (`--diagnose`), each beside the whole context:
- windowW: every drafter layer attends over only its last W positions (its `attention_window`, a sliding
  window, the positions kept). Under rotary embeddings attention depends only on relative distance, so the
  same window with positions renumbered from 0 gives the same drafts: the result file records the largest
  difference measured between the two on sampled slots;
- tailT: the drafter reads only the prompt's last T tokens (its `prefill_tail`: its prefill costs at most
  T positions), and every token from there on, at their true positions; the target reads them all.
Several cascades (`--methods fasteagle,a,b` with `--drafters a=DIR,b=DIR`) are replayed on the same replies,
each in every variant: drafters trained apart, compared slot for slot.
"""

from __future__ import annotations

import re
from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from fasteagle import trace
from fasteagle.errors import FastEagleError
from fasteagle.tree import TREE_BUILDERS

REPLY_BUCKETS = (0, 8, 16, 32, 64)
CONTEXT_BUCKETS = (0, 128, 512, 1024, 4096)
BUDGETS = (6, 60)


@contextmanager
def window(drafter, w: int):
    """The drafter's layers attend over only their last `w` positions inside the block (0: all)."""
    before = drafter.attention_window
    drafter.attention_window = w
    try:
        yield drafter
    finally:
        drafter.attention_window = before


@contextmanager
def tail(drafter, t: int):
    """The drafter reads only the prompt's last `t` tokens inside the block (0: all of it)."""
    before = drafter.prefill_tail
    drafter.prefill_tail = t
    try:
        yield drafter
    finally:
        drafter.prefill_tail = before


def parse_variant(name: str) -> tuple[str, int]:
    """"full", "windowW" or "tailT" -> (kind, size); anything else is an error that says what is meant."""
    m = re.fullmatch(r"(window|tail)(\d+)", name)
    if name == "full":
        return "full", 0
    if not m or int(m[2]) < 1:
        raise FastEagleError(f"--diagnose: {name!r} is not windowW (attend over the last W positions) or tailT "
                             "(the drafter reads only the prompt's last T tokens), e.g. window256,tail256")
    return m[1], int(m[2])


@torch.no_grad()
def drafts(drafter, feats: torch.Tensor, seq: torch.Tensor, variant: str, prompt_len: int, k: int):
    """Top-k draft ids and probabilities (L-1, N, k) at every slot t (feature t, token t+1 -> depths) of one
    variant: the whole context, a window, or only the prompt's last T tokens read (rows before them unset)."""
    kind, size = parse_variant(variant)
    start = max(0, prompt_len - size) if kind == "tail" else 0
    n = seq.numel() - 1 - start
    with window(drafter, size if kind == "window" else 0):
        outs = drafter.hidden(feats[:, start:-1].to(drafter.dtype), seq[None, start + 1:],
                              torch.arange(start, start + n)[None], cur_ids=seq[None, start:-1])
    tops = [drafter.head(o[0], d + 1).float().softmax(-1).topk(k, -1) for d, o in enumerate(outs)]
    top_i = drafter.vocab_ids[torch.stack([t.indices for t in tops], 1)]
    top_p = torch.stack([t.values for t in tops], 1)
    pad = (0, 0, 0, 0, start, 0)  # slots before `start` are never drafted from
    return F.pad(top_i, pad), F.pad(top_p, pad)


@torch.no_grad()
def renumbered_gap(drafter, feats: torch.Tensor, seq: torch.Tensor, w: int, slots: list[int],
                   windowed: torch.Tensor) -> float:
    """Largest |difference| in depth-1 probabilities between the windowed pass (`windowed`, a row per slot)
    and the same window run alone with positions renumbered from 0, at `slots`."""
    gap = 0.0
    for row, t in enumerate(slots):
        lo = max(0, t - w + 1)
        f, ids = feats[:, lo:t + 1], seq[None, lo + 1:t + 2]
        out = drafter.hidden(f.to(drafter.dtype), ids, torch.arange(ids.shape[1])[None], cur_ids=seq[None, lo:t + 1])[0]
        p = drafter.head(out[0, -1], 1).float().softmax(-1)
        gap = max(gap, float((p - windowed[row]).abs().max()))
    return gap


def lookup_replay(seq: list[int], reply: list[bool]) -> tuple[tuple[int, int], dict[int, bool]]:
    """Prompt lookup's replayed (tokens, steps) on the reply, and at every slot whether its depth-1
    proposals hold the next token (`copyable`)."""
    from fasteagle.lookup import LookupDrafter

    lk = LookupDrafter()
    fed = 0

    def tree_at(g: int):
        nonlocal fed
        if g < fed:  # a slot before the fed history: rebuild (never on replay's forward walk)
            lk.reset()
            fed = 0
        lk.extend(torch.tensor(seq[fed:g]), None, seq[g])
        fed = g
        return lk.tree(seq[g], "cpu").to_dict()

    start = reply.index(True)
    copyable = {}
    for g in range(start, len(seq) - 1):
        t = tree_at(g)
        copyable[g - 1] = any(p == 0 and tok == seq[g + 1] for p, tok in zip(t["parents"][1:], t["tokens"][1:]))
    lk.reset()
    fed = 0
    return trace.replay_walk(seq, reply, tree_at), copyable


def _bucket(x: int, edges: tuple[int, ...]) -> str:
    for lo, hi in zip(edges, edges[1:]):
        if lo <= x < hi:
            return f"{lo}-{hi}"
    return f"{edges[-1]}+"


class Tally:
    """Counts of hits by (kind, measure, bucket)."""

    def __init__(self):
        self.n = defaultdict(lambda: [0, 0])  # key -> [hits, trials]

    def add(self, key: tuple, hit: bool) -> None:
        c = self.n[key]
        c[0] += int(hit)
        c[1] += 1

    def table(self) -> dict:
        out: dict = {}
        for key, (h, n) in sorted(self.n.items()):
            node = out
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = {"rate": round(h / n, 3), "n": n}
        return out


def run_name(label: str | None, variant: str) -> str:
    """A (drafter, variant) run's key in the result: the variant alone when one drafter is replayed."""
    return variant if label is None else f"{label}:{variant}"


def split_run(name: str) -> tuple[str | None, str]:
    label, _, variant = name.rpartition(":")
    return label or None, variant


def analyse(drafter, seq: list[int], prompt_len: int, kind: str, variants: list[str], tally: Tally, walks: dict,
            feats: torch.Tensor, gaps: list, label: str | None = None, copyable: dict | None = None) -> dict:
    """Tally one reply's slots and replay its decode for every variant and budget of one drafter (`label`
    names it when several are replayed); prompt lookup is replayed once, where `copyable` is not given yet.
    Returns the slots' copyable marks."""
    ids = torch.tensor(seq)
    reply = [i >= prompt_len for i in range(len(seq))]
    first = copyable is None
    if first:
        (ltok, lsteps), copyable = lookup_replay(seq, reply)
        walks[(kind, "lookup", "full")][0] += ltok
        walks[(kind, "lookup", "full")][1] += lsteps
    N = drafter.num_depths
    for variant in variants:
        wname = run_name(label, variant)
        top_i, top_p = drafts(drafter, feats, ids, variant, prompt_len, drafter.max_k)
        kind_, w = parse_variant(variant)
        if kind_ == "window" and w < prompt_len:  # a few slots, each window also run alone, renumbered
            slots = list(range(prompt_len - 1, len(seq) - 2, 16))[:3]
            gaps.append(renumbered_gap(drafter, feats, ids, w, slots, _depth1_probs(drafter, feats, ids, w, slots)))
        for t in range(prompt_len - 1, len(seq) - 2):  # root x[t+1] in the reply, x[t+2] exists
            hits = [int(top_i[t, d, 0]) == seq[t + 2 + d] for d in range(N) if t + 2 + d < len(seq)]
            r, ctx = t + 1 - prompt_len, t + 1
            tally.add((kind, wname, "depth1", "all"), hits[0])
            tally.add((kind, wname, "depth1_by_reply_pos", _bucket(r, REPLY_BUCKETS)), hits[0])
            tally.add((kind, wname, "depth1_by_context", _bucket(ctx, CONTEXT_BUCKETS)), hits[0])
            if t in copyable:
                tally.add((kind, wname, "depth1_by_copyable", "copyable" if copyable[t] else "not"), hits[0])
                if first and variant == "full":
                    tally.add((kind, "lookup", "copyable_share", "all"), copyable[t])
            for d in (1, 2):
                if len(hits) > d and all(hits[:d]):
                    tally.add((kind, wname, f"depth{d + 1}_given_{d}", "all"), hits[d])
        for budget in BUDGETS:
            depths = max(1, min(N, budget - 1))
            ks = drafter.depth_ks(depths)
            build = TREE_BUILDERS[drafter.tree_shape]

            def draft(g, depths=depths, ks=ks, budget=budget, build=build, top_i=top_i, top_p=top_p):
                return build(seq[g], top_i[g - 1, :depths], top_p[g - 1, :depths], ks, budget).to_dict()

            tok, steps = trace.replay_walk(seq, reply, draft)
            walks[(kind, f"fasteagle{budget}", wname)][0] += tok
            walks[(kind, f"fasteagle{budget}", wname)][1] += steps
    return copyable


@torch.no_grad()
def _depth1_probs(drafter, feats, ids, w, slots):
    n = ids.numel() - 1
    with window(drafter, w):
        outs = drafter.hidden(feats[:, :-1].to(drafter.dtype), ids[None, 1:], torch.arange(n)[None], layers=1,
                              cur_ids=ids[None, :-1])
    return drafter.head(outs[0][0, slots], 1).float().softmax(-1)


def diagnose(target, drafters, prompts: list[dict], max_new: int, variants: list[str], check: int = 2) -> dict:
    """Every measure above over `prompts`, as the result file's fields, for the variants ("full" first) of one
    drafter, or of each of several ({label: drafter}, all on the same replies: runs keyed "label:variant")."""
    labelled = drafters if isinstance(drafters, dict) else {None: drafters}
    layers = {tuple(d.feature_layers) for d in labelled.values()}
    if len(layers) > 1:
        raise FastEagleError("--diagnose: the drafters read different target layers; replay them apart")
    from fasteagle.generate import chat_prompt_ids, run
    from fasteagle.train.teacher import teach

    tally, walks, gaps, checks = Tally(), defaultdict(lambda: [0, 0]), [], []
    lengths = defaultdict(list)
    for i, p in enumerate(tqdm(prompts, desc="diagnose")):
        ids = chat_prompt_ids(target, p["text"])
        reply, _ = run(target, ids, max_new_tokens=max_new)
        seq = ids.tolist() + reply
        if len(reply) < 4:
            continue
        lengths[p["category"]].append(ids.numel())
        with torch.no_grad():
            feats, _, _ = teach(target.model, torch.tensor(seq)[None], list(next(iter(layers))), 1)
        before = {k: list(v) for k, v in walks.items()}
        copyable = None
        for label, drafter in labelled.items():
            copyable = analyse(drafter, seq, ids.numel(), p["category"], variants, tally, walks, feats, gaps,
                               label, copyable)
        for (label, drafter), v in ((x, v) for x in labelled.items() for v in variants) if i < check else ():
            drafter.tree_budget = BUDGETS[0]  # decoded for real, in each variant
            kind, size = parse_variant(v)
            with window(drafter, size if kind == "window" else 0), tail(drafter, size if kind == "tail" else 0):
                out, traces = run(target, ids, drafter=drafter, max_new_tokens=max_new)
            key = (p["category"], f"fasteagle{BUDGETS[0]}", run_name(label, v))
            replayed = walks[key][1] - before.get(key, [0, 0])[1]
            checks.append({"id": p["id"], "variant": run_name(label, v), "identical": out == reply,
                           "decoded_steps": len(traces) - 1, "replayed_steps": replayed})
    taus: dict = {}
    for (kind, method, wname), (tok, steps) in sorted(walks.items()):
        taus.setdefault(kind, {}).setdefault(method, {})[wname] = round(trace.tau(tok, steps), 3)
    return {"variants": [run_name(label, v) for label in labelled for v in variants],
            "prompt_tokens": {k: {"median": sorted(v)[len(v) // 2], "min": min(v), "max": max(v), "n": len(v)}
                              for k, v in lengths.items()},
            "tau": taus, "rates": tally.table(), "renumbered_max_gap": max(gaps, default=None), "check": checks}


def _label(name: str) -> str:
    label, variant = split_run(name)
    kind, size = parse_variant(variant)
    what = {"full": "whole context", "window": f"window {size}", "tail": f"prompt's last {size}"}[kind]
    return what if label is None else f"{label}, {what}"


def _pooled(rates: dict, wname: str, measure: str) -> dict[str, tuple[float, int]]:
    """Per bucket, the rate over every kind (weighted by count) of one measure."""
    acc: dict[str, list[int]] = {}
    for kind in rates.values():
        for bucket, c in kind.get(wname, {}).get(measure, {}).items():
            a = acc.setdefault(bucket, [0, 0])
            a[0] += round(c["rate"] * c["n"])
            a[1] += c["n"]
    return {b: (h / n, n) for b, (h, n) in acc.items()}


def _order(bucket: str) -> int:
    return int(bucket.split("-")[0].rstrip("+")) if bucket[0].isdigit() else 0


def _drafters(doc: dict) -> str:
    if "drafters" in doc:  # several, on the same replies
        return "drafters " + ", ".join(f"{k} `{v}`" for k, v in doc["drafters"].items())
    return f"drafter `{doc['drafter']}` ({doc['method']})"


def markdown(doc: dict) -> str:
    """The result's tables: by kind, then depth-1 acceptance against context length and reply position."""
    wnames = doc["variants"]
    label = {v: _label(v) for v in wnames}
    kinds = list(doc["prompt_tokens"])
    rates, taus = doc["rates"], doc["tau"]
    checks = doc.get("check") or []
    same = sum(c["identical"] and c["decoded_steps"] == c["replayed_steps"] for c in checks)

    def r(kind, w, measure, bucket="all"):
        c = rates.get(kind, {}).get(w, {}).get(measure, {}).get(bucket)
        return f"{c['rate']:.2f}" if c else "–"

    head = (f"**{doc['device']}**, {doc['threads']} threads, target `{doc['target']}`, {doc['prompts_desc']} "
            f"{doc['max_new_tokens']} new tokens, greedy, fp32; {_drafters(doc)}; "
            f"replayed on vanilla's replies ({same}/{len(checks)} real decodes took the replay's steps, identical "
            f"to vanilla); a window renumbered from 0 differs by at most {doc['renumbered_max_gap'] or 0:.0e} in "
            "probability\n\n")
    cols = [f"tau 6 nodes, {label[w]}" for w in wnames] + [f"tau 60 nodes, {label[w]}" for w in wnames]
    fulls = [w for w in wnames if split_run(w)[1] == "full"]
    copy_col = "depth-1 hit on copyable / other" + ("" if len(fulls) == 1 else
                                                     ", " + ", ".join(split_run(w)[0] for w in fulls))
    out = head + ("| kind | prompt tokens | " + " | ".join(cols) + " | lookup tau | depth-1 hit, " +
                  ", ".join(label[w] for w in wnames) + f" | copyable | {copy_col} |\n")
    out += "|" + "---|" * (len(cols) + 6) + "\n"
    for k in kinds:
        t = taus.get(k, {})
        cells = [f"{t.get(f'fasteagle{b}', {}).get(w, float('nan')):.2f}" for b in BUDGETS for w in wnames]
        out += (f"| {k} | {doc['prompt_tokens'][k]['median']} | " + " | ".join(cells)
                + f" | {t.get('lookup', {}).get('full', float('nan')):.2f} | "
                + ", ".join(r(k, w, "depth1") for w in wnames)
                + f" | {r(k, 'lookup', 'copyable_share')} | "
                + ", ".join(f"{r(k, w, 'depth1_by_copyable', 'copyable')} / {r(k, w, 'depth1_by_copyable', 'not')}"
                            for w in fulls) + " |\n")
    for measure, title in (("depth1_by_context", "context length (tokens)"),
                           ("depth1_by_reply_pos", "position in the reply")):
        pooled = {w: _pooled(rates, w, measure) for w in wnames}
        buckets = sorted(pooled[wnames[0]], key=_order)
        out += (f"\nDepth-1 hit rate by {title}, every kind pooled\n\n| {title} | slots | "
                + " | ".join(label[w] for w in wnames) + " |\n|" + "---|" * (len(wnames) + 2) + "\n")
        for b in buckets:
            out += (f"| {b} | {pooled[wnames[0]][b][1]} | "
                    + " | ".join(f"{pooled[w][b][0]:.2f}" if b in pooled[w] else "–" for w in wnames) + " |\n")
    return out

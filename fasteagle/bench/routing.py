"""Routing against a drafter's misses, on a mixture-of-experts target (the MoE study):

    python -m fasteagle.bench.routing --target runs/moe/target/sparse --drafters cascade=DIR,eagle3=DIR \
        --prompts assets/prompts/mix_heldout.jsonl --limit 3 --out routing.json

A drafter reads the target's hidden states at a few layers, at the last position the target verified, and
guesses the tokens after it. On a sparse target those states come out of experts chosen token by token. If a
drafter misses where the routing moves, sparse routing is what it fails to follow. For every decoding step
(chains of `--depth`, greedy), this joins whether the first drafted token was accepted with how much the
experts chosen at each feature layer changed: from the position before to the position the drafter read
("seen"), and from there to the next position, whose state decides the token judged ("unseen"). Change is the
share of the k experts not chosen at both positions (0: the same experts, 1: all new).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from fasteagle.errors import FastEagleError, Parser, run_command
from fasteagle.files import check_writable, write_text


@torch.no_grad()
def routes(model, ids: Sequence[int], layers: Sequence[int]) -> dict[int, torch.Tensor]:
    """{layer: [T, k]}: the experts each MoE layer in `layers` picks for every position of `ids` (one forward)."""
    got, handles = {}, []
    for layer in layers:
        gate = model.model.layers[layer].mlp.gate

        def grab(_module, _args, out, layer=layer):
            got[layer] = out[-1].reshape(len(ids), -1).cpu()  # a router returns (..., indices)

        handles.append(gate.register_forward_hook(grab))
    try:
        model(torch.tensor([list(ids)], device=model.device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return got


def change(picks: torch.Tensor) -> torch.Tensor:
    """[T]: per position, the share of its k experts that the position before did not pick (position 0: 0)."""
    k = picks.shape[1]
    same = (picks[1:, :, None] == picks[:-1, None, :]).any(-1).sum(-1)
    return torch.cat([torch.zeros(1), 1 - same.float() / k])


def step_rows(prompt_len: int, traces, moved: dict[int, torch.Tensor]) -> list[dict]:
    """One row per drafted step: whether depth 1 was accepted, and the routing change seen and unseen at each
    layer. A step's draft reads the state at q = (tokens so far) - 2, the position that wrote the root token."""
    rows, written = [], prompt_len + len(traces[0].tokens)
    for tr in traces[1:]:
        q = written - 2
        rows.append({"hit": len(tr.path) > 1, "seen": {str(layer): float(m[q]) for layer, m in moved.items()},
                     "unseen": {str(layer): float(m[q + 1]) for layer, m in moved.items()}})
        written += len(tr.tokens)
    return rows


def summary(rows: list[dict], layers: Sequence[int]) -> dict:
    """Per layer: the mean routing change on hits and on misses (seen and unseen), and depth-1 acceptance on
    steps whose unseen change is none, some, or all of the experts."""
    out = {}
    for layer in map(str, layers):
        entry = {}
        for side in ("seen", "unseen"):
            for name, want in (("hits", True), ("misses", False)):
                vals = [r[side][layer] for r in rows if r["hit"] is want]
                entry[f"{side}_change_{name}"] = round(sum(vals) / len(vals), 4) if vals else None
        for name, test in (("none", lambda c: c == 0), ("some", lambda c: 0 < c < 1), ("all", lambda c: c == 1)):
            picked = [r["hit"] for r in rows if test(r["unseen"][layer])]
            entry[f"accept_when_{name}_changed"] = round(sum(picked) / len(picked), 4) if picked else None
            entry[f"steps_{name}_changed"] = len(picked)
        out[layer] = entry
    return out


def analyse(target, drafters: dict, prompts: list[list[int]], depth: int, max_new: int) -> dict:
    """Every drafter on every prompt, chains of `depth`: the routing summary per drafter at its feature layers."""
    from fasteagle.generate import run

    out = {}
    for label, d in drafters.items():
        layers = [i - 1 for i in d.feature_layers if i > 0]  # hidden_states[i] is layer i-1's output
        if not all(hasattr(target.model.model.layers[i].mlp, "gate") for i in layers):
            raise FastEagleError(f"{target.name} routes no tokens at {label}'s feature layers: not a mixture of "
                                 "experts")
        d.tree_k, d.tree_budget = 1, depth + 1
        rows = []
        for ids in tqdm(prompts, desc=f"routing: {label}"):
            tokens, traces = run(target, torch.tensor(ids), drafter=d, max_new_tokens=max_new)
            moved = {i: change(p) for i, p in routes(target.model, ids + tokens, layers).items()}
            rows += step_rows(len(ids), traces, moved)
        hits = sum(r["hit"] for r in rows)
        out[label] = {"steps": len(rows), "depth1_acceptance": round(hits / max(len(rows), 1), 4),
                      "feature_layers": list(d.feature_layers), "layers": summary(rows, layers)}
    return out


def parser() -> Parser:
    p = Parser(prog="python -m fasteagle.bench.routing", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="a mixture-of-experts target (a folder or a hub id)")
    p.add_argument("--drafters", required=True, help="LABEL=FOLDER,...: the drafters to follow")
    p.add_argument("--prompts", required=True, help="prompt files, comma-separated")
    p.add_argument("--limit", type=int, default=None, help="the first this many prompts of each kind")
    p.add_argument("--depth", type=int, default=6, help="drafted chain length")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", required=True, help="the JSON written")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_command(lambda: _run(args))


def _run(args) -> int:
    from fasteagle.bench.prompts import load_prompts
    from fasteagle.cli_args import module_command, named_drafters
    from fasteagle.generate import chat_prompt_ids
    from fasteagle.methods import load_drafter
    from fasteagle.target import load_target

    check_writable(args.out, "--out")
    named = named_drafters(args.drafters)
    files = [f for f in args.prompts.split(",") if f.strip()]
    rows = [p for f in files for p in load_prompts(f, args.limit)]
    target = load_target(args.target, device="cpu", dtype="fp32")
    prompts = [chat_prompt_ids(target, p["text"]).flatten().tolist() for p in rows]
    drafters = {label: load_drafter(folder, target.model) for label, folder in named}
    result = {"command": module_command("fasteagle.bench.routing"),
              "target": target.name, "prompts": len(prompts), "prompt_files": files, "depth": args.depth,
              "max_new_tokens": args.max_new_tokens, "drafters": analyse(target, drafters, prompts, args.depth,
                                                                         args.max_new_tokens)}
    write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

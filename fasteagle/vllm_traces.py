"""What vLLM did, request by request, as the app's trace files (`bench --engine vllm --traces DIR`).

vLLM reports, per request and verify step, how many tokens it drafted and how many of them it accepted
(`per_request_spec_decode_metrics="detailed"`), and the tokens it emitted. It does not report the drafted
tokens it rejected. So a step here is a chain: its root (the last step's bonus token), the accepted drafts
(known: they are in the reply), then the rejected draft and the ones after it, which carry the token id
`UNREPORTED` (labelled "?"). Step times are not reported either: the request's decode time (vLLM's first
to last token) is spread evenly over its steps, and the file says so. The app replays such a file like
any other ("Replay a trace file…"), so an engineer sees, request by request, where the serving engine's
chains stopped.
"""

from __future__ import annotations

from fasteagle.trace import ACCEPTED, NEVER_REACHED, REJECTED, StepTrace, make_run_file, run_summary

UNREPORTED_LABEL = "?"


def chain_steps(token_ids: list[int], accepted: list[int], drafted: list[int], unreported: int) -> list[dict]:
    """StepTrace dicts of one reply: the prefill's token, then one chain per verify step (`accepted[j]` of
    `drafted[j]` drafts accepted; the step emitted those and its bonus token, the last step maybe cut short),
    then the tokens after the last reported step, one plain step each (where vLLM drafted nothing)."""
    records, pos = [], 1
    for a, d in zip(accepted, drafted):
        n = len(token_ids[pos:pos + a + 1])
        if not n:
            break
        records.append((n, d, a, 0.0))
        pos += n
    records += [(1, 0, 0, 0.0)] * (len(token_ids) - pos)
    return placed_steps(token_ids, records, unreported)


def placed_steps(token_ids: list[int], records: list[tuple[int, int, int, float]], unreported: int,
                 prefill_ms: float = 0.0) -> list[dict]:
    """StepTrace dicts of one reply from its steps in order: the prefill's token, then per decode step
    (tokens emitted, drafts made, drafts accepted, ms). A step that drafted is a chain: its root (the last
    step's bonus token), the accepted drafts (known: they are in the reply), then the rejected draft and the
    ones after it as `unreported`; a step that drafted nothing emits the target's token alone."""
    first = token_ids[0]
    steps = [StepTrace(step=0, tokens=[first], token_depths=[0], text="", draft_ms=0.0, verify_ms=prefill_ms,
                       generated=1, forwards=0, bonus=first).to_dict()]
    pos, root = 1, first
    for j, (n, d, a, ms) in enumerate(records, start=1):
        emitted = token_ids[pos:pos + n]
        if not emitted:
            break
        pos += len(emitted)
        if not d:
            steps.append(StepTrace(step=j, tokens=emitted, token_depths=[0] * len(emitted), text="", draft_ms=0.0,
                                   verify_ms=ms, generated=pos, forwards=j, bonus=emitted[-1]).to_dict())
            root = emitted[-1]
            continue
        cut = len(emitted) <= a  # the reply ended inside the accepted drafts: no bonus token this step
        drafts = emitted[:a] if not cut else emitted
        nodes = [root, *drafts, *[unreported] * (d - len(drafts))]
        # accepted (emitted, or accepted past the reply's end), then the rejected one, then the unjudged rest
        status = [ACCEPTED] * (a + 1) + [REJECTED] * (d > a) + [NEVER_REACHED] * max(d - a - 1, 0)
        tree = {"tokens": nodes, "parents": [-1, *range(len(nodes) - 1)], "depths": list(range(len(nodes))),
                "draft_probs": [1.0] * len(nodes), "sources": [0] * len(nodes)}
        bonus = emitted[-1] if not cut else -1
        steps.append(StepTrace(step=j, tokens=emitted, token_depths=[*range(1, len(drafts) + 1), *[0] * (not cut)],
                               text="", draft_ms=0.0, verify_ms=ms, tree=tree, status=status,
                               path=list(range(len(drafts) + 1)), generated=pos, forwards=j,
                               bonus=bonus).to_dict())
        root = bonus
    return steps


def spread_times(steps: list[dict], seconds: float) -> list[float]:
    """Cumulative step times, `seconds` spread evenly over the decode steps (vLLM times requests, not steps)."""
    n = max(len(steps) - 1, 1)
    for s in steps[1:]:
        s["verify_ms"] = 1000 * seconds / n
    return [seconds * i / n for i in range(len(steps))]


def run_file(request: dict, method: str, k: int, label, meta: dict) -> dict:
    """One request's run file (`viz.make_run_file`): the speculative side is vLLM's `method`, the vanilla side
    vLLM's plain decoding of the same prompt. `request`: {"prompt", "vanilla": (ids, seconds), "spec": (ids,
    accepted, drafted, seconds)}; `label`: token id -> text."""
    ids, accepted, drafted, seconds = request["spec"]
    unreported = meta["vocab_size"]  # one past the vocabulary: never a real token
    sides = {}
    spec = chain_steps(ids, accepted, drafted, unreported)
    van_ids, van_s = request["vanilla"]
    van = chain_steps(van_ids, [], [], unreported)
    for name, steps, s in (("speculative", spec, seconds), ("vanilla", van, van_s)):
        elapsed = spread_times(steps, s)
        sides[name] = {"traces": steps, "elapsed": elapsed, "spans": [], "summary": run_summary(steps, s)}
    seen = {t for side in sides.values() for st in side["traces"] for t in st["tokens"] + (st["tree"] or {}).get(
        "tokens", []) if t != unreported}
    labels = {t: label(t) for t in sorted(seen)} | {unreported: UNREPORTED_LABEL}
    about = {"prompt": request["prompt"], "method": f"{method} in vLLM", "method_key": method, "temperature": 0.0,
             "max_new_tokens": meta["max_new_tokens"], "tree_k": "1", "tree_budget": k + 1, "tree_shape": "chain",
             "engine": f"vllm {meta['vllm']}", "step_times": "vLLM's request time spread evenly over its steps",
             "unreported_drafts": f"token {unreported} ('?'): a draft vLLM rejected or never judged (not reported)"}
    return make_run_file(meta | about, sides, labels)

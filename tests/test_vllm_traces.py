"""vLLM's decode as the app's trace files: what vLLM reports (tokens, accepted and drafted per step) becomes
chains the app replays, and every number the app derives from them is vLLM's. Pure: no vLLM needed."""

from __future__ import annotations

import json

import viz
from fasteagle import trace
from fasteagle.trace import ACCEPTED, NEVER_REACHED, REJECTED
from fasteagle.vllm_traces import chain_steps, run_file

UNREPORTED = 1000


def test_each_step_is_a_chain_of_what_vllm_reported():
    # prefill token 5; step 1 accepts 2 of 3 (7, 8) and adds bonus 9; step 2 accepts 0 of 3, bonus 10;
    # step 3 accepts 3 of 3 but the reply ends after two of them (the length cap)
    ids = [5, 7, 8, 9, 10, 11, 12]
    steps = chain_steps(ids, [2, 0, 3], [3, 3, 3], UNREPORTED)
    assert trace.reply_tokens(steps) == ids
    one, two, three = steps[1:]
    assert one["tree"]["tokens"] == [5, 7, 8, UNREPORTED] and one["status"] == [ACCEPTED] * 3 + [REJECTED]
    assert one["tokens"] == [7, 8, 9] and one["token_depths"] == [1, 2, 0] and one["path"] == [0, 1, 2]
    assert two["tree"]["tokens"] == [9, UNREPORTED, UNREPORTED, UNREPORTED]
    assert two["status"] == [ACCEPTED, REJECTED, NEVER_REACHED, NEVER_REACHED] and two["tokens"] == [10]
    assert three["tree"]["tokens"][:3] == [10, 11, 12] and three["token_depths"] == [1, 2] and three["bonus"] == -1
    assert trace.accepted_lengths(steps) == [2, 0, 2]
    assert three["status"] == [ACCEPTED] * 4  # the third accepted draft fell past the length cap: not emitted
    assert [r["rate"] for r in trace.depth_acceptance(steps)] == [2 / 3, 1.0, 0.5]


def test_a_vllm_run_file_replays_in_the_app():
    ids, van = [5, 7, 8, 9, 10], [5, 7, 8, 9, 10]
    request = {"prompt": "hi", "vanilla": (van, 0.5), "spec": (ids, [2, 1], [3, 3], 0.2)}
    meta = {"target": "t", "device": "cpu", "dtype": "float32", "vocab_size": UNREPORTED, "max_new_tokens": 5,
            "vllm": "0.32.0"}
    run = viz.parse_run_file(json.dumps(run_file(request, "fasteagle", 3, lambda i: f"<{i}>", meta)))
    spec = run["sides"]["speculative"]
    assert run["token_labels"][UNREPORTED] == "?" and run["token_labels"][7] == "<7>"
    assert spec["summary"]["tau"] == trace.tau(4, 2) and spec["summary"]["forwards"] == 2
    assert run["sides"]["vanilla"]["summary"]["forwards"] == 4
    assert "not reported" in run["meta"]["unreported_drafts"] and run["meta"]["engine"] == "vllm 0.32.0"

"""The step of each method as `fasteagle.bench.vllm_costs` adds it up from vLLM's measured costs, and its limit."""

import pytest

from fasteagle.bench.vllm_costs import draft_queries, limits, markdown, step_ms


def _at4(ms: dict) -> dict:
    return {str(q): {"4": {"ms": v, "query": q}} for q, v in ms.items()}


TARGET = _at4({1: 50.0, 2: 52.0, 3: 55.0, 4: 60.0})
DRAFTS = {"eagle3": _at4({1: 2.0, 4: 8.0}), "fasteagle": _at4({6: 9.0})}
KINDS = {"eagle3": "eagle3", "fasteagle": "fasteagle"}


def test_each_method_pays_the_forwards_vllm_runs_for_it():
    assert draft_queries("eagle3", 3) == [1, 4] and draft_queries("fasteagle", 3) == [6]
    assert step_ms("vanilla", None, 4, 3, TARGET, DRAFTS) == 50.0
    assert step_ms("ngram", None, 4, 3, TARGET, DRAFTS) == 60.0  # k+1 = 4 tokens verified
    assert step_ms("eagle3", "eagle3", 4, 3, TARGET, DRAFTS) == 60.0 + 8.0 + 2 * 2.0  # k+1 tokens, then k-1 of one
    assert step_ms("fasteagle", "fasteagle", 4, 3, TARGET, DRAFTS) == 60.0 + 9.0  # one forward of 2k tokens


def test_the_limit_is_batch_times_tau_over_the_step():
    sweep = {"k": 3, "batches": {"4": {"methods": {"vanilla": {"tokens_per_s": 70.0},
                                                   "fasteagle": {"tokens_per_s": 100.0, "tau": 2.0}}}}}
    out = limits(sweep, TARGET, DRAFTS, KINDS)["4"]
    assert out["vanilla"]["limit_tokens_per_s"] == pytest.approx(4 / 0.050)
    assert out["fasteagle"]["limit_tokens_per_s"] == pytest.approx(4 * 2.0 / 0.069)
    assert out["fasteagle"]["of_limit"] == pytest.approx(100.0 / (4 * 2.0 / 0.069))
    doc = {"k": 3, "repeats": 5, "decode_tokens": 32, "prompt_tokens": 256, "target": TARGET,
           "drafters": {"fasteagle": DRAFTS["fasteagle"]}, "kinds": KINDS, "limits": {"4": out}}
    table = markdown(doc)
    assert "| 4 | 50.0 | 60.0 | 9.0 |" in table and "100.0 / 115.9 (86%)" in table


def test_the_limit_pays_the_prefill_the_sweep_measured():
    """A call's tokens/s also pays its prefill, which no step prices: the limit pays the measured prefill, then
    the decode steps at the modelled step, so only the steps' own overheads stay below it."""
    row = {"tokens_per_s": 40.0, "tau": 2.0, "prefill_s": 0.5, "tokens": 4 * 49, "requests": 4}
    sweep = {"k": 3, "batches": {"4": {"methods": {"fasteagle": row}}}}
    out = limits(sweep, TARGET, DRAFTS, KINDS)["4"]["fasteagle"]
    steps = (4 * 49 - 4) / (4 * 2.0)  # 24 steps of 4 requests, 2 tokens each, after the prefill's first tokens
    assert out["limit_tokens_per_s"] == pytest.approx(4 * 49 / (0.5 + steps * 0.069))
    no_prefill = limits({"k": 3, "batches": {"4": {"methods": {"fasteagle": row | {"prefill_s": None}}}}},
                        TARGET, DRAFTS, KINDS)["4"]["fasteagle"]
    assert out["limit_tokens_per_s"] < no_prefill["limit_tokens_per_s"] == pytest.approx(4 * 2.0 / 0.069)


def test_a_file_that_is_not_a_batch_sweep_is_refused_in_one_line(tmp_path):
    from fasteagle.bench.vllm_costs import measure
    from fasteagle.errors import FastEagleError
    from fasteagle.methods import Settings

    with pytest.raises(FastEagleError, match="cannot read the result file"):
        measure(tmp_path / "missing.json", None, Settings(), 1)
    (tmp_path / "chat.json").write_text('{"methods": ["vanilla"]}')
    with pytest.raises(FastEagleError, match="not a vLLM batch sweep"):
        measure(tmp_path / "chat.json", None, Settings(), 1)


def test_vllm_gets_a_context_that_fits_the_longest_prompt_its_reply_and_a_draft():
    from fasteagle.vllm_engine import context_for

    assert context_for([[1] * 100, [1] * 300], 64, 3) == 2048  # the usual context, as every earlier run had
    assert context_for([[1] * 2050], 64, 3) == 2304  # a held-out document: 2050 + 64 + 4, to a multiple of 256
    assert context_for([[1] * 1980], 64, 3) == 2048 and context_for([[1] * 1981], 64, 3) == 2304

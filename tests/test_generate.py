"""fasteagle.generate: the decoding loop.

Greedy fp32 losslessness (speculative output == vanilla output, token for token) on tiny targets
with random, oracle-ish and lookup drafters over many tree shapes, and on the real default model;
stop tokens inside accepted chunks, max_new_tokens boundaries, context overflow, StepTrace I/O.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from fasteagle.errors import FastEagleError
from fasteagle.generate import StepTrace, chat_prompt_ids, generate, run
from fasteagle.kvcache import ContextOverflowError
from fasteagle.lookup import LookupDrafter
from fasteagle.tree import DraftTree, make_tree, root_only, select
from fasteagle.verify import ACCEPTED, SamplingParams
from tests.conftest import TINY_VOCAB, tiny_target
from tests.drafters import OracleDrafter, RandomDrafter, _ProtocolDrafter, one_thread

_one_thread = pytest.fixture(autouse=True, scope="module")(one_thread)

MAX_NEW = 32


def sharp_target(seed: int = 1, layers: int = 3, attn: str = "eager", scale: float = 10.0):
    """A tiny target whose attention is peaked (query and key weights scaled up): with the random
    weights' near-uniform attention, a wrong key/value row or mask entry may not flip an argmax."""
    target = tiny_target(seed=seed, layers=layers, attn=attn)
    with torch.no_grad():
        for layer in target.model.model.layers:
            layer.self_attn.q_proj.weight.mul_(scale)
            layer.self_attn.k_proj.weight.mul_(scale)
    return target


@pytest.fixture(scope="module")
def targets(tiny):
    """The shared tiny target (2 layers, sdpa) and a 3-layer eager-attention one with sharp attention."""
    return {"sdpa": tiny, "eager": sharp_target()}


def tiny_prompt(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + seed)
    n = int(torch.randint(2, 40, (), generator=gen))
    return torch.randint(4, TINY_VOCAB, (n,), generator=gen)


_VANILLA: dict = {}


def vanilla(target, ids: torch.Tensor, max_new: int = MAX_NEW, **kw) -> list[int]:
    key = (id(target), tuple(ids.tolist()), max_new, tuple(sorted(kw.items())))
    if key not in _VANILLA:
        _VANILLA[key] = run(target, ids, max_new_tokens=max_new, **kw)[0]
    return _VANILLA[key]


def accepted_depths(traces: list[StepTrace]) -> list[int]:
    """Depth of the deepest accepted draft node, per verification step."""
    return [max(tr.token_depths) for tr in traces[1:]]


def side_leaf_accepts(traces: list[StepTrace]) -> int:
    """Steps whose deepest accepted node is a side leaf (not the first node of its depth)."""
    n = 0
    for tr in traces[1:]:
        last = tr.path[-1]
        depths = tr.tree["depths"]
        if last != 0 and depths.index(depths[last]) != last:
            n += 1
    return n


# -- greedy losslessness on tiny targets -----------------------------------------------------------

SHAPES = [  # (shape, depth, k, budget)
    ("chain", 1, 1, 64), ("chain", 2, 1, 64), ("chain", 5, 1, 64), ("chain", 8, 1, 64),
    ("backbone", 1, 10, 11), ("backbone", 3, 2, 7), ("backbone", 4, [4, 3, 2, 1], 10), ("backbone", 6, 4, 16),
    ("backbone", 8, 10, 64), ("backbone", 5, 10, 64), ("backbone", 8, 10, 5),
    ("backbone", 8, [10, 8, 6, 4, 3, 2, 2, 1], 30), ("backbone", 3, 1, 64),
    ("product", 4, [4, 3, 2, 1], 10), ("product", 6, 4, 16), ("product", 8, 10, 64), ("product", 8, 10, 5),
    ("dynamic", 4, 3, 12), ("dynamic", 6, 6, 48),
]
SEEDS = range(3)


@pytest.mark.parametrize("shape,depth,k,budget", SHAPES)
def test_greedy_lossless_random_and_oracle_drafters(targets, shape, depth, k, budget):
    taus, deepest, side = [], 0, 0
    for name, target in targets.items():
        for seed in SEEDS:
            ids = tiny_prompt(seed)
            ref = vanilla(target, ids)
            out, traces = run(target, ids, drafter=RandomDrafter(TINY_VOCAB, shape, depth, k, budget, seed=seed),
                              max_new_tokens=MAX_NEW)
            assert out == ref, f"random drafter differs from vanilla ({name}, seed {seed})"
            assert all(tr.tree is not None and len(tr.tree["tokens"]) <= max(budget, depth + 1)
                       for tr in traces[1:])
            drafter = OracleDrafter(ref, TINY_VOCAB, shape, depth, k, budget, seed=seed, corrupt=0.1, side=0.25)
            out, traces = run(target, ids, drafter=drafter, max_new_tokens=MAX_NEW)
            assert out == ref, f"oracle drafter differs from vanilla ({name}, seed {seed})"
            taus.append(traces[-1].tau)
            deepest = max(deepest, *accepted_depths(traces))
            side += side_leaf_accepts(traces)
    # the oracle really exercised the accept path: deep paths, and side leaves where the tree has any
    spine = depth if shape == "chain" else min(depth, budget - 1)
    assert sum(taus) / len(taus) > 1.0 + 0.4 * min(spine, 3), taus
    assert deepest >= min(spine, 4)
    kmax = k if isinstance(k, int) else max(k)
    if shape in ("backbone", "product") and kmax > 1 and budget - 1 > spine:
        assert side > 0, "no side leaf was ever accepted"


def test_greedy_lossless_with_the_chat_template(tiny):
    ids = chat_prompt_ids(tiny, "w10 w11 w12 w13", system="w20 w21")
    assert ids.tolist()[:2] == [1, 5] and ids.tolist()[-2:] == [1, 6]
    ref = vanilla(tiny, ids, 48)
    for seed in range(2):
        out, traces = run(tiny, ids, drafter=OracleDrafter(ref, TINY_VOCAB, "backbone", 8, 10, 64, seed=seed),
                          max_new_tokens=48)
        assert out == ref
        assert traces[-1].tau > 3.0 and max(accepted_depths(traces)) == 8  # deep paths accepted, not just the bonus
        out, _ = run(tiny, ids, drafter=RandomDrafter(TINY_VOCAB, "backbone", 8, 10, 64, seed=seed), max_new_tokens=48)
        assert out == ref


def test_greedy_lossless_lookup_drafter(targets):
    accepted = forwards = 0
    for name, target in targets.items():
        for seed in range(4):
            ids = tiny_prompt(10 + seed)
            ref = vanilla(target, ids, 64)
            for drafter in (LookupDrafter(), LookupDrafter(max_ngram=2, depth=5, branches=3)):
                out, traces = run(target, ids, drafter=drafter, max_new_tokens=64)
                assert out == ref, f"lookup drafter differs from vanilla ({name}, seed {seed})"
                accepted += sum(len(tr.tokens) - 1 for tr in traces[1:])
                forwards += traces[-1].forwards
    # the tiny random model repeats itself: lookup must get real acceptances
    assert accepted > 0.2 * forwards, (accepted, forwards)


# -- greedy losslessness on the real default model -------------------------------------------------

SMOLLM_PROMPTS = [  # (kind, prompt, random tree shape, also run the oracle drafter)
    ("chat", "Hi! How are you today?", ("backbone", 3, 2, 4), True),
    ("code", "Write a Python function that returns the factorial of n.", ("chain", 2, 1, 3), False),
    ("list", "List five fruits that are red.", ("backbone", 3, 2, 4), False),
    ("math", "What is 17 times 23? Show your work.", ("chain", 3, 1, 4), True),
    ("translate", "Translate 'good morning, my friend' into French and Spanish.", ("backbone", 2, 3, 4), False),
    ("summary", "Summarize the plot of Romeo and Juliet in two sentences.", ("chain", 2, 1, 3), False),
    ("poem", "Write a haiku about autumn leaves.", ("backbone", 3, 2, 4), False),
    ("explain", "Explain what a hash table is to a beginner.", ("chain", 3, 1, 4), False),
    ("json", "Return a JSON object with the keys name and age for Ana, who is 30.", ("backbone", 2, 3, 4), True),
    ("repeat", "Repeat exactly: the cat sat on the mat. the cat sat on the mat. the cat sat on the mat.",
     ("chain", 2, 1, 3), False),
]
SMOLLM_NEW = 20


@pytest.mark.integration
@pytest.mark.parametrize("kind,prompt,shape,oracle", SMOLLM_PROMPTS, ids=[p[0] for p in SMOLLM_PROMPTS])
def test_greedy_lossless_real_model(smollm, kind, prompt, shape, oracle):
    """Vanilla vs a random drafter (rejections with real numerics), the lookup drafter and, on some
    prompts, an oracle drafter (multi-token acceptances, side leaves) on the default model, fp32."""
    vocab = smollm.model.config.vocab_size
    seed = [p[0] for p in SMOLLM_PROMPTS].index(kind)
    ids = chat_prompt_ids(smollm, prompt)
    ref, traces = run(smollm, ids, max_new_tokens=SMOLLM_NEW)
    assert len(ref) == SMOLLM_NEW or traces[-1].finished == "eos"
    out, _ = run(smollm, ids, drafter=RandomDrafter(vocab, *shape, seed=seed), max_new_tokens=SMOLLM_NEW)
    assert out == ref, "random drafter differs from vanilla"
    out, traces = run(smollm, ids, drafter=LookupDrafter(), max_new_tokens=SMOLLM_NEW)
    assert out == ref, "lookup drafter differs from vanilla"
    if kind == "repeat":
        assert traces[-1].tau > 1.5, "lookup must accept when the reply quotes the prompt"
    if oracle:
        drafter = OracleDrafter(ref, vocab, "backbone", 6, 3, 12, seed=seed, corrupt=0.2, side=0.2)
        out, traces = run(smollm, ids, drafter=drafter, max_new_tokens=SMOLLM_NEW)
        assert out == ref, "oracle drafter differs from vanilla"
        assert traces[-1].tau > 1.8


# -- stop tokens and max_new_tokens ----------------------------------------------------------------

def _deep_oracle(ref: list[int]) -> OracleDrafter:
    """Always drafts the next 8 true tokens: each step accepts 8 + the bonus."""
    return OracleDrafter(ref, TINY_VOCAB, "chain", 8, corrupt=0.0)


def test_target_stop_ids(tiny):
    assert tiny.stop_ids() == {2, 3}


def test_stop_token_inside_an_accepted_chunk(tiny):
    ids = tiny_prompt(3)
    ref = vanilla(tiny, ids, 40)
    firsts = [k for k, tok in enumerate(ref) if tok not in ref[:k]]
    cut_inside = 0
    for k in firsts[:12]:
        stop = ref[k]
        want = ref[: k + 1]
        assert vanilla(tiny, ids, 40, stop_ids=frozenset({stop})) == want
        out, traces = run(tiny, ids, drafter=_deep_oracle(ref), max_new_tokens=40, stop_ids={stop})
        assert out == want, f"stop token at {k}"
        last = traces[-1]
        assert last.finished == "eos" and last.tokens[-1] == stop and last.generated == k + 1
        assert all(tr.finished is None for tr in traces[:-1])
        if k > 0:
            produced = len(last.path)  # accepted drafts + the bonus
            assert produced >= len(last.tokens)
            cut_inside += produced > len(last.tokens)
    assert cut_inside >= 5, "the stop token must have fallen inside accepted chunks"


def test_stop_token_as_first_token(tiny):
    ids = tiny_prompt(3)
    first = vanilla(tiny, ids, 40)[0]
    for drafter in (None, LookupDrafter(), RandomDrafter(TINY_VOCAB, "chain", 4)):
        out, traces = run(tiny, ids, drafter=drafter, max_new_tokens=40, stop_ids={first})
        assert out == [first] and len(traces) == 1 and traces[0].finished == "eos" and traces[0].forwards == 0


@pytest.mark.parametrize("n", [1, 2, 3, 17])
def test_max_new_tokens_is_exact(tiny, n):
    ids = tiny_prompt(4)
    ref = vanilla(tiny, ids, 40)
    assert vanilla(tiny, ids, n) == ref[:n]
    drafters = [_deep_oracle(ref), RandomDrafter(TINY_VOCAB, "backbone", 8, 10, 64), LookupDrafter()]
    for drafter in drafters:
        out, traces = run(tiny, ids, drafter=drafter, max_new_tokens=n)
        assert out == ref[:n] and len(out) == n
        assert traces[-1].finished == "length" and traces[-1].generated == n
        assert all(tr.finished is None for tr in traces[:-1])
    # the deep oracle drafts 8 deep, but the last tree only reaches the tokens left: nothing is clipped
    out, traces = run(tiny, ids, drafter=_deep_oracle(ref), max_new_tokens=n)
    if n == 1:
        assert len(traces) == 1 and traces[0].forwards == 0
    else:
        assert len(traces[-1].path) == len(traces[-1].tokens) and len(traces[-1].path) < 9
    for params in (SamplingParams(0.8, 0.9), SamplingParams(1.0)):
        out, _ = run(tiny, ids, drafter=_deep_oracle(ref), max_new_tokens=n, sampling=params, seed=n,
                     stop_ids=set())
        assert len(out) == n


def test_bad_max_new_tokens(tiny):
    with pytest.raises(FastEagleError, match="max_new_tokens"):
        run(tiny, tiny_prompt(0), max_new_tokens=0)


def test_empty_prompt(tiny):
    with pytest.raises(FastEagleError, match="empty"):
        chat_prompt_ids(tiny, "  ")


def test_sync_phases_waits_for_the_device_after_the_draft_and_after_extend(tiny, monkeypatch):
    from fasteagle import generate as gen

    calls = []
    monkeypatch.setattr(gen, "synchronize", lambda dev: calls.append(dev))
    ids = tiny_prompt(2)
    plain = len(run(tiny, ids, drafter=LookupDrafter(), max_new_tokens=6, stop_ids=set())[1]), len(calls)
    calls.clear()
    steps = len(run(tiny, ids, drafter=LookupDrafter(), max_new_tokens=6, stop_ids=set(), sync_phases=True)[1])
    assert steps == plain[0] and len(calls) == plain[1] + 2 * (steps - 1)


@pytest.mark.parametrize("ids", [torch.zeros(0, dtype=torch.long), torch.tensor([[1, 5, 7]])])
def test_input_ids_must_be_one_non_empty_row(tiny, ids):
    with pytest.raises(FastEagleError, match="1-D"):
        run(tiny, ids, max_new_tokens=4)


def test_no_tree_node_is_deeper_than_the_tokens_left(tiny):
    """A node below the tokens still to emit can never count: the last steps draft shallower trees."""
    ids = tiny_prompt(3)
    ref = vanilla(tiny, ids, 20)
    out, traces = run(tiny, ids, drafter=_deep_oracle(ref), max_new_tokens=20)
    assert out == ref
    for before, tr in zip(traces, traces[1:]):
        assert max(tr.tree["depths"]) <= 20 - before.generated - 1
        assert all(0 <= p < i for i, p in enumerate(tr.tree["parents"]) if i)
    assert max(traces[-1].tree["depths"]) < max(traces[1].tree["depths"])


def test_greedy_lossless_up_to_the_models_last_position_with_dynamic_rope():
    """A dynamic RoPE rescales a whole forward once any position passes max_position_embeddings: a
    tree reaching past the model's last position would change the accepted rows' keys too."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fasteagle.target import Target
    from tests.conftest import tiny_tokenizer

    torch.manual_seed(1)
    max_pos = 64
    cfg = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=max_pos,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0})
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(10)
            layer.self_attn.k_proj.weight.mul_(10)
    target = Target(model=model, tokenizer=tiny_tokenizer(), name="tiny-dynamic-rope")
    for seed in range(4):
        ids = tiny_prompt(seed)
        n = max_pos - ids.numel()  # the reply fills the model's positions
        ref = run(target, ids, max_new_tokens=n, stop_ids=set())[0]
        drafter = OracleDrafter(ref, TINY_VOCAB, depth=8, corrupt=0.3, seed=seed)
        out, traces = run(target, ids, drafter=drafter, max_new_tokens=n, stop_ids=set())
        assert out == ref, f"seed {seed}"
        for before, tr in zip(traces, traces[1:]):  # the deepest node's position stays below max_pos
            assert ids.numel() + before.generated - 1 + max(tr.tree["depths"]) < max_pos


# -- context overflow --------------------------------------------------------------------------------

class _Spy(RandomDrafter):
    def reset(self, capacity):
        super().reset(capacity)
        self.resets = getattr(self, "resets", 0) + 1


def test_context_overflow_is_raised_before_any_work(tiny):
    max_pos = tiny.model.config.max_position_embeddings
    ids = torch.randint(4, TINY_VOCAB, (max_pos - 10,), generator=torch.Generator().manual_seed(0))
    spy = _Spy(TINY_VOCAB)
    spy.resets = 0
    gen = generate(tiny, ids, drafter=spy, max_new_tokens=11)
    with pytest.raises(FastEagleError) as info:
        next(gen)  # nothing is yielded: the check comes before the prefill
    msg = str(info.value)
    assert "context too long" in msg and f"{max_pos - 10} prompt + 11 new tokens" in msg and str(max_pos) in msg
    assert spy.resets == 0
    out, _ = run(tiny, ids, max_new_tokens=10)  # exactly at the limit is fine
    assert len(out) == 10


def test_too_small_capacity_is_raised_before_any_work(tiny):
    ids = tiny_prompt(5)
    with pytest.raises(ContextOverflowError, match="capacity") as info:
        next(generate(tiny, ids, max_new_tokens=30, capacity=ids.numel() + 10))
    assert isinstance(info.value, FastEagleError)


def test_trees_that_do_not_fit_the_cache_are_trimmed(tiny):
    """A tight cache (or a tree larger than the room left) must not kill a run halfway."""
    ids = tiny_prompt(5)
    ref = vanilla(tiny, ids, 30)
    for drafter in (RandomDrafter(TINY_VOCAB, "chain", 8), _deep_oracle(ref),
                    RandomDrafter(TINY_VOCAB, "backbone", 8, 10, 64)):
        out, traces = run(tiny, ids, drafter=drafter, max_new_tokens=30, capacity=ids.numel() + 30)
        assert out == ref
    out, traces = run(tiny, ids, drafter=RandomDrafter(TINY_VOCAB, "backbone", 8, 10, 64), max_new_tokens=30,
                      tree_room=8)
    assert out == ref
    sizes = [len(tr.tree["tokens"]) for tr in traces[1:]]
    assert max(sizes) <= 38 and min(sizes) < 64, sizes  # the 64-node trees were cut to the room left


# -- traces --------------------------------------------------------------------------------------------

def test_step_traces_are_consistent_and_round_trip_json(tiny):
    ids = tiny_prompt(6)
    ref = vanilla(tiny, ids, 40)
    drafter = OracleDrafter(ref, TINY_VOCAB, "backbone", 6, 4, 20, seed=1, corrupt=0.2, side=0.3)
    out, traces = run(tiny, ids, drafter=drafter, max_new_tokens=40)
    assert out == ref
    assert traces[0].step == 0 and traces[0].tree is None and traces[0].draft_tree() is None
    assert traces[0].tokens == [ref[0]] and traces[0].token_depths == [0]
    generated = 1
    for i, tr in enumerate(traces[1:], start=1):
        tree = tr.draft_tree()
        assert isinstance(tree, DraftTree)
        drafted = drafter.trees[i - 1]  # the verified tree: the drafted one, to the depth of the tokens left
        drafted = select(drafted, drafted.depths <= 40 - generated - 1)
        assert torch.equal(tree.tokens, drafted.tokens)
        assert torch.equal(tree.ancestors, drafted.ancestors)
        assert tr.step == i and tr.forwards == i
        assert len(tr.status) == len(tr.target_probs) == tree.size
        assert [j for j, s in enumerate(tr.status) if s == ACCEPTED] == tr.path
        assert tr.path[0] == 0 and all(tree.parents[b] == a for a, b in zip(tr.path, tr.path[1:]))
        drafted = [tr.tree["tokens"][j] for j in tr.path[1:]]
        assert tr.tokens[:-1] == drafted[: len(tr.tokens) - 1]
        assert tr.token_depths == list(range(1, len(tr.tokens))) + [0] or tr.finished
        generated += len(tr.tokens)
        assert tr.generated == generated
        assert tr.tau == pytest.approx((generated - 1) / i)
    assert traces[-1].finished == "length" and generated == 40
    assert "".join(tr.text for tr in traces) == tiny.tokenizer.decode(out, skip_special_tokens=True)
    for tr in traces:
        d = json.loads(json.dumps(tr.to_dict()))
        assert d["tau"] == pytest.approx(tr.tau)
        back = StepTrace.from_dict(d)
        assert back == tr
        if tr.tree:
            assert back.draft_tree().to_dict() == tr.tree


def test_sampling_runs_are_reproducible(tiny):
    ids = tiny_prompt(7)
    params = SamplingParams(0.9, 0.95)
    outs = []
    for make in (lambda: None, lambda: RandomDrafter(TINY_VOCAB, "backbone", 4, 3, 10), LookupDrafter):
        a, _ = run(tiny, ids, drafter=make(), max_new_tokens=24, sampling=params, seed=11, stop_ids=set())
        b, _ = run(tiny, ids, drafter=make(), max_new_tokens=24, sampling=params, seed=11, stop_ids=set())
        assert a == b and len(a) == 24
        outs.append(a)
    c, _ = run(tiny, ids, max_new_tokens=24, sampling=params, seed=12, stop_ids=set())
    assert c != outs[0], "the seed must matter"


def test_generator_can_be_resumed_on_another_thread(tiny):
    """Gradio resumes streaming handlers on any worker thread; inference mode must not leak
    across yields (it is per thread)."""
    import threading

    from fasteagle.generate import generate
    from fasteagle.lookup import LookupDrafter

    ids = torch.randint(4, 320, (10,))
    want, _ = run(tiny, ids, drafter=LookupDrafter(), max_new_tokens=20)
    it = generate(tiny, ids, drafter=LookupDrafter(), max_new_tokens=20)
    got, errors = list(next(it).tokens), []

    def rest():
        try:
            for tr in it:
                got.extend(tr.tokens)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    t = threading.Thread(target=rest)
    t.start()
    t.join()
    assert not errors and got == want


class _ExactDrafter(_ProtocolDrafter):
    """Drafts the tiny target's own likely tokens (from `tests.test_verify.Exact`), side branches first
    and a depth-2 node below the likeliest, so sampled steps accept at depth 1 and 2 and reject too."""

    def __init__(self, exact):
        self.exact = exact
        super().__init__(TINY_VOCAB)

    def _draft(self, root: int) -> DraftTree:
        emitted, e = self.history[self.prompt_len:] + [root], self.exact
        if len(emitted) == 1:  # root = token 1: children from p(token 2 | token 1)
            b = e.p2[root].argsort(descending=True).tolist()
            e.need_p3([(root, b[0])])
            c = e.p3[(root, b[0])].argsort(descending=True).tolist()
            return make_tree(torch.tensor([root, b[1], b[0], b[2], c[0], c[1]]), torch.tensor([-1, 0, 0, 0, 2, 2]))
        if len(emitted) == 2:  # root = token 2: children from p(token 3 | tokens 1, 2)
            e.need_p3([tuple(emitted)])
            c = e.p3[tuple(emitted)].argsort(descending=True).tolist()
            return make_tree(torch.tensor([root, c[1], c[0]]), torch.tensor([-1, 0, 0]))
        return root_only(root)


def test_sampled_decoding_keeps_the_targets_distribution_end_to_end(tiny):
    """`tests/test_verify.py` checks one verification; this samples whole decodes through `generate`
    (the prefill's sampled token, a tree rooted at it, the bonus, the next step's tree) and compares
    the first three tokens with the target's exact joint distribution (chi-square, alpha 1e-3).
    Checked to fail for an acceptance rule that accepts every possible candidate (chi-square 2659
    against a critical value of 92, and no depth-2 acceptance)."""
    from tests.test_verify import PREFIX, ROOT, Bins, Exact

    n, params = 2000, SamplingParams(0.8, 1.0)
    exact = Exact(tiny.model, params.temperature, params.top_p)
    bins = Bins(exact, n)
    prompt, drafter = torch.cat([PREFIX, torch.tensor([ROOT])]), _ExactDrafter(exact)
    counts, accepted = Counter(), Counter()
    for seed in range(n):
        out, traces = run(tiny, prompt, drafter=drafter, max_new_tokens=4, sampling=params, seed=seed, stop_ids=set())
        a, b, c = out[:3]
        counts[bins.key(a, b, c if (a, b) in bins.pairs else None)] += 1
        accepted.update(len(tr.tokens) - 1 for tr in traces[1:])
    assert accepted[1] > 300 and accepted[2] > 15, accepted  # depth 1 and depth 2 really accepted
    stat, crit, dof = bins.chi_square(counts, n)
    assert dof >= 40 and stat < crit, f"chi-square {stat:.1f} >= {crit:.1f} (dof {dof}): not the target's distribution"


def test_the_trace_ends_where_a_stop_token_ends_the_reply(tiny):
    """A stop token drafted inside an accepted chunk ends the reply there: the trace's path, verdicts
    and bonus stop with it (nodes below it were judged by the target, but no reply reaches them), so
    tau, per-depth acceptance and the picture all count what was emitted."""
    from fasteagle import trace as T

    ids = torch.tensor([1, 5, 9, 12, 3, 1, 6])
    ref = [t for tr in generate(tiny, ids, max_new_tokens=24, stop_ids=set()) for t in tr.tokens]
    stop = ref[6]
    cut = ref[:ref.index(stop) + 1]
    drafter = OracleDrafter(ref, TINY_VOCAB, "chain", depth=8, corrupt=0.0)
    traces = list(generate(tiny, ids, drafter=drafter, max_new_tokens=24, stop_ids={stop}))
    last = traces[-1]
    assert [t for tr in traces for t in tr.tokens] == cut and last.finished == "eos"
    drafts = sum(d > 0 for d in last.token_depths)
    assert last.token_depths[-1] > 0, "the oracle drafts the stop token; the setup must make it a drafted one"
    assert len(last.path) - 1 == drafts and last.bonus == -1
    depths = last.tree["depths"]
    assert all(v == T.NEVER_REACHED for v, d in zip(last.status, depths) if d > drafts)
    assert sum(v == T.ACCEPTED for v in last.status) == drafts + 1  # the root counts as accepted
    assert T.accepted_lengths(traces)[-1] == drafts
    assert last.tau == pytest.approx(sum(T.step_lengths(traces)) / last.forwards)

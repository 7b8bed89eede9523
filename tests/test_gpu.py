"""The engine, the bench helpers and the trainer on a GPU, with the tiny in-process target: every
decoding method lossless on CUDA, sampling runs, and a training run (self-distillation, online
teacher, feature cache, continuing a drafter) writes a drafter that stays lossless.

Skipped without CUDA. `FASTEAGLE_TEST_DEVICE=cpu` runs the same checks on the CPU (to try this file
where no GPU is lent); the rest of the suite covers the CPU in depth.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from fasteagle import bench
from fasteagle.cli import make_drafter
from fasteagle.drafter import CascadedDrafter, DrafterConfig
from fasteagle.eagle3 import AutoregressiveDrafter
from fasteagle.generate import run
from fasteagle.train.config import TrainConfig
from fasteagle.train.data import save_token_dataset
from fasteagle.train.trainer import train
from fasteagle.verify import SamplingParams
from tests.conftest import tiny_target
from tests.train.test_trainer import self_written

DEVICE = os.environ.get("FASTEAGLE_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE is None, reason="no CUDA device (FASTEAGLE_TEST_DEVICE=cpu "
                                                                          "runs these checks on the CPU)")]
METHODS = ("fasteagle", "eagle3", "lookup", "fasteagle+lookup", "fasteagle-backbone", "fasteagle-eager",
           "fasteagle-host-tree")
PROMPTS = [{"id": "a", "text": "w7 w8 w9 w10 w7 w8", "category": "chat"},
           {"id": "b", "text": "w11 w12 w13 w11 w12", "category": "code"}]


@pytest.fixture(scope="module")
def gpu():
    target = tiny_target()
    target.model.to(DEVICE)
    return target


@pytest.fixture(scope="module")
def args(gpu, tmp_path_factory):
    """Untrained drafters saved to disk and loaded the way the CLI loads them."""
    tmp = tmp_path_factory.mktemp("drafters")
    cfg = DrafterConfig.for_target(gpu.model, gpu.name, num_layers=3, intermediate=64)
    CascadedDrafter(cfg).save(tmp / "fe")
    AutoregressiveDrafter(AutoregressiveDrafter.config_for(cfg, 4)).save(tmp / "e3")
    return SimpleNamespace(drafter=str(tmp / "fe"), eagle3_drafter=str(tmp / "e3"), tree_k="4", tree_budget=16,
                           tree_shape=None, draft_int8=None)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_is_lossless_on_the_device(gpu, args, method):
    prompt = torch.tensor([250, 75, 140, 53, 117, 277], device=DEVICE)  # a reply that repeats itself
    want, _ = run(gpu, prompt, max_new_tokens=24, stop_ids=set())
    got, traces = run(gpu, prompt, drafter=make_drafter(method, gpu, args), max_new_tokens=24, stop_ids=set())
    assert got == want
    if "lookup" in method:  # the untrained drafters accept nothing: lookup's copies must be accepted, so that
        # multi-node paths are committed on the device (and fed to the cascade's step beside it)
        assert traces[-1].tau > 1.3 and max(len(t.path) for t in traces[1:]) > 2, [len(t.path) for t in traces]
    sampled, _ = run(gpu, prompt, drafter=make_drafter(method, gpu, args), max_new_tokens=24, stop_ids=set(),
                     sampling=SamplingParams(0.7, 0.9), seed=3)
    assert len(sampled) == 24 and all(0 <= t < 320 for t in sampled)


@pytest.fixture(scope="module")
def gpu_bf16():
    """The tiny target in bf16, the dtype a GPU loads by default."""
    target = tiny_target()
    target.model.to(DEVICE, torch.bfloat16)
    return target


@pytest.mark.parametrize("method", ("fasteagle", "eagle3", "fasteagle+lookup"))
def test_every_drafter_follows_vanilla_in_bf16_on_the_device(gpu_bf16, args, method):
    """bf16 rounds a tree's forward differently from a one-token step, so a reply may part from
    vanilla's, but only where the target's top two logits tie to within bf16's rounding."""
    prompt = torch.tensor([250, 75, 140, 53, 117, 277], device=DEVICE)  # a reply that repeats itself
    want, _ = run(gpu_bf16, prompt, max_new_tokens=24, stop_ids=set())
    got, traces = run(gpu_bf16, prompt, drafter=make_drafter(method, gpu_bf16, args), max_new_tokens=24,
                      stop_ids=set())
    assert len(got) == 24
    if "lookup" in method:  # lookup's copies are accepted: multi-node paths committed in bf16 too
        assert traces[-1].tau > 1.3 and max(len(t.path) for t in traces[1:]) > 2, [len(t.path) for t in traces]
    parted = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if parted is not None:
        with torch.no_grad():
            ids = torch.cat([prompt, torch.tensor(want[:parted], device=DEVICE)])[None]
            logits = gpu_bf16.model(ids).logits[0, -1].float()
        first, second = logits.topk(2).values.tolist()
        assert first - second <= 0.02 * abs(first)


def test_the_drafter_step_replays_as_a_cuda_graph(gpu, args):
    """On a GPU the cascade's step is a CUDA graph by default (`fasteagle.draftgraph`): greedy replies
    identical to vanilla decoding (as the dynamic step's), sampling runs, and one capture per drafter
    serves later sequences. On the CPU the same fixed-shape step runs eagerly."""
    mode = "graph" if torch.device(DEVICE).type == "cuda" else "static"
    prompt = torch.tensor([5, 7, 9, 11, 7, 9], device=DEVICE)
    want, _ = run(gpu, prompt, max_new_tokens=24, stop_ids=set())
    drafters = {m: make_drafter("fasteagle", gpu, args) for m in ("dynamic", mode)}
    drafters["dynamic"].step_mode = "dynamic"
    assert drafters[mode].state.mode() == mode or mode == "static"
    drafters[mode].step_mode = mode
    for d in drafters.values():
        assert run(gpu, prompt, drafter=d, max_new_tokens=24, stop_ids=set())[0] == want
        # sampled: the trees may differ in the last bits (the graph attends over its whole buffer)
        sampled, _ = run(gpu, prompt, drafter=d, max_new_tokens=24, stop_ids=set(), sampling=SamplingParams(0.7, 0.9),
                         seed=3)
        assert len(sampled) == 24 and all(0 <= t < 320 for t in sampled)
    step = drafters[mode].state.step
    assert step is not None and step.length > 0
    if mode == "graph":
        graph = step._graph
        assert graph is not None and step.tree_spec is not None  # the graph builds the tree too
        run(gpu, prompt, drafter=drafters[mode], max_new_tokens=24, stop_ids=set())
        assert drafters[mode].state.step._graph is graph  # captured once, replayed ever since


def test_the_graph_builds_the_hosts_tree(gpu, args, monkeypatch):
    """The product tree built inside the step (the default with a graph) against the host's heap
    (FASTEAGLE_DEVICE_TREE=0): the same trees step by step, the same greedy reply."""
    prompt = torch.tensor([5, 7, 9, 11, 7, 9], device=DEVICE)
    mode = "graph" if torch.device(DEVICE).type == "cuda" else "static"
    replies = {}
    for on in ("1", "0"):
        monkeypatch.setenv("FASTEAGLE_DEVICE_TREE", on)
        d = make_drafter("fasteagle", gpu, args)
        d.step_mode = mode
        d.tree_on_device = None if mode == "graph" else on == "1"
        replies[on] = run(gpu, prompt, drafter=d, max_new_tokens=24, stop_ids=set())
        assert (d.state.step.tree_spec is not None) == (on == "1")
    assert replies["1"][0] == replies["0"][0]
    assert [t.tree for t in replies["1"][1][1:]] == [t.tree for t in replies["0"][1][1:]]


def test_bench_runs_every_method_on_the_device(gpu, args):
    methods = {m: None if m in bench.HF_METHODS else make_drafter(m, gpu, args)
               for m in ("vanilla", "hf-generate", "hf-prompt-lookup", "eagle3", "fasteagle", "fasteagle+lookup")}
    doc = bench.result_document(gpu, bench.compare(gpu, methods, PROMPTS, max_new=12),
                                {"max_new_tokens": 12, "temperature": 0.0})
    assert all(m["identical_to_vanilla"] == len(PROMPTS) for m in doc["methods"].values())
    assert doc["device"] == bench.device_name(torch.device(DEVICE))
    assert bench.auto_tree(gpu, make_drafter("fasteagle", gpu, args), PROMPTS[:1])["budget"] >= 2
    assert set(bench.verify_cost(gpu, (1, 8))["ms"]) == {"1", "8"}
    step = bench.draft_step_cost("smollm2-135m", (2,), device=DEVICE, reps=1)
    assert step["ms"]["2"]["fasteagle"] > 0
    assert ("fasteagle_graph" in step["ms"]["2"]) == (torch.device(DEVICE).type == "cuda")


def test_training_on_the_device_writes_a_lossless_drafter(gpu, tmp_path):
    save_token_dataset(self_written(gpu, 24, seed=1), tmp_path / "train.pt")
    save_token_dataset(self_written(gpu, 6, seed=2), tmp_path / "holdout.pt")
    common = dict(data=str(tmp_path / "train.pt"), holdout_data=str(tmp_path / "holdout.pt"), num_layers=3,
                  intermediate=96, topk=8, batch_tokens=400, warmup=5, lr=3e-3, eval_sequences=6, distill=True,
                  distill_max_new=20, distill_batch=8)
    first = train(TrainConfig(out=str(tmp_path / "online"), max_steps=40, shard_mb=0.05, **common), target=gpu)
    assert len(list(first.glob("model-*.safetensors"))) > 1  # sharded for transports with a per-file limit
    ev = json.loads((first / "eval.json").read_text())
    assert ev["holdout"]["tau_backbone"] > ev["holdout_initial"]["tau_backbone"]
    second = train(TrainConfig(out=str(tmp_path / "cache"), max_steps=10, features="cache", micro_batch=4,
                               init_from=str(first), **common), target=gpu)
    drafter = CascadedDrafter.load(second, gpu.model)
    assert drafter.info["training"]["steps_all"] == 50
    prompt = torch.tensor([5, 7, 9, 11, 7, 9], device=DEVICE)
    assert run(gpu, prompt, drafter=drafter, max_new_tokens=20, stop_ids=set())[0] == \
        run(gpu, prompt, max_new_tokens=20, stop_ids=set())[0]


def test_a_whole_vocab_loss_recomputes_its_logits_on_the_device(gpu):
    """A big head's loss recomputes each depth's logits in the backward, under the trainer's bf16
    autocast too: the same loss and gradients as keeping the logits."""
    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(gpu.model, gpu.name, num_layers=3, intermediate=64)
    d = CascadedDrafter(cfg).attach(gpu.model).to(DEVICE).train()
    ids = torch.randint(4, 320, (2, 16), device=DEVICE)
    with torch.no_grad():
        out = gpu.model(input_ids=ids, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i] for i in cfg.feature_layers], -1)
    t_ids = torch.randint(4, 320, (2, 16, 4), device=DEVICE)
    t_p = torch.softmax(torch.randn(2, 16, 4, device=DEVICE), -1)
    mask = torch.ones(2, 16, device=DEVICE)
    cuda = torch.device(DEVICE).type == "cuda"
    results = []
    for lean in (False, True):
        d.zero_grad()
        d.LEAN_LOSS_ELEMENTS = 0 if lean else 1 << 40
        with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16, enabled=cuda):
            loss, _ = d.loss(feats, ids, mask, t_ids, t_p)
        loss.backward()
        results.append((float(loss.detach()), {n: p.grad.clone() for n, p in d.named_parameters()
                                               if p.grad is not None}))
    (l0, g0), (l1, g1) = results
    assert l0 == pytest.approx(l1, rel=1e-4) and g0.keys() == g1.keys()
    for n in g0:
        torch.testing.assert_close(g0[n], g1[n], rtol=1e-3, atol=1e-5)


def test_the_targets_attention_folds_grouped_heads_on_the_device(args):
    """load_target's attention (`fasteagle.target.sdpa`; on a GPU the folded `grouped_sdpa`): the same
    tree logits as stock SDPA on the device, and speculative decoding through it stays lossless."""
    from fasteagle.kvcache import KVCache
    from fasteagle.target import SDPA, _register_attention
    from fasteagle.tree import make_tree, path_tree
    from fasteagle.verify import tree_forward

    _register_attention()
    stock, ours = tiny_target(attn="sdpa"), tiny_target(attn=SDPA)
    tree = make_tree(torch.arange(50, 62), torch.tensor([-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 6, 9])).to(DEVICE)
    logits = []
    with torch.inference_mode():
        for t in (stock, ours):
            t.model.to(DEVICE)
            cache = KVCache.for_model(t.model, 64)
            tree_forward(t.model, cache, path_tree(torch.arange(10, 40, device=DEVICE)))
            cache.keep(torch.arange(30, device=DEVICE))
            logits.append(tree_forward(t.model, cache, tree)[0])
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    prompt = torch.tensor([5, 7, 9, 11, 7, 9], device=DEVICE)
    want, _ = run(ours, prompt, max_new_tokens=24, stop_ids=set())
    got, _ = run(ours, prompt, drafter=make_drafter("fasteagle", ours, args), max_new_tokens=24, stop_ids=set())
    assert got == want

"""vLLM as a second engine: the version check, an `LLM` with this project's defaults, and the
speculative-decoding counters it keeps, read the way our traces count.

    llm = engine(target_dir, method="eagle3", drafter=DIR, k=3)   # vllm.LLM, greedy-ready
    outs = generate(llm, prompt_ids, max_new_tokens=64)           # token ids per prompt
    acceptance(counters(llm))                                     # {"drafts", "tau", "per_position", ...}

vLLM is an extra (requirements-vllm.txt): nothing else in the package imports it. Its CPU worker binds
one core and keeps the other for the engine's own process on a 2-core machine, so its timings are
one-thread timings (compare engines at equal threads).
"""

from __future__ import annotations

import os
from pathlib import Path

from fasteagle.errors import FastEagleError

SUPPORTED = ("0.32.",)  # the vLLM releases this code was written against (its EAGLE-3 path and metrics)
# our methods vLLM runs (bench --engine vllm, serve); the cascades run through our plugin (fasteagle.vllm_plugin),
# each with its own drafter
METHODS = ("vanilla", "eagle3", "fasteagle", "fasteagle-equal", "dflash", "peagle", "ngram")
CASCADES = ("fasteagle", "fasteagle-equal")
DRAFTED = ("eagle3", "dflash", "peagle", *CASCADES)  # the methods whose drafter (ours, exported) vLLM loads


def require_vllm():
    """vLLM, imported, or one line saying why not: absent, a release this code was not written for, or a
    torchvision it cannot load (PyPI's CUDA build beside a CPU torch)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise FastEagleError("vLLM is not installed: python -m pip install -r requirements-vllm.txt")
    _check_vision_packages()
    import vllm

    if not vllm.__version__.startswith(SUPPORTED):
        raise FastEagleError(f"vLLM {vllm.__version__} is installed; fasteagle's vLLM code was written for "
                             f"{', '.join(v + 'x' for v in SUPPORTED)}: python -m pip install -r requirements-vllm.txt")
    return vllm


def _check_vision_packages() -> None:
    """vLLM imports torchvision (and torchaudio) through transformers at start-up: a build that cannot load
    against this torch fails there with a long traceback. Say so in one line instead."""
    import importlib
    import importlib.util

    for name in ("torchvision", "torchaudio"):
        if importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except (RuntimeError, OSError, ImportError) as exc:
            detail = str(exc).strip().splitlines()[-1][:120]
            raise FastEagleError(f"{name} cannot load against this torch ({detail}), and vLLM imports it: a CUDA "
                                 "build beside a CPU torch. Text models never use it: python -m pip uninstall -y "
                                 "torchvision torchaudio torchcodec") from None


def target_dir(target: str | None) -> str:
    """What vLLM loads for `target` (None: the default model's converted folder, made on first use)."""
    from fasteagle.target import resolve_target_path

    return resolve_target_path(target)


NO_AUX_STATES = ("mixtral", "olmoe", "qwen2_moe", "gemma2", "gemma3_text")  # vLLM 0.32: no SupportsEagle3


def check_drafted_family(target, methods: list[str]) -> None:
    """One line where vLLM cannot run a method's drafter on this target's family: EAGLE-3's path (ours and
    the cascade's) needs the auxiliary hidden states, which vLLM 0.32's models of these families do not
    expose. Our engine drafts for them (python -m fasteagle generate / bench). `target`: a loaded target's
    model config, or the target's name (its config.json is read only if a method drafts)."""
    drafted = [m for m in methods if m in DRAFTED]
    if not drafted:
        return
    if isinstance(target, str) or target is None:
        from transformers import AutoConfig

        target = AutoConfig.from_pretrained(target_dir(target))
    kind = target.model_type
    if kind in NO_AUX_STATES:
        raise FastEagleError(f"vLLM 0.32's {kind} model exposes no auxiliary hidden states to EAGLE-3's path, so "
                             f"it cannot run {drafted[0]} on this target: our engine only (python -m fasteagle "
                             f"generate --method {drafted[0]} --target ...)")


def speculative_config(method: str, drafter: str | Path | None, k: int) -> dict | None:
    """vLLM's `speculative_config` for one of METHODS drafting a chain of k tokens (`drafter`: an exported
    folder for eagle3, the cascades, dflash and peagle)."""
    if method == "vanilla":
        return None
    if method in DRAFTED:
        if drafter is None:
            raise FastEagleError(f"vLLM's {method} needs an exported drafter (python -m fasteagle export)")
        depth = _drafter_depth(drafter)
        if depth and k > depth:
            raise FastEagleError(f"this drafter drafts {depth} tokens per forward (a cascade's layers, a DFlash "
                                 f"block's masks, parallel EAGLE's trained chain); k={k} is more")
        if method == "dflash":  # stock vLLM's block diffusion drafter: [bonus, mask x k] in one forward
            return {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k}
        spec = {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k}
        # a cascade and parallel EAGLE run in EAGLE-3's path, all k depths in one forward (fasteagle.vllm_cascade,
        # stock vLLM's `mask_hidden` rows)
        return spec if method == "eagle3" else spec | {"parallel_drafting": True}
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    raise FastEagleError(f"vLLM runs {', '.join(METHODS)} here, not {method!r}")


def _drafter_depth(drafter: str | Path) -> int | None:
    """The depths a drafter we exported drafts in one forward (`fasteagle_depth`: a cascade's layers, a DFlash
    block's masks, parallel EAGLE's chain), None where the folder does not say (an EAGLE-3 checkpoint drafts one
    per forward)."""
    import json

    config = Path(drafter) / "config.json"
    raw = json.loads(config.read_text()) if config.is_file() else {}
    return raw.get("fasteagle_depth") if raw.get("fasteagle_kind") else None


def context_for(prompts: list[list[int]], max_new: int, k: int) -> int:
    """The max_model_len an engine needs for `prompts`: 2,048 unless the longest prompt, its reply and a draft
    of k need more, then that rounded up to a multiple of 256 (held-out documents run to 2,083 tokens)."""
    need = max(map(len, prompts), default=0) + max_new + k + 1
    return max(2048, -(-need // 256) * 256)


def engine(target: str | None, method: str = "vanilla", drafter: str | Path | None = None, k: int = 3,
           dtype: str = "float32", max_model_len: int = 2048, seed: int = 0, detailed: bool = False, **options):
    """A `vllm.LLM` for the target with `method`'s speculative decoding; fp32 and eager by default, so that
    its greedy output can be held to ours token for token. Its statistics are on (`counters`); `detailed`:
    each request also keeps its accepted and drafted tokens per step (`steps_of`); `options` go to vLLM as
    they are (prefix caching, no tokenizer, an n-gram config of its own: `fasteagle.bench.vllm_costs`)."""
    vllm = require_vllm()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vLLM's CPU default takes far more
    spec = options.pop("speculative_config", None) or speculative_config(method, drafter, k)
    return vllm.LLM(model=target_dir(target), dtype=dtype, enforce_eager=True, max_model_len=max_model_len,
                    seed=seed, speculative_config=spec, disable_log_stats=False,
                    per_request_spec_decode_metrics="detailed" if detailed and spec else "none", **options)


def generate_outputs(llm, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0) -> list:
    """vLLM's `RequestOutput` of each prompt, the prompts batched as vLLM schedules them."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, ignore_eos=False)
    return llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)


def generate(llm, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0) -> list[list[int]]:
    """Each prompt's reply as token ids."""
    return [reply(o) for o in generate_outputs(llm, prompts, max_new_tokens, temperature)]


def generate_timed(llm, prompts: list[list[int]], max_new_tokens: int,
                   temperature: float = 0.0) -> tuple[list[list[int]], list[float], float]:
    """`generate`, each request's latency in seconds by vLLM's own clock (queued to last token), and the
    call's prefill: from the first request queued to the last one's first token."""
    outs = generate_outputs(llm, prompts, max_new_tokens, temperature)
    prefill = max(o.metrics.first_token_ts for o in outs) - min(o.metrics.queued_ts for o in outs)
    return [reply(o) for o in outs], [latency(o) for o in outs], prefill


def reply(out) -> list[int]:
    """A request's reply as token ids."""
    return list(out.outputs[0].token_ids)


def latency(out) -> float:
    """A request's time in vLLM, queued to last token (its engine's own clock)."""
    return out.metrics.last_token_ts - out.metrics.queued_ts


def steps_of(out) -> tuple[list[int], list[int]]:
    """A request's accepted and drafted tokens at each verify step (an engine made with `detailed`)."""
    m = out.outputs[0].spec_decode_metrics
    return (list(m.per_step_accepted), list(m.per_step_drafted)) if m is not None else ([], [])


def counters(llm) -> dict:
    """vLLM's speculative-decoding counters since start-up: drafts (verify steps that had a draft), draft
    tokens, accepted tokens, and accepted tokens at each draft position."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_position": []}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_position"] = [int(v) for v in m.values]
        elif m.name in names:
            out[names[m.name]] = int(getattr(m, "value", 0))
    return out


def since(after: dict, before: dict) -> dict:
    """The counters between two readings of `counters` (one run's share of an engine's lifetime)."""
    old = before["accepted_per_position"] + [0] * len(after["accepted_per_position"])
    return {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")} | {
        "accepted_per_position": [a - b for a, b in zip(after["accepted_per_position"], old)]}


def acceptance(c: dict) -> dict:
    """Counters as our traces count them: tau (tokens per step, the bonus token included: 1 + accepted /
    drafts) and the acceptance rate at each draft position (accepted there / drafts)."""
    d = c["drafts"]
    return c | {"tau": 1 + c["accepted"] / d if d else 1.0,
                "per_position": [a / d if d else 0.0 for a in c["accepted_per_position"]]}


def close(llm) -> None:
    """Stop the engine's worker process now (a second `LLM` in the same process would wait for its memory)."""
    import gc

    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    gc.collect()

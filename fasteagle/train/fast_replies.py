"""Self-distillation through vLLM: the target's replies to many prompts at once, by vLLM's continuous
batching (`--distill-engine vllm`), instead of `teacher.self_distill`'s padded `generate` batches.

Same contract as `self_distill`: prompts visited in `distill_order`, every `sample_every`-th batch of
`batch_size` prompts sampled at temperature 0.7 (the engine seeded), the rest greedy, replies cut after
the first stop token and kept from 4 tokens on; a token dataset with the loss on the reply. Only the
replies come from vLLM: the teacher's features and top-k are then computed by our own forward over the
finished sequences (`teacher.cache_features`), as for conversations as written.
"""

from __future__ import annotations

import time

from tqdm import tqdm

from fasteagle.train.teacher import distill_order

CHUNK = 256  # prompts handed to vLLM at a time: enough to keep its batch full, few enough to honour a time cap


def vllm_replies(target: str | None, tokenizer, prompts: list[list[int]], max_new_tokens: int = 256,
                 batch_size: int = 128, time_budget_s: float | None = None, sample_every: int = 4,
                 seed: int = 0, timing: dict | None = None, max_batches: int | None = None) -> dict:
    """The target's replies to `prompts` made by vLLM (fp32, as ours), as a token dataset that also says
    which engine made it (`engine`); `timing`, if given, gets the engine's start-up and generation seconds.
    `max_batches`: only the prompts our engine's first that many batches would take (`distill_order`)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from fasteagle import vllm_engine as ve

    t0 = time.monotonic()
    llm = _all_cores(lambda: ve.engine(target, "vanilla", seed=seed))
    load_s = time.monotonic() - t0
    stop = [t for t in {tokenizer.eos_token_id, *_eos_ids(llm)} if t is not None]
    order = distill_order([len(p) for p in prompts], batch_size, seed, max_batches)

    def params(pos: int) -> SamplingParams:
        sampled = bool(sample_every) and (pos // batch_size) % sample_every == sample_every - 1
        # no per-request seed: vLLM's CPU sampler refuses one ("CPU Generator does not use offset"); the
        # engine's own seed makes a run repeatable
        return SamplingParams(max_tokens=max_new_tokens, temperature=0.7 if sampled else 0.0, stop_token_ids=stop)

    data = {"input_ids": [], "loss_mask": [], "prompt_ids": [], "ids": []}
    t0 = time.monotonic()
    try:
        for start in tqdm(range(0, len(order), CHUNK), desc="self-distill (vLLM)"):
            if time_budget_s and time.monotonic() - t0 > time_budget_s:
                break
            chunk = order[start:start + CHUNK]
            outs = llm.generate([TokensPrompt(prompt_token_ids=list(prompts[i])) for i in chunk],
                                [params(start + j) for j in range(len(chunk))], use_tqdm=False)
            for i, o in zip(chunk, outs):
                out = ve.reply(o)
                if len(out) < 4:
                    continue
                data["input_ids"].append(list(prompts[i]) + out)
                data["loss_mask"].append([0] * len(prompts[i]) + [1] * len(out))
                data["prompt_ids"].append(list(prompts[i]))
                data["ids"].append(str(i))
    finally:
        if timing is not None:
            timing.update(load_s=load_s, generate_s=time.monotonic() - t0)
        ve.close(llm)
    return data | {"engine": f"vllm {ve.require_vllm().__version__}"}


def _eos_ids(llm) -> list[int]:
    """The target's own stop ids (its generation config may name several)."""
    eos = getattr(llm.llm_engine.model_config.hf_config, "eos_token_id", None)
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


def _all_cores(make):
    """`make()` with vLLM's CPU worker on every core: for serving, vLLM leaves one core of a small machine to
    its engine process, but offline generation keeps that process idle (measured on 2 cores: 24 replies in
    30 s instead of 51 s; docs/training.md). Benchmarks that compare engines at equal threads do not use this.
    The engine's wait on one model step is lifted from vLLM's 5 minutes to a day: a long data run is paused
    (SIGSTOP) while anything is timed, and a pause longer than that wait killed the engine."""
    import os

    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "86400"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: v for k, v in env.items() if old[k] is None})
    try:
        return make()
    finally:
        for k in env:
            if old[k] is None:
                os.environ.pop(k, None)


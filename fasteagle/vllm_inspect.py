"""A running vLLM server's acceptance, request by request (`python -m fasteagle inspect --server URL`).

vLLM 0.32's OpenAI server reports per chat completion, when started with `--per-request-spec-decode-metrics
detailed` (and `--enable-per-request-metrics` for the timings), `metrics.speculative_decoding`: the drafts
made and accepted at each verify step (`per_step_drafted`, `per_step_accepted`), `mean_acceptance_length`
and `acceptance_histogram`. Those cover only the steps that drafted: the scheduler records nothing for a
step without drafts (most of n-gram's), and never the rejected tokens. So each request is streamed
(`return_token_ids`: each chunk carries its new token ids; one chunk per engine step at the default
stream interval of 1) and the chunks place the steps: a chunk of one token that the step list does not
explain is a step that drafted nothing, and each chunk's arrival times its step.

Read from vLLM's source (`vllm/entrypoints/openai/chat_completion/serving.py`, `v1/core/sched/scheduler.py`,
`v1/engine/output_processor.py`): the metrics come only on the stream's last chunk, with
`stream_options.include_usage`; a client that falls behind gets several steps merged into one chunk
(`RequestOutputCollector`), which this reader detects (a chunk the steps cannot explain) and marks
(`stream_merged`), the counts then still exact from the arithmetic (every undrafted step emits one token),
only the placement and timing of those steps lost. A drafted step that accepted nothing and a step that
drafted nothing both emit one token: where both could explain a chunk, the drafted step is placed first.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from fasteagle.errors import FastEagleError

PINNED = "0.32"  # the vLLM version whose per-request fields this reader was written against
FLAGS = "--per-request-spec-decode-metrics detailed --enable-per-request-metrics"


class Refused(FastEagleError):
    """The server refused one request (HTTP 4xx: a prompt longer than its context, say): that request is
    skipped and said, the others go on."""


@dataclass
class Reply:
    """One streamed request: its token ids, the chunks' (arrival s after the request, token count), the
    text, and what the server reported."""

    token_ids: list[int] = field(default_factory=list)
    chunks: list[tuple[float, int]] = field(default_factory=list)
    text: str = ""
    spec: dict = field(default_factory=dict)  # metrics.speculative_decoding
    metrics: dict = field(default_factory=dict)  # metrics (timings)
    finish: str | None = None
    prompt_tokens: int = 0


def _get(url: str, timeout: float) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise FastEagleError(f"{url} answered HTTP {exc.code}: is it a vLLM server?") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise FastEagleError(f"cannot reach the vLLM server at {url.rsplit('/', 1)[0]}: {reason}") from None
    except ValueError:
        raise FastEagleError(f"{url} did not answer JSON: is it a vLLM server?") from None


def check_server(base: str, model: str | None, timeout: float = 10.0) -> tuple[str, str, str | None]:
    """(vLLM version, the model to ask for, the model's path on the server) of a reachable server of the
    pinned version, or one line saying what is wrong."""
    base = base.rstrip("/")
    version = str(_get(f"{base}/version", timeout).get("version", ""))
    if not version.startswith(PINNED):
        raise FastEagleError(f"the server at {base} runs vLLM {version or '(unknown)'}; this reader was written for "
                             f"vLLM {PINNED}.x, whose per-request metrics are experimental: use that version")
    served = _get(f"{base}/v1/models", timeout).get("data") or []
    names = {m.get("id"): m.get("root") for m in served if isinstance(m, dict)}
    if model is None:
        if len(names) != 1:
            raise FastEagleError(f"the server at {base} serves {len(names)} models ({', '.join(map(str, names))}): "
                                 "name one with --model")
        model = next(iter(names))
    elif model not in names:
        raise FastEagleError(f"the server at {base} serves {', '.join(map(str, names)) or 'no model'}, not {model!r}")
    return version, model, names[model]


def ask(base: str, model: str, text: str, max_tokens: int, temperature: float, timeout: float = 600.0) -> Reply:
    """Stream one chat completion and keep what the steps need; one line if the server drops it or
    reports no per-request speculative metrics."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": temperature, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
    req = urllib.request.Request(f"{base.rstrip('/')}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    out, done, t0 = Reply(), False, time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:  # server-sent events, one `data: ...` line each
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                _take(out, json.loads(data), time.perf_counter() - t0)
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read().decode("utf-8", "replace"))["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = exc.reason
        cls = Refused if 400 <= exc.code < 500 else FastEagleError
        raise cls(f"the server refused the request (HTTP {exc.code}): {str(detail).splitlines()[0][:300]}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise FastEagleError(f"the server at {base} dropped the connection mid-request ({exc})") from None
    if not done:
        raise FastEagleError(f"the server at {base} dropped the connection mid-request (the stream ended early)")
    if not out.spec or out.spec.get("per_step_accepted") is None and out.spec.get("num_spec_steps"):
        raise FastEagleError(f"the server at {base} reports no per-request speculative decoding metrics: start it "
                             f"with speculative decoding and {FLAGS}")
    return out


def _take(out: Reply, chunk: dict, t: float) -> None:
    if chunk.get("metrics") is not None:
        out.metrics = chunk["metrics"] or {}
        out.spec = out.metrics.get("speculative_decoding") or {}
    if chunk.get("usage"):
        out.prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
    for c in chunk.get("choices") or []:
        ids = c.get("token_ids") or []
        if ids:
            out.token_ids += [int(x) for x in ids]
            out.chunks.append((t, len(ids)))
        out.text += (c.get("delta") or {}).get("content") or ""
        out.finish = c.get("finish_reason") or out.finish


def place(reply: Reply) -> tuple[list[tuple[int, int, int, float]], bool]:
    """The reply's decode steps in order, (tokens emitted, drafts, accepted, ms), and whether the stream
    merged steps. Step j's ms is its chunk's arrival after the previous chunk's."""
    accepted = list(reply.spec.get("per_step_accepted") or [])
    drafted = list(reply.spec.get("per_step_drafted") or [])
    sizes = [n for _, n in reply.chunks]
    times = [t for t, _ in reply.chunks]
    if not sizes:
        return [], False
    # the first chunk is the prefill's token; steps merged into it come after it
    pieces = [(sizes[0] - 1, times[0], times[0])] if sizes[0] > 1 else []
    pieces += [(n, t, prev) for n, t, prev in zip(sizes[1:], times[1:], times[:-1])]
    records, j, merged = [], 0, sizes[0] > 1
    left = len(reply.token_ids) - 1
    for n, t, prev in pieces:
        ms, left_before = 1e3 * (t - prev), left
        left -= n
        if j < len(accepted) and n == min(accepted[j] + 1, left_before):  # the next drafted step (maybe cut at the end)
            records.append((n, drafted[j], accepted[j], ms))
            j += 1
        elif n == 1:
            records.append((1, 0, 0, ms))  # a step that drafted nothing
        else:  # several steps in one chunk: the reader fell behind
            merged = True
            while n > 0:
                if j < len(accepted) and accepted[j] + 1 <= n:
                    records.append((accepted[j] + 1, drafted[j], accepted[j], ms))
                    n -= accepted[j] + 1
                    j += 1
                else:
                    records.append((1, 0, 0, ms))
                    n -= 1
                ms = 0.0
    merged = merged or j < len(accepted)
    return records, merged

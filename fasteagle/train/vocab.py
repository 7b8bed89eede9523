"""Set a trained drafter's compact vocab (the tokens a CPU drafts over) from reply token counts.

`python -m fasteagle.train.vocab DRAFTER --size N --data A.pt [B.pt ...]` keeps the drafter's weights
as they are (rewritten bit for bit) and makes its compact vocab the current compact tokens plus the
most frequent other reply tokens of the saved token datasets, N in all; config.json records the size,
the coverage and the data. The README's "The draft vocabulary" says how the shipped size was chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from fasteagle.drafter import CascadedDrafter
from fasteagle.errors import FastEagleError, Parser, run_command
from fasteagle.files import check_writable
from fasteagle.train import data
from fasteagle.train.teacher import shard_stats


def reply_counts(paths: Sequence[str | Path], vocab_size: int) -> torch.Tensor:
    """How often each token occurs in the replies of saved token datasets or folders of feature shards
    (a `--features cache` run's), all together."""
    return sum((_shard_counts(Path(p), vocab_size) if Path(p).is_dir()
                else data.reply_counts(data.load_token_dataset(p), vocab_size) for p in paths),
               torch.zeros(vocab_size, dtype=torch.long))


def _shard_counts(folder: Path, vocab_size: int) -> torch.Tensor:
    """Reply token counts of a folder of feature shards (`teacher.shard_stats`, as the trainer counts them)."""
    shards = sorted(folder.glob("shard-*.pt"))
    if not shards:
        raise FastEagleError(f"{folder} is a folder without feature shards (shard-*.pt); pass token datasets "
                             "or a --features cache run's feature folder")
    return shard_stats(shards, vocab_size)[0]


def coverage(ids: torch.Tensor | None, counts: torch.Tensor) -> float:
    return 1.0 if ids is None else float(counts[ids].sum() / counts.sum().clamp_min(1))


def parser() -> Parser:
    """The command line (a recipe checks its steps' arguments with it before anything runs)."""
    p = Parser(prog="python -m fasteagle.train.vocab", description=__doc__.splitlines()[0])
    p.add_argument("drafter", help="drafter directory (rewritten in place unless --out)")
    p.add_argument("--size", type=int, required=True, help="tokens in the compact vocab")
    p.add_argument("--data", nargs="+", required=True,
                   help="saved token datasets (e.g. distilled replies) or folders of feature shards")
    p.add_argument("--out", default=None, help="write the drafter here instead")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.size < 1:
        p.error("--size must be at least 1")
    return run_command(lambda: _set_vocab(args))


def _set_vocab(args) -> int:
    out = check_writable(args.out or args.drafter, "--out" if args.out else "the drafter", directory=True)
    d = CascadedDrafter.load(args.drafter)
    counts = reply_counts(args.data, d.cfg.vocab_size)
    before = coverage(d.compact_vocab, counts)
    d.set_compact_vocab(args.size, counts)
    after = coverage(d.compact_vocab, counts)
    names = set(type(d.cfg).__dataclass_fields__)
    extra = {k: v for k, v in d.info.items() if k not in names}
    sources = [str(x) if Path(x).is_dir() else Path(x).name for x in args.data]  # a shard folder: its path
    extra["compact_vocab"] = {"size": args.size, "reply_coverage": round(after, 4), "data": sources,
                              "reply_tokens": int(counts.sum())}
    d.save(out, extra=extra)
    print(f"compact vocab: {args.size} tokens covering {after:.1%} of {int(counts.sum())} reply tokens "
          f"(was {before:.1%}); wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

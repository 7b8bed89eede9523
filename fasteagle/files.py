"""Writing files so that nothing is lost, checking up front that an output can be written, and reading
a result file back.

Every file fasteagle writes (the model cache, drafter weights, checkpoints, results, traces) goes to a
unique temporary name beside its destination and is renamed into place: a crash, a kill or a second
process writing the same file never leaves it missing or half-written, only the old version or the new.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fasteagle.errors import FastEagleError

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary path beside `path`; when the block ends without an error it replaces
    `path` in one rename, otherwise it is removed and `path` keeps what it had."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it private; give it the mode a plain open would
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) whole or not at all."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def torch_save(obj, path: str | Path) -> None:
    """`torch.save` that replaces `path` whole or not at all."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(obj, str(tmp))


def check_writable(path: str | Path, what: str, directory: bool = False) -> Path:
    """Fail now, before any work, if `path` cannot be written: a file where a folder is needed (or the
    reverse), or a folder we may not write in (tested with a probe file, which is removed). Nothing is
    left behind: folders that do not exist yet are not made here."""
    path = Path(path).expanduser()
    if path.exists() and path.is_dir() != directory:
        kind = "a folder" if path.is_dir() else "a file"
        raise FastEagleError(f"{what} {path} is {kind}; give a {'folder' if directory else 'file'} path")
    if path.name in ("", ".", "..") and not directory:
        raise FastEagleError(f"{what} {path} names no file")
    parent = path if path.is_dir() else path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise FastEagleError(f"{what} {path} cannot be made: {parent} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".fasteagle-probe-")
    except OSError as exc:
        raise FastEagleError(f"{what} {path} is not writable: no new file can be made in {parent} "
                             f"({exc.strerror}); choose another place") from None
    os.close(fd)
    os.unlink(probe)
    return path


def read_result(path: str | Path) -> dict:
    """A result JSON, or a one-line error naming the file (a typo, a .md given for the .json)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FastEagleError(f"cannot read the result file {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise FastEagleError(f"{path} is not a bench result (a JSON object)")
    return doc

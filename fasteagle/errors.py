"""One exception type for every error a user can cause or fix, and one handler that every command
runs under: it prints such an error, and the expected failures of files (missing, unreadable, not
UTF-8, not JSON, corrupt weights), as one line `error: ...` and exits with 2. Anything else is a bug
and keeps its traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable


class FastEagleError(RuntimeError):
    """A user-facing error with a message that says what to do."""


def one_line(exc: BaseException) -> str | None:
    """The one-line message for an expected error, or None for a bug (which should show its traceback)."""
    if isinstance(exc, FastEagleError):
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, UnicodeDecodeError):
        return f"a file or argument is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno}); check the file"
    if isinstance(exc, OSError) and (exc.filename or exc.strerror):
        name = f" {exc.filename}" if exc.filename else ""
        return f"cannot use{name}: {exc.strerror or exc}"
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors is a dependency
        return None
    if isinstance(exc, SafetensorError):
        return f"a weights file is corrupt or truncated ({exc}); copy or train it again"
    return None


def run_command(func: Callable[[], int]) -> int:
    """Run one command: expected errors print one line and give exit code 2, Ctrl-C gives 130."""
    try:
        return func()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        msg = one_line(exc)
        if msg is None:
            raise
        print(f"error: {msg}", file=sys.stderr)
        return 2


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line in the form every fasteagle error takes (exit code 2)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")

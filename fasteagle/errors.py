"""One exception type for every error a user can cause or fix: the CLI and the app print its
message on one line instead of a traceback."""


class FastEagleError(RuntimeError):
    """A user-facing error with a message that says what to do."""

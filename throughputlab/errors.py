"""User-facing errors: one line, exit code 2, no traceback (the CLI turns them into that)."""


class UserError(Exception):
    """A mistake in the user's input: the message names the problem and the fix."""

    exit_code = 2


class EngineMissing(UserError):
    """An optional engine (vllm, py-spy, ...) is not installed."""


def first_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message in one line (its first), for a point's error or a log line."""
    text = str(e).strip()
    return (text.splitlines()[0] if text else "")[:limit]

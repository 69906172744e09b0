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


# Ctrl-C reaches every process of the terminal's foreground group: an engine's own processes (vLLM's engine core)
# stop too, and the client in this process can report their shutdown as an error of its own ("cancelled", a dead
# engine) where the KeyboardInterrupt was swallowed. The CLI notes the signal here, and a sweep that sees a point
# fail after it treats the failure as the interrupt, instead of recording an error point and going on.
_stop_requested = False


def request_stop() -> None:
    """Note that this process was told to stop (SIGINT, SIGTERM)."""
    global _stop_requested
    _stop_requested = True


def clear_stop() -> None:
    """Forget an earlier stop (a new command in the same process)."""
    global _stop_requested
    _stop_requested = False


def stop_requested() -> bool:
    """Whether :func:`request_stop` was called in this process."""
    return _stop_requested

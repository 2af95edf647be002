"""How `celery-mcp-tasks call` ends: its exit statuses, and `CallError` (one line for stderr with its status)."""

from __future__ import annotations

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "PROG",
    "CallError",
    "exit_code",
]

PROG = "celery-mcp-tasks call"
EXIT_OK = 0
EXIT_FAILED = 1  # failed, a result with isError, the server unreachable or refusing
EXIT_USAGE = 2  # ARGS not JSON / not an object, TOOL and --resume both or neither
EXIT_TIMEOUT = 124  # --timeout expired: the task keeps running (resume it), like timeout(1)
EXIT_CANCELLED = 130  # the task ended cancelled (Ctrl-C, a declined question, another client)


class CallError(Exception):
    """One line for stderr, and the exit status that goes with it."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def exit_code(status: str | None, *, is_error: bool = False) -> int:
    """The exit status for a task's final status (None: it never ended here)."""
    if status == "completed":
        return EXIT_FAILED if is_error else EXIT_OK
    if status == "cancelled":
        return EXIT_CANCELLED
    return EXIT_FAILED

"""The one way a fake_uv command ends early: `UvExit`, rendered like uv renders its errors."""

from __future__ import annotations

from collections.abc import Sequence


class UvExit(Exception):
    """Stop the invocation with exit `code` after printing `message` (may be empty) to stderr."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def failure(code: int, message: str, causes: Sequence[str] = (), hint: str = "") -> UvExit:
    """Build an error laid out like uv 0.13.9 prints it when stderr is not a terminal.

    kernel-bootstrap captures uv's stderr through a pipe, so this plain `error:` / `cause:`
    layout (not the boxed one uv draws on a terminal) is what its error tails really contain.
    """
    lines = [f"error: {message}"]
    for cause in causes:
        first, *rest = cause.splitlines() or [""]
        lines.append(f"  cause: {first}")
        lines.extend(f"         {line}" if line else "" for line in rest)
    if hint:
        lines += ["", f"hint: {hint}"]
    return UvExit(code, "\n".join(lines))

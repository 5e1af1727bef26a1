"""The one user-facing error type.

Every expected failure is a :class:`BootstrapError` (or a subclass). The CLI's top-level handler
prints its message and exits with its ``exit_code``; nothing else decides exit codes. A broken
internal invariant is an ``AssertionError("BUG: ...")`` instead, so it keeps its traceback.
"""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_SKILLS_FAILED: Final = 3


class BootstrapError(Exception):
    """An expected failure with a message that says what to do next."""

    exit_code: int = EXIT_FAILED


class ConfigError(BootstrapError):
    """The config file, an override or a command-line argument is invalid."""

    exit_code = EXIT_USAGE


class SkillError(BootstrapError):
    """A skill directory is invalid (missing SKILL.md, bad name, unsafe tree)."""

    exit_code = EXIT_USAGE


class LockTimeout(BootstrapError):
    """Another process held the bootstrap lock for longer than we were willing to wait."""


class ProcessError(BootstrapError):
    """A child process failed; carries the command, its exit code and the tail of its stderr."""

    def __init__(self, cmd: tuple[str, ...], returncode: int, stderr: str, what: str = "") -> None:
        self.cmd = cmd
        self.returncode = returncode
        self.stderr = stderr
        self.what = what
        super().__init__(str(self))

    @property
    def tail(self) -> str:
        """The last lines of stderr: uv puts the reason at the end."""
        return stderr_tail(self.stderr)

    def __str__(self) -> str:
        import shlex

        head = self.what or "command failed"
        lines = [
            f"{head} (exit code {self.returncode})",
            f"  command: {shlex.join(self.cmd)}",
        ]
        if self.tail:
            lines.append("  stderr:")
            lines.extend(f"    {line}" for line in self.tail.splitlines())
        return "\n".join(lines)


class UvError(ProcessError):
    """uv exited non-zero (or could not be started)."""


def stderr_tail(text: str, max_lines: int = 15, max_chars: int = 2000) -> str:
    """The reason a process failed: from uv's first ``error:`` line on when there is one (what
    precedes it is progress), else the end of stderr, where tools put the reason for failing.

    Too long, it keeps the ``error:`` line and its first causes, then the end (a build's
    traceback ends with its exception): cut from the end alone, it began mid-traceback.
    """
    lines = [line for line in text.strip().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("error:")), None)
    if start is None:
        return "\n".join(lines[-max_lines:])[-max_chars:]
    lines = lines[start:]
    if len(lines) > max_lines:
        lines = [*lines[:4], "...", *lines[-(max_lines - 5):]]
    text = "\n".join(lines)
    half = max_chars // 2
    return text if len(text) <= max_chars else f"{text[:half]}\n...\n{text[-half:]}"

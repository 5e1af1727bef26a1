"""uv-style progress lines on stderr: counts, durations, and `-q` handling."""

from __future__ import annotations

import sys
import time


class Console:
    """Writes uv's human-readable status lines to stderr unless `--quiet` was given."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.lap = time.perf_counter()

    def say(self, line: str) -> None:
        if not self.quiet:
            sys.stderr.write(line + "\n")

    def elapsed(self) -> str:
        """Time since the previous phase ended, formatted the way uv prints it (`0.55ms`)."""
        now = time.perf_counter()
        ms, self.lap = (now - self.lap) * 1000, now
        if ms < 1:
            return f"{ms:.2f}ms"
        return f"{ms:.0f}ms" if ms < 1000 else f"{ms / 1000:.2f}s"


def plural(count: int, word: str = "package") -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"

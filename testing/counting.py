"""A counting exec prefix: every call logged, every byte sent on its stdin kept, per call.

Tests and benchmarks of ``push --exec`` measure what crosses the transport with it (the issue
of a fleet re-sending every skill on every push asked for bytes on stdin, not a guess).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from bootstrap.trees.push import push_sync
from bootstrap.trees.targets import ExecTarget


class Counted:
    """An exec prefix that logs each call and keeps every byte sent on its stdin: ``inner``
    with its command replaced by a wrapper of the same name (so that ``ssh`` is still seen
    as ssh), which tees its stdin into a file per call."""

    def __init__(self, tmp: Path, inner: tuple[str, ...] = ("env",)) -> None:
        self.calls = tmp / "calls"
        self.stdin = tmp / "stdin"
        self.stdin.mkdir(parents=True)
        real = shutil.which(inner[0])
        assert real is not None, inner[0]
        wrapper = tmp / "counting" / Path(inner[0]).name
        wrapper.parent.mkdir()
        wrapper.write_text(f'#!/bin/sh\necho x >> "{self.calls}"\nn=$(wc -l < "{self.calls}")\n'
                           f'tee "{self.stdin}/$n" | "{real}" "$@"\n')
        wrapper.chmod(0o755)
        self.runtime = ExecTarget((str(wrapper), *inner[1:]))

    def push(self, sources: Sequence[Path], dest: Path | str) -> tuple[int, bytes]:
        """Push; (exec calls, the bytes the last call got on stdin)."""
        before = self._count()
        [report] = push_sync(sources, str(dest), [self.runtime])
        assert report.ok, report.error
        calls = self._count() - before
        return calls, (self.stdin / str(self._count())).read_bytes()

    def last_stdin(self) -> int:
        """How many bytes the last call got on stdin."""
        return (self.stdin / str(self._count())).stat().st_size

    def _count(self) -> int:
        return len(self.calls.read_text().splitlines()) if self.calls.exists() else 0

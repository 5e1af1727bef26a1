"""The config's ``ready-check``: Python code that must run cleanly in the interpreter the kernel
will use, whether we built it (a rebuild's validation) or were given it
(``KERNEL_BOOTSTRAP_PYTHON``)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from bootstrap.primitives import process

# Bounded: a rebuild runs it under the lock, and a ready-check that never returns must not
# wedge every later start behind it (the system we replace hung kernels for 17 minutes).
TIMEOUT: Final = 300.0


def run(python: Path, code: str, *, what: str) -> None:
    """Run ``code`` in ``python``; :class:`bootstrap.errors.ProcessError` (with ``what``, the
    command and the tail of its stderr) when it fails or does not finish in time."""
    process.run(python, "-c", code, timeout=TIMEOUT, what=what)

"""What ``ensure`` returns, whichever way it got there (warm, synced, rebuilt, or an override).

Its own module so that the engine and the override path, which both produce one, import it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Action = Literal["ready", "skills", "rebuild", "override"]


@dataclass(frozen=True)
class EnsureResult:
    """What :func:`bootstrap.ensure` did: the interpreter to start the kernel with (``python``),
    its ``venv``, the ``action`` taken (``ready``: nothing to do; ``skills``: skills synced;
    ``rebuild``: the runtime built or restored; ``override``: KERNEL_BOOTSTRAP_PYTHON), the
    skills ``installed`` and ``removed`` by this call, and ``failed``: skill name -> uv's error
    (``ensure --json`` prints the same as a list of ``{"name", "error"}`` objects)."""

    python: Path
    venv: Path
    action: Action
    installed: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)
    removed: tuple[str, ...] = ()

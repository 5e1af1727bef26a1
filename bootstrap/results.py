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
    python: Path
    venv: Path
    action: Action
    installed: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)
    removed: tuple[str, ...] = ()

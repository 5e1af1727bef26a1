"""Where skill trees may appear: the directories a ``skills`` glob depends on.

The config expands each pattern; the warm fingerprint watches these directories, so a skill
added under any of them is seen at the next start.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path


def glob_dirs(full: Path) -> list[Path]:
    """The literal root of a glob and every directory matched by each of its prefixes."""
    parts = full.parts
    # None when normalising removed every magic part ("*/.." is just the base directory).
    first = next((i for i, part in enumerate(parts) if glob.has_magic(part)), None)
    if first is None:
        return [full]
    dirs = [Path(*parts[:first])]
    for end in range(first + 1, len(parts) + 1):
        dirs += sorted(Path(m) for m in glob.glob(str(Path(*parts[:end]))) if os.path.isdir(m))
    return dirs

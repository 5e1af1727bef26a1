"""``kernel-bootstrap lock``: pin the runtime's requirements, with hashes, in the lock file."""

from __future__ import annotations

import json
from pathlib import Path

from bootstrap.config import load_config
from bootstrap.env.pins import write
from bootstrap.errors import EXIT_OK
from bootstrap.primitives.log import counted


def lock(config_path: Path | None, *, upgrade: bool, as_json: bool) -> int:
    result = write(load_config(config_path), upgrade=upgrade)
    pinned = counted(result.packages, "pinned package")
    if as_json:
        print(json.dumps({"lockfile": str(result.path), "format": result.format,
                          "changed": result.changed, "inputs": result.inputs,
                          "packages": result.packages}))
    elif result.changed:
        print(f"{result.path}: written ({pinned}, {result.format})")
    else:
        why = "nothing newer" if upgrade else "the inputs are unchanged"
        print(f"{result.path}: unchanged ({why}; {pinned})")
    return EXIT_OK

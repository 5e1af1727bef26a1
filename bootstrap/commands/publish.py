"""``kernel-bootstrap publish SRC... --into ROOT [--prune]``: what was published (and removed),
one line per skill."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from bootstrap.errors import EXIT_OK


def publish(sources: Sequence[Path], into: Path, grace: float, as_json: bool,
            prune: bool = False) -> int:
    from bootstrap.trees.publish import publish_set

    results, pruned = publish_set(sources, into, grace=grace, prune=prune)
    if as_json:
        skills = [
            {"name": r.name, "path": str(r.path), "hash": r.hash, "changed": r.changed,
             "method": r.method}
            for r in results
        ]
        print(json.dumps({"into": str(into.resolve()), "skills": skills,
                          "removed": list(pruned.removed)}))
    else:
        for r in results:
            state = f"changed, {r.method}" if r.changed else "unchanged"
            print(f"published {r.name} -> {r.path} ({state})")
        for name in pruned.removed:
            print(f"removed {name} from {into.resolve()}")
    return EXIT_OK

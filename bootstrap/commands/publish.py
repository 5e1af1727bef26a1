"""``kernel-bootstrap publish SRC... --into ROOT``: print what was published, one line per skill."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from bootstrap.errors import EXIT_OK


def publish(sources: Sequence[Path], into: Path, grace: float, as_json: bool) -> int:
    from bootstrap.trees.publish import publish as publish_trees

    results = publish_trees(sources, into, grace=grace)
    if as_json:
        skills = [
            {"name": r.name, "path": str(r.path), "hash": r.hash, "changed": r.changed,
             "method": r.method}
            for r in results
        ]
        print(json.dumps({"into": str(into.resolve()), "skills": skills}))
    else:
        for r in results:
            state = f"changed, {r.method}" if r.changed else "unchanged"
            print(f"published {r.name} -> {r.path} ({state})")
    return EXIT_OK

"""``kernel-bootstrap push [SRC...] --dest DIR [--exec PREFIX]... [--jobs N] [--prune] [--json]``;
without SRC, the config's skills (``publish.configured_trees``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from bootstrap.errors import EXIT_FAILED, EXIT_OK


def push(sources: Sequence[Path], dest: str, execs: Sequence[str], jobs: int,
         as_json: bool, prune: bool = False, config_path: Path | None = None) -> int:
    """Push into each ``--exec`` runtime (none: the local directory ``dest``).

    stdout: one line per runtime and skill, or one JSON object. Each failed runtime is one
    error on stderr; exit 1 if any failed, even when the others succeeded.
    """
    # asyncio (~35 ms) is paid by push only, never by ``import bootstrap``.
    import asyncio

    from bootstrap.trees.push import push as push_async
    from bootstrap.trees.targets import target_for

    if not sources:
        from bootstrap.commands.publish import configured_trees

        sources = configured_trees(config_path)
    targets = [target_for(p) for p in execs] if execs else [target_for(None)]
    reports = asyncio.run(push_async(sources, dest, targets, jobs, prune=prune))
    if as_json:
        print(json.dumps({"runtimes": [r.to_json() for r in reports]}))
    else:
        for report in reports:
            for skill in report.skills:
                print(f"{report.runtime}: {skill.name} -> {skill.path}")
            for name in report.removed:
                print(f"{report.runtime}: removed {name}")
    failed = [r for r in reports if not r.ok]
    for report in failed:
        print(f"error: {report.error}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK

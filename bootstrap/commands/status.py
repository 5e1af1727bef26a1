"""``kernel-bootstrap status``: what is wrong and why; strictly read-only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bootstrap.config import load_config
from bootstrap.errors import EXIT_FAILED, EXIT_OK
from bootstrap.lock import LockInfo, probe
from bootstrap.state import Assessment, assess


def status(config_path: Path | None, *, as_json: bool) -> int:
    config = load_config(config_path)
    found = assess(config)
    held = probe(config.venv)
    if as_json:
        print(json.dumps(status_dict(found, held)))
    else:
        print(render(found, held))
    return EXIT_OK if found.ready else EXIT_FAILED


def status_dict(found: Assessment, held: LockInfo) -> dict[str, Any]:
    return {
        "ready": found.ready,
        "venv": str(found.venv),
        "python": str(found.python),
        "marker": found.marker.state,
        "runtime": found.runtime,
        "why": found.why,
        "skills": [{"name": s.name, "python": s.python, "state": s.state, "error": s.error}
                   for s in found.skills],
        "stray": list(found.stray),
        "lock": {"held": held.held, "pid": held.pid},
    }


def render(found: Assessment, held: LockInfo) -> str:
    lines = [
        f"venv:    {found.venv}",
        f"python:  {found.python}",
        f"marker:  {found.marker.state}" + (f" ({found.marker.problem})"
                                            if found.marker.problem else ""),
        f"runtime: {found.runtime}" + (f" ({'; '.join(found.why)})" if found.why else ""),
        "lock:    " + (f"held by pid {held.pid}" if held.held and held.pid
                       else "held" if held.held else "free"),
    ]
    if found.skills:
        width = max(len(s.name) for s in found.skills)
        lines.append("skills:")
        for s in found.skills:
            kind = "python" if s.python else "plain"
            error = f"  {s.error.splitlines()[-1]}" if s.error else ""
            lines.append(f"  {s.name:<{width}}  {s.state:<9}  {kind}{error}")
    for name in found.stray:
        lines.append(f"  {name}  recorded but no longer configured (ensure uninstalls it)")
    verdict = "yes" if found.ready else f"no; run `kernel-bootstrap {_next(found)}`"
    lines.append(f"ready:   {verdict}")
    return "\n".join(lines)


def _next(found: Assessment) -> str:
    if any(s.state == "failed" for s in found.skills):
        return "repair` after fixing the failed skills, or `kernel-bootstrap ensure"
    return "ensure"

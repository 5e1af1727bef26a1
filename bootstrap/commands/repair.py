"""``kernel-bootstrap repair``: verify deeply, fix, and say what was found and done."""

from __future__ import annotations

import json
from pathlib import Path

from bootstrap.config import load_config
from bootstrap.engine.repair import RepairReport
from bootstrap.engine.repair import repair as run_repair
from bootstrap.errors import EXIT_FAILED, EXIT_OK


def repair(config_path: Path | None, *, force: bool, as_json: bool, lock_timeout: float) -> int:
    report = run_repair(load_config(config_path), force=force, lock_timeout=lock_timeout)
    if as_json:
        print(json.dumps({"healthy": report.healthy, "python": str(report.python),
                          "found": report.found, "done": report.done,
                          "remaining": report.remaining}))
    else:
        print(render(report))
    return EXIT_OK if report.healthy else EXIT_FAILED


def render(report: RepairReport) -> str:
    """found / done / still wrong, one item per line, then the verdict."""
    lines = _section("found", report.found, empty="nothing wrong")
    if report.done:
        lines += _section("done", report.done)
    if report.remaining:
        lines += _section("still wrong", report.remaining)
    verdict = "yes" if report.healthy else "no (see above; fix it, then run repair again)"
    lines.append(f"healthy: {verdict}")
    lines.append(f"python:  {report.python}")
    return "\n".join(lines)


def _section(title: str, items: list[str], empty: str = "") -> list[str]:
    if not items:
        return [f"{title}: {empty}"]
    lines = [f"{title}:"]
    for item in items:
        # A uv error spans several lines; indent its continuation under its bullet.
        first, *rest = item.splitlines() or [""]
        lines.append(f"  - {first}")
        lines += [f"    {line}" for line in rest]
    return lines

"""``kernel-bootstrap repair``: verify deeply, fix, and say what was found and done."""

from __future__ import annotations

import json
from pathlib import Path

from bootstrap.config import load_config
from bootstrap.errors import EXIT_FAILED, EXIT_OK
from bootstrap.repair import repair as run_repair


def repair(config_path: Path | None, *, force: bool, as_json: bool, lock_timeout: float) -> int:
    report = run_repair(load_config(config_path), force=force, lock_timeout=lock_timeout)
    if as_json:
        print(json.dumps({"healthy": report.healthy, "python": str(report.python),
                          "found": report.found, "done": report.done,
                          "remaining": report.remaining}))
    else:
        print("found:" if report.found else "found: nothing wrong")
        print("\n".join(f"  {line}" for line in report.found) if report.found else "", end="")
        if report.found:
            print()
        for line in report.done:
            print(f"done:  {line}")
        for line in report.remaining:
            print(f"still: {line}")
        print(f"healthy: {'yes' if report.healthy else 'no'} ({report.python})")
    return EXIT_OK if report.healthy else EXIT_FAILED

"""Print the kill matrix: SIGKILL ``ensure`` at every step boundary, then look at what is left.

The rows, the checks and the table are those of ``tests/test_kill_matrix.py`` (this script only
runs them outside pytest, in a throwaway HOME, and prints the table; a failed check is listed
under the table and makes the exit status 1). Usage::

    .venv/bin/python scripts/kill_matrix.py [--workers 3] [--only SUBSTRING] [--sweep] [--markdown]

``--sweep`` kills instead just before and just after every replace/rename/exchange that a
normal run of each path makes (about a minute).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3, help="rows run at a time")
    parser.add_argument("--only", default="", help="rows whose path or step contains this")
    parser.add_argument("--sweep", action="store_true",
                        help="every replace/rename/exchange, before and after")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kb-kill-matrix-") as tmp:
        home = Path(tmp) / "home"
        # Never the real home: the warm fingerprints and any cache go here.
        os.environ.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
                          XDG_DATA_HOME=str(home / ".local/share"),
                          XDG_CONFIG_HOME=str(home / ".config"),
                          XDG_STATE_HOME=str(home / ".local/state"),
                          UV_CACHE_DIR=str(home / ".cache/uv"),
                          # As the tests run it: the fake uv runs no real build backend, so
                          # uv's own editable builds (tests/conftest.py says the same).
                          KERNEL_BOOTSTRAP_BATCH_BUILDS="0")
        for var in ("KERNEL_BOOTSTRAP_CONFIG", "KERNEL_BOOTSTRAP_VENV", "KERNEL_BOOTSTRAP_PYTHON",
                    "KERNEL_BOOTSTRAP_UV", "KERNEL_BOOTSTRAP_SNAPSHOTS", "VIRTUAL_ENV"):
            os.environ.pop(var, None)
        from testing.killmatrix import POINTS, run_matrix, sweep, table

        began = time.monotonic()
        if args.sweep:
            rows, failed = sweep(Path(tmp) / "worlds", workers=args.workers)
            total = len(rows) + len(failed)
        else:
            points = [p for p in POINTS if args.only in p.id]
            rows, failed = run_matrix(Path(tmp) / "worlds", points, workers=args.workers)
            total = len(points)
        seconds = time.monotonic() - began
    text = table(rows)
    if args.markdown:
        text = "\n".join(f"| {line} |" for line in text.splitlines())
    print(text)
    print(f"\n{len(rows)} of {total} kill points passed in {seconds:.1f} s "
          f"({args.workers} at a time)")
    for point, error in failed.items():
        print(f"FAILED {point}: {type(error).__name__}: {error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 23's rebuild figure: a rebuild with generations vs the staged swap they replaced.

    .venv/bin/python scripts/bench_generations.py [--rounds 9] [--markdown]

Two worlds alike (ipykernel + 4 hatchling skills, the build cache and uv's cache warm), one
with generations (the default: a new generation is built, the ``<venv>`` link flipped, the
old generation removed), one with ``KERNEL_BOOTSTRAP_NO_GENERATIONS=1`` (a staged venv
swapped in with one exchange, the old tree removed). Each round runs ``repair --force`` on
both, order rotating; the deferred disk work of the removals is flushed (``sync``) before
each run. Target: unchanged within noise. Everything lives in a temporary directory.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path lines, so the script runs from a checkout.
from bench_lib import (
    BIN,
    Timing,
    check,
    interleave,
    make_world,
    median,
    open_workspace,
    quartiles,
    run_timed,
    warm_uv_cache,
)
from bench_report import Table, machine, ratio, secs

PLAIN = {"KERNEL_BOOTSTRAP_NO_GENERATIONS": "1"}


def repair(config: Path, env: dict[str, str]) -> Timing:
    os.sync()
    return run_timed([BIN / "kernel-bootstrap", "repair", "--force", "--config", config], env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kb-bench-generations-"))
    try:
        ws = open_workspace(root, BIN / "uv")
        warm_uv_cache(ws)
        env = dict(os.environ)
        gen, plain = make_world(ws, "generations", 4), make_world(ws, "plain", 4)
        check([BIN / "kernel-bootstrap", "ensure", "--config", gen.config], env)
        check([BIN / "kernel-bootstrap", "ensure", "--config", plain.config], {**env, **PLAIN})
        if not gen.venv.is_symlink() or plain.venv.is_symlink():
            raise RuntimeError("the two worlds are not laid out as the figure says")
        variants = {
            "`repair --force`, generations (build, flip, remove the old one)":
                functools.partial(repair, gen.config, env),
            "`repair --force`, KERNEL_BOOTSTRAP_NO_GENERATIONS=1 (staged swap)":
                functools.partial(repair, plain.config, {**env, **PLAIN}),
        }
        times = interleave(variants, args.rounds)
        base = median(t.wall for t in times[list(times)[1]])
        rows = [[name, secs(median(t.wall for t in runs)),
                 "-".join(secs(q) for q in quartiles([t.wall for t in runs])),
                 ratio(median(t.wall for t in runs), base), secs(median(t.cpu for t in runs))]
                for name, runs in times.items()]
        print("\n".join(machine(ws.uv)))
        print(Table("A rebuild with generations vs the staged swap (ipykernel + 4 skills)",
                    ["command", "median wall s", "IQR s", "vs staged swap", "median CPU s"],
                    rows, [f"Median of {args.rounds} interleaved rounds; everything cached; "
                           "target: unchanged within noise."]).render(args.markdown))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

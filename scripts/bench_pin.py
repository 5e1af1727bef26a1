"""Benchmark: interpreter start with the generation pin vs without it.

Every process started from a generation runs ``000-kernel-bootstrap-pin.pth`` (``env/pin.py``):
a realpath, an import of fcntl, one open and one shared flock, and the re-pointing of
``sys.path``. Two venvs of the same base interpreter, made by the same uv: one plain (no pin),
one laid out as ``ensure`` lays out a generation (``<venv>`` a link to ``.<venv>.gen-...``,
the pin and ``.in-use`` installed by the package's own code), started through the link as a
kernel starts. Each variant runs ``python -c pass``; rounds are interleaved with the order
rotating (:func:`bench_lib.interleave`); cells are medians; target: pin / no pin <= 1.02.
Usage::

    .venv/bin/python scripts/bench_pin.py [--rounds 101] [--markdown] [--uv PATH]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path lines, so the script runs from a checkout without installing.
from bench_lib import (
    BASE_PYTHON,
    Timing,
    bench_parser,
    interleave,
    median,
    quartiles,
    rmtree,
    run_timed,
)
from bench_report import Table, ms, ratio

from bootstrap.env import generations
from bootstrap.env.venv import Venv


def make_venvs(root: Path, uv: Path) -> tuple[Path, Path]:
    """(a plain venv, the link of a one-generation venv), both made by ``uv venv``."""
    plain = root / "plain"
    live = root / "venv"
    gen = generations.new_path(live)
    for path in (plain, gen):
        subprocess.run([str(uv), "venv", "--quiet", "--relocatable", "--python", BASE_PYTHON,
                        str(path)], check=True)
    generations.prepare(gen)
    generations.flip(live, gen)
    pinned = subprocess.run([str(Venv.at(live).python), "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert pinned == str(gen), f"the pin did not run: sys.prefix is {pinned}"
    return plain, live


def variants(plain: Path, live: Path) -> dict[str, Callable[[], Timing]]:
    return {
        "`python -c pass`, plain venv (no pin)":
            lambda: run_timed([Venv.at(plain).python, "-c", "pass"]),
        "`python -c pass`, through <venv> (pin)":
            lambda: run_timed([Venv.at(live).python, "-c", "pass"]),
    }


def table(times: dict[str, list[Timing]], rounds: int) -> Table:
    names = list(times)
    base = median(t.wall for t in times[names[0]])
    base_cpu = median(t.cpu for t in times[names[0]])
    rows = []
    for name in names:
        wall = [t.wall for t in times[name]]
        cpu = median(t.cpu for t in times[name])
        q1, q3 = quartiles(wall)
        rows.append([name, ms(median(wall)), f"{ms(q1)}-{ms(q3)}", ratio(median(wall), base),
                     ms(cpu), ratio(cpu, base_cpu)])
    return Table("Interpreter start with the generation pin vs without",
                 ["command", "median ms", "IQR ms", "vs no pin", "CPU ms", "CPU vs no pin"],
                 rows,
                 [f"Median of {rounds} interleaved rounds; wall time of the whole process; CPU "
                  "is user + system. Target: <= 1.02x."])


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    return bench_parser(__doc__, 101, "interleaved rounds", "the uv that makes the venvs"
                        ).parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    root = Path(tempfile.mkdtemp(prefix="kb-bench-pin-"))
    try:
        plain, live = make_venvs(root, args.uv)
        times = interleave(variants(plain, live), args.rounds)
        print(table(times, args.rounds).render(args.markdown))
    finally:
        rmtree(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

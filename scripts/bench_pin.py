"""Benchmark: interpreter start with the generation pin vs without it.

Every process started from a generation runs ``000-kernel-bootstrap-pin.pth`` (``env/pin.py``):
one readlink, one open and one record lock, the re-pointing of ``sys.path``, and the second
site pass over the venv left out. Two pairs of venvs of the same base interpreter, made by the
same uv: in each, one plain (no pin), one laid out as ``ensure`` lays out a generation
(``<venv>`` a link to ``.<venv>.gen-...``, the pin and ``.in-use`` installed by the package's
own code), started through the link as a kernel starts. The first pair is bare; the second
holds what a kernel venv holds: the runtime (``--runtime``, ipykernel; installed by uv from
the index or its cache) and one ``.pth`` per Python skill (``--skills``, as an editable
install writes it). Each variant runs ``python -c pass``; rounds are interleaved with the
order rotating (:func:`bench_lib.interleave`); cells are medians; target: pin / no pin <= 1.02.
Usage::

    .venv/bin/python scripts/bench_pin.py [--rounds 101] [--markdown] [--uv PATH]
        [--runtime ipykernel] [--skills 4]
"""

from __future__ import annotations

import argparse
import functools
import os
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


def make_venvs(root: Path, uv: Path, runtime: Sequence[str] = (), skills: int = 0
               ) -> tuple[Path, Path]:
    """(a plain venv, the link of a one-generation venv), both made by ``uv venv``, both
    holding ``runtime`` and ``skills`` editable-style ``.pth`` files."""
    root.mkdir(parents=True, exist_ok=True)
    plain = root / "plain"
    live = root / "venv"
    gen = generations.new_path(live)
    for path in (plain, gen):
        subprocess.run([str(uv), "venv", "--quiet", "--relocatable", "--python", BASE_PYTHON,
                        str(path)], check=True)
        if runtime:
            subprocess.run([str(uv), "pip", "install", "--quiet", "--python",
                            str(Venv.at(path).python), *runtime], check=True)
        for i in range(skills):
            source = root / "skills" / f"skill{i}" / "src"
            source.mkdir(parents=True, exist_ok=True)
            site = Venv.at(path).site_packages()[0]
            (site / f"_skill{i}.pth").write_text(f"{source}\n")
    generations.prepare(gen)
    generations.flip(live, gen)
    pinned = subprocess.run([str(Venv.at(live).python), "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert pinned == str(gen), f"the pin did not run: sys.prefix is {pinned}"
    return plain, live


def variants(pairs: dict[str, tuple[Path, Path]]) -> dict[str, Callable[[], Timing]]:
    found: dict[str, Callable[[], Timing]] = {}
    for kind, (plain, live) in pairs.items():
        found[f"{kind}: plain venv (no pin)"] = functools.partial(
            run_timed, [Venv.at(plain).python, "-c", "pass"])
        found[f"{kind}: through <venv> (pin)"] = functools.partial(
            run_timed, [Venv.at(live).python, "-c", "pass"])
    return found


def table(times: dict[str, list[Timing]], rounds: int) -> Table:
    names = list(times)
    rows = []
    for i, name in enumerate(names):
        base = median(t.wall for t in times[names[i - i % 2]])
        base_cpu = median(t.cpu for t in times[names[i - i % 2]])
        wall = [t.wall for t in times[name]]
        cpu = median(t.cpu for t in times[name])
        q1, q3 = quartiles(wall)
        rows.append([name, ms(median(wall)), f"{ms(q1)}-{ms(q3)}", ratio(median(wall), base),
                     ms(cpu), ratio(cpu, base_cpu)])
    return Table("`python -c pass` with the generation pin vs without",
                 ["venv", "median ms", "IQR ms", "vs no pin", "CPU ms", "CPU vs no pin"],
                 rows,
                 [f"Median of {rounds} interleaved rounds; wall time of the whole process; CPU "
                  "is user + system. Target: <= 1.02x."])


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(__doc__, 101, "interleaved rounds", "the uv that makes the venvs")
    parser.add_argument("--runtime", default="ipykernel",
                        help="what the kernel-like pair holds ('' for nothing)")
    parser.add_argument("--skills", type=int, default=4,
                        help="editable-style .pth files in the kernel-like pair")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    root = Path(tempfile.mkdtemp(prefix="kb-bench-pin-"))
    try:
        pairs = {"bare": make_venvs(root / "bare", args.uv)}
        label = f"{args.runtime or 'no runtime'} + {args.skills} skill .pth"
        pairs[label] = make_venvs(root / "kernel", args.uv, args.runtime.split(), args.skills)
        times = interleave(variants(pairs), args.rounds)
        print(table(times, args.rounds).render(args.markdown))
    finally:
        rmtree(root) if not os.environ.get("KB_KEEP") else print(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

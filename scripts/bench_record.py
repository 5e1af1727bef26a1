"""Issue 31's RECORD check: what it costs to compare a venv's files with its RECORDs.

    .venv/bin/python scripts/bench_record.py [--rounds 9] [--markdown] [--uv PATH]
        [--packages numpy ipykernel pandas]

Builds, with the real uv (online once, into a temporary uv cache), one venv per runtime: numpy
alone, then the ``--packages`` together. Each round times ``env.record.damaged`` in this
process, sizes only (a rebuild's validation, before the flip) and with hashes of files up to
1 MiB (``repair``), wall and CPU, variants interleaved. The page cache is warm, as it is right
after uv wrote the files. Everything lives in a temporary directory.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path lines, so the script runs from a checkout.
from bench_lib import bench_parser, check, interleave, median, open_workspace
from bench_report import Table, machine, ms

from bootstrap.env import record


def build(uv: Path, venv: Path, packages: list[str]) -> int:
    """The venv with ``packages``; how many lines its RECORDs hold."""
    check([uv, "venv", "--quiet", "--python", sys.executable, venv])
    check([uv, "pip", "install", "--quiet", "--python", venv / "bin" / "python", *packages])
    return sum(len(p.read_text().splitlines())
               for p in venv.glob("lib/python*/site-packages/*.dist-info/RECORD"))


def timer(venv: Path, hashes: bool) -> Callable[[], tuple[float, float]]:
    def run() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        found = record.damaged(venv, hashes=hashes)
        assert not found, record.summary(found)
        return time.perf_counter() - wall, time.process_time() - cpu
    return run


def main() -> int:
    parser = bench_parser(__doc__, 9, "rounds per variant", "the uv that builds the venvs")
    parser.add_argument("--packages", nargs="+", default=["numpy", "ipykernel", "pandas"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kb-bench-record-") as tmp:
        ws = open_workspace(Path(tmp), args.uv)
        runtimes = {"numpy": ["numpy"], " + ".join(args.packages): args.packages}
        venvs = {name: ws.fresh("runtime") / "venv" for name in runtimes}
        files = {name: build(ws.uv, venvs[name], packages) for name, packages in runtimes.items()}
        variants = {f"{name}|{mode}": timer(venvs[name], mode == "hashes")
                    for name in runtimes for mode in ("sizes", "hashes")}
        results = interleave(variants, args.rounds)
    rows = []
    for key, samples in results.items():
        name, mode = key.split("|")
        wall, cpu = median(s[0] for s in samples), median(s[1] for s in samples)
        rows.append([name, str(files[name]), mode, ms(wall), ms(cpu),
                     f"{wall / files[name] * 1e6:.1f}"])
    table = Table("The RECORD check, in process",
                  ["runtime", "RECORD lines", "check", "wall ms", "CPU ms", "µs per file"],
                  rows, [line.removeprefix("- ") for line in machine(args.uv)])
    print(table.render(args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Snapshot restore vs a full build, each with an EMPTY uv cache (a fresh fleet sandbox).

    .venv/bin/python scripts/bench_snapshot.py [--rounds 5] [--markdown]

Side by side in one run, interleaved round by round, medians and ratios:
  - cold `ensure` into a fresh venv path, empty uv cache, full build (uv venv + runtime from
    PyPI + 6 Python skills built with hatchling from PyPI);
  - the same with a snapshot store holding this runtime: restore instead of building;
  - our restore vs plain `tar -x` of the same archive (our overhead on the physical copy).

    .venv/bin/python scripts/bench_snapshot.py --reader

Offline: the header cost of primitives/tar.py's Reader (vetting included) against tarfile listing
the same 12,000-member archive (the size of a 9k-file venv's): why the reader is hand-written.
Everything lives in a temporary directory: HOME, XDG dirs and UV_CACHE_DIR point there.

Every child runs with bytecode cached, as an installed copy would: PYTHONDONTWRITEBYTECODE
(which this checkout's shell may set, compiling kernel-bootstrap and its dependencies on every
start) is dropped and PYTHONPYCACHEPREFIX points into the temporary directory, for both
variants alike. The bake (a full build) and one untimed restore fill that cache first.

Each timed run starts after a `sync`, so the previous run's writeback (a full build writes
its venv and uv cache, well over 100 MB) does not land on the next one's clock.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from testing.skills import Package, make_skill

BIN = Path(sys.executable).parent
RUNTIME = ["ipykernel>=6"]
SKILLS = 6
# What would make a child act on another environment, or (PYTHONDONTWRITEBYTECODE) compile
# every module on every start.
_DROPPED = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX", "PYTHONDONTWRITEBYTECODE",
            "UV_OFFLINE", "KERNEL_BOOTSTRAP_VENV", "KERNEL_BOOTSTRAP_PYTHON",
            "KERNEL_BOOTSTRAP_CONFIG", "KERNEL_BOOTSTRAP_SNAPSHOTS")


def make_skills(root: Path) -> None:
    for i in range(SKILLS):
        make_skill(root, f"skill-{i}", package=Package())


def ensure(config: Path, venv: Path, cache: Path, env: dict[str, str]) -> float:
    run_env = {**env, "KERNEL_BOOTSTRAP_VENV": str(venv), "UV_CACHE_DIR": str(cache)}
    os.sync()
    started = time.perf_counter()
    done = subprocess.run([str(BIN / "kernel-bootstrap"), "ensure", "--json", "-q",
                           "--config", str(config)], env=run_env, capture_output=True,
                          text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"ensure failed:\n{done.stderr}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--reader", action="store_true", help="only the header-reading costs")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kb-bench-snapshot-"))
    try:
        if args.reader:
            return reader_vs_tarfile(root, args.rounds)
        return run(root, args.rounds, args.markdown)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, rounds: int, markdown: bool) -> int:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    for var, sub in (("HOME", "home"), ("XDG_CACHE_HOME", "cache"), ("XDG_DATA_HOME", "data")):
        env[var] = str(root / sub)
    env["KERNEL_BOOTSTRAP_UV"] = str(BIN / "uv")
    make_skills(root / "skills")
    store = root / "store"
    base = {"requirements": RUNTIME, "skills": ["skills/*"]}
    plain, snap = root / "full.toml", root / "snap.toml"
    plain.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in base.items()))
    snap.write_text(plain.read_text() + f"snapshots = {json.dumps(str(store))}\n")
    # Bake the store once (not timed), as a fleet would before starting sandboxes.
    ensure(snap, root / "bake", root / "bake-cache", env)
    ensure(snap, root / "warm-up", root / "warm-up-cache", env)  # the restore path's bytecode
    [archive] = list(store.glob("*.tar"))
    times: dict[str, list[float]] = {"full build": [], "restore": [], "tar -x": []}
    for r in range(rounds):
        times["full build"].append(ensure(plain, root / f"full-{r}", root / f"c-full-{r}", env))
        times["restore"].append(ensure(snap, root / f"snap-{r}", root / f"c-snap-{r}", env))
        target = root / f"tar-{r}"
        target.mkdir()
        started = time.perf_counter()
        os.sync()
        subprocess.run(["tar", "-x", "-f", str(archive), "-C", str(target)], check=True)
        times["tar -x"].append(time.perf_counter() - started)
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.2f}s"
                                                      for k, v in times.items()),
              file=sys.stderr)
    medians = {k: statistics.median(v) for k, v in times.items()}
    full = medians["full build"]
    rows = [
        ("cold ensure, full build (empty uv cache)", medians["full build"], 1.0),
        ("cold ensure, restore from snapshot (empty uv cache)", medians["restore"],
         medians["restore"] / full),
        ("plain `tar -x` of the same archive", medians["tar -x"], medians["tar -x"] / full),
    ]
    size = archive.stat().st_size
    overhead = medians["restore"] / medians["tar -x"]
    if markdown:
        print(f"\nruntime {RUNTIME} + {SKILLS} Python skills; {rounds} interleaved rounds, "
              f"medians; archive {size / 1e6:.1f} MB\n")
        print("| variant | median s | vs full build |\n|---|---:|---:|")
        for label, value, ratio in rows:
            print(f"| {label} | {value:.2f} | {ratio:.3f}x |")
        print(f"\nrestore / `tar -x`: {overhead:.2f}x (interpreter start, validation, swap, "
              "marker)")
    else:
        for label, value, ratio in rows:
            print(f"{label:<55} {value:7.2f} s  {ratio:6.3f}x")
        print(f"archive size: {size / 1e6:.1f} MB; restore / tar -x = {overhead:.2f}x")
    return 0


def reader_vs_tarfile(root: Path, rounds: int, members: int = 12_000) -> int:
    """Microseconds per header: our vetting reader vs tarfile, same archive, medians."""
    import tarfile

    from bootstrap.primitives.tar import write_archive
    from bootstrap.snapshots.archive import open_snapshot

    tree = root / "venv"
    for i in range(members):
        path = tree / f"lib/python3.11/site-packages/pkg{i // 50}/module_{i:05}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * (i % 700))
    archive = root / "bench.tar"
    with archive.open("wb") as out:
        write_archive(out, ("kernel-bootstrap-snapshot.json", b"{}"), tree, "venv",
                      skip=lambda name: False)
    with tarfile.open(archive) as tar:
        headers = len(tar.getmembers())

    def ours() -> None:
        with archive.open("rb", buffering=0) as f:
            for _ in open_snapshot(f, archive)[1].vetted():
                pass

    def theirs() -> None:
        with tarfile.open(archive) as tar:
            tar.getmembers()

    times: dict[str, list[float]] = {"bootstrap.primitives.tar.Reader": [], "tarfile": []}
    for _ in range(rounds):
        for label, read in (("bootstrap.primitives.tar.Reader", ours), ("tarfile", theirs)):
            started = time.perf_counter()
            read()
            times[label].append(time.perf_counter() - started)
    for label, values in times.items():
        print(f"{label:<22} {statistics.median(values) / headers * 1e6:6.2f} us/header "
              f"({headers} headers, {archive.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

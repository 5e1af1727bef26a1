"""Snapshots in a bucket (moto's S3 server on 127.0.0.1) against full builds and `tar -x`.

    .venv/bin/python scripts/bench_bucket.py [--rounds 3] [--fleet 8] [--markdown]

Side by side in one run, interleaved round by round, medians and ratios:
  - a fleet: N fresh sandboxes at once (fresh venv paths, empty uv caches), each restoring from
    the bucket, vs the same N doing full builds (real uv: the README's runtime plus 6 Python
    skills); wall time for all N, and bytes moved (loopback bytes for the bucket, bytes received
    on the other interfaces for the builds: the package index);
  - one restore from the bucket (zstd object, and the same archive stored plain) vs a plain
    download of the same object plus `tar -x` (with `-I zstd` for the compressed one);
  - one restore from a local store vs `tar -x` of the same archive;
  - the extraction alone from a local file, plain vs zstd (wall and CPU), to choose per store;
  - archive size, plain vs zstd.
Needs the cloud and test extras (obstore, zstandard, moto[server]) and the `zstd` binary.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_snapshot import _DROPPED, BIN, RUNTIME, SKILLS, ensure, make_skills

from bootstrap.primitives.fs import remove_quietly
from testing import s3server

BUCKET = "fleet"


def net_bytes(loopback: bool) -> int:
    """Bytes received so far on loopback, or on every other interface."""
    total = 0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, data = line.split(":", 1)
        if (name.strip() == "lo") == loopback:
            total += int(data.split()[0])
    return total


def fleet(configs: list[tuple[Path, Path, Path]], env: dict[str, str],
          loopback: bool) -> tuple[float, int]:
    """Start every ``ensure`` at once; wall time until the last is done, and bytes moved."""
    os.sync()
    before, started = net_bytes(loopback), time.perf_counter()
    procs = [subprocess.Popen([str(BIN / "kernel-bootstrap"), "ensure", "-q", "--config",
                               str(config)], env={**env, "KERNEL_BOOTSTRAP_VENV": str(venv),
                                                  "UV_CACHE_DIR": str(cache)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for config, venv, cache in configs]
    errors = [p.communicate()[1] for p in procs]
    elapsed = time.perf_counter() - started
    if any(p.returncode for p in procs):
        raise SystemExit("a fleet member failed:\n" + "\n".join(errors))
    return elapsed, net_bytes(loopback) - before


def timed(step: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds (ours plus children's) of ``step``."""
    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
            resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    os.sync()
    c0, t0 = cpu(), time.perf_counter()
    step()
    return time.perf_counter() - t0, cpu() - c0


def extract_local(archive: Path, into: Path) -> None:
    """Our restore's extraction alone: the vetting reader (decoding zstd) into tar -x."""
    from bootstrap.snapshots import compression
    from bootstrap.snapshots.archive import extract, open_snapshot

    with archive.open("rb", buffering=0) as f:
        _, reader = open_snapshot(compression.decoded(f), archive)
        into.mkdir()
        extract(reader, into)


def download_and_untar(env: dict[str, str], name: str, into: Path) -> None:
    """The physical copy: stream the object to a file as `aws s3 cp` would, then tar -x."""
    import obstore

    from bootstrap.snapshots import cloud
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        store = cloud.connect(f"s3://{BUCKET}", 10)
        file = into.with_suffix(".download")
        with file.open("wb") as out:
            for chunk in obstore.get(store, name).stream(min_chunk_size=1 << 20):
                out.write(chunk)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    into.mkdir()
    zstd = ["-I", "zstd"] if file.read_bytes()[:4] == b"\x28\xb5\x2f\xfd" else []
    subprocess.run(["tar", "-x", *zstd, "-f", str(file), "-C", str(into)], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fleet", type=int, default=8)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kb-bench-bucket-"))
    try:
        with s3server.running() as endpoint:
            return run(root, endpoint, args.rounds, args.fleet, args.markdown)
    finally:
        remove_quietly(root)


def setup(root: Path, endpoint: str) -> tuple[dict[str, str], dict[str, Path]]:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED and not k.startswith("AWS_")}
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    for var, sub in (("HOME", "home"), ("XDG_CACHE_HOME", "cache"), ("XDG_DATA_HOME", "data")):
        env[var] = str(root / sub)
    env.update(KERNEL_BOOTSTRAP_UV=str(BIN / "uv"), **s3server.client_env(endpoint))
    make_skills(root / "skills")
    base = "".join(f"{k} = {json.dumps(v)}\n"
                   for k, v in {"requirements": RUNTIME, "skills": ["skills/*"]}.items())
    stores = {"full": None, "bucket": f"s3://{BUCKET}/zstd", "plain": f"s3://{BUCKET}/plain",
              "local": str(root / "store")}
    configs: dict[str, Path] = {}
    for name, store in stores.items():
        configs[name] = root / f"{name}.toml"
        configs[name].write_text(base + (f"snapshots = {json.dumps(store)}\n" if store else ""))
    return env, configs


def bake(root: Path, env: dict[str, str], configs: dict[str, Path]) -> tuple[str, Path, Path]:
    """Fill the bucket (zstd, and the same archive plain) and the local store; not timed."""
    s3 = s3server.make_bucket(env["AWS_ENDPOINT_URL"], BUCKET)
    ensure(configs["bucket"], root / "bake", root / "bake-cache", env)
    ensure(configs["local"], root / "bake-local", root / "bake-cache", env)
    [local] = list((root / "store").glob("*.tar"))
    name = local.name
    zst = root / "local.tar.zst"
    zst.write_bytes(s3.get_object(Bucket=BUCKET, Key=f"zstd/{name}")["Body"].read())
    import zstandard

    plain = zstandard.ZstdDecompressor().decompressobj().decompress(zst.read_bytes())
    s3.put_object(Bucket=BUCKET, Key=f"plain/{name}", Body=plain, Metadata={
        "kb-size": str(len(plain)), "kb-sha256": hashlib.sha256(plain).hexdigest()})
    for warm in ("bucket", "plain", "local"):  # the restore path's bytecode, as installed
        ensure(configs[warm], root / f"warm-{warm}", root / f"warm-{warm}-cache", env)
    return name, local, zst


def run(root: Path, endpoint: str, rounds: int, size: int, markdown: bool) -> int:
    env, configs = setup(root, endpoint)
    name, local, zst = bake(root, env, configs)
    walls: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    moved: dict[str, list[int]] = {}

    def note(label: str, wall: float, cpu: float | None = None) -> None:
        walls.setdefault(label, []).append(wall)
        if cpu is not None:
            cpus.setdefault(label, []).append(cpu)

    for r in range(rounds):
        for kind, config, loopback in (("restore", "bucket", True), ("full build", "full", False)):
            members = [(configs[config], root / f"{kind[0]}{r}-{i}", root / f"c{kind[0]}{r}-{i}")
                       for i in range(size)]
            wall, nbytes = fleet(members, env, loopback)
            note(f"fleet of {size}: {kind}", wall)
            moved.setdefault(kind, []).append(nbytes)
        for label, config in (("bucket restore, zstd", "bucket"),
                              ("bucket restore, plain", "plain"),
                              ("local store restore, plain", "local")):
            note(label, ensure(configs[config], root / f"{config}-{r}", root / f"x{r}", env))
        for label, key in (("download + tar -x, zstd", f"zstd/{name}"),
                           ("download + tar -x, plain", f"plain/{name}")):
            into = root / f"dl-{r}-{label.split()[-1]}"
            note(label, *timed(functools.partial(download_and_untar, env, key, into)))
        target = root / f"tar-{r}"
        target.mkdir()
        note("tar -x of the local archive", *timed(functools.partial(
            subprocess.run, ["tar", "-x", "-f", str(local), "-C", str(target)], check=True)))
        for label, archive in (("extraction alone, plain file", local),
                               ("extraction alone, zstd file", zst)):
            into = root / f"ex-{r}-{label.split()[-2]}"
            note(label, *timed(functools.partial(extract_local, archive, into)))
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.2f}s"
                                                      for k, v in walls.items()), file=sys.stderr)
    report(walls, cpus, moved, local.stat().st_size, zst.stat().st_size, size, rounds, markdown)
    return 0


def report(walls: dict[str, list[float]], cpus: dict[str, list[float]],
           moved: dict[str, list[int]], plain: int, packed: int, size: int, rounds: int,
           markdown: bool) -> None:
    med = {k: statistics.median(v) for k, v in walls.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    rows = [(k, f"{med[k]:.2f}", f"{cpu[k]:.2f}" if k in cpu else "") for k in med]
    ratios = [
        ("fleet restore / fleet full build (wall)",
         med[f"fleet of {size}: restore"] / med[f"fleet of {size}: full build"]),
        ("fleet bytes moved, restore / full build",
         statistics.median(moved["restore"]) / statistics.median(moved["full build"])),
        ("bucket restore (zstd) / download + tar -x (zstd)",
         med["bucket restore, zstd"] / med["download + tar -x, zstd"]),
        ("bucket restore (plain) / download + tar -x (plain)",
         med["bucket restore, plain"] / med["download + tar -x, plain"]),
        ("bucket restore zstd / plain", med["bucket restore, zstd"] / med["bucket restore, plain"]),
        ("local store restore / tar -x", med["local store restore, plain"]
         / med["tar -x of the local archive"]),
        ("extraction alone, zstd / plain (wall)",
         med["extraction alone, zstd file"] / med["extraction alone, plain file"]),
        ("archive size, zstd / plain", packed / plain),
    ]
    mb = {k: statistics.median(v) / 1e6 for k, v in moved.items()}
    head = (f"runtime {RUNTIME} + {SKILLS} Python skills; {rounds} interleaved rounds, medians; "
            f"archive {plain / 1e6:.1f} MB plain, {packed / 1e6:.1f} MB zstd; fleet bytes "
            f"moved: restore {mb['restore']:.1f} MB, full build {mb['full build']:.1f} MB")
    if markdown:
        print(f"\n{head}\n\n| variant | median wall s | median CPU s |\n|---|---:|---:|")
        print("\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows))
        print("\n| ratio | value |\n|---|---:|")
        print("\n".join(f"| {label} | {value:.3f}x |" for label, value in ratios))
    else:
        print(head)
        print("\n".join(f"{a:<45} {b:>7} s  {c:>6}" for a, b, c in rows))
        print("\n".join(f"{label:<55} {value:6.3f}x" for label, value in ratios))


if __name__ == "__main__":
    raise SystemExit(main())

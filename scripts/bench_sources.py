"""Benchmark: skills from git against the same skills as local directories (issue 30's targets).

Four figures, side by side in one run, each the median of ``--rounds`` interleaved runs:

1. warm ``ensure`` with 20 git-sourced skills / with the same 20 as local dirs (bar <= 1.05x);
2. cold fetch of 1 skill from a repository holding a ``--blob-mb`` MB blob elsewhere: bytes the
   cache received (its pack files and loose objects) / the skill's size (bar <= 3x);
3. ``verify``'s check of 100 git skills x 25 files (2-4 KiB each), in process (bar <= 50 ms,
   goal 20 ms), beside sha256 of the same bytes already in memory (the floor of any check);
4. a new venv, the git skills locked and cached, offline / the same with local skills
   (bar <= 1.05x);
5. ``lock`` of one glob source of 300 skills served by a local ``git daemon``, with a new git
   cache each round: seconds (bar <= 3 s) and the git processes it ran (bar <= 10), counted
   by a logging ``git`` first on its PATH (``--many-rounds``; ``--many-rounds 0`` skips it).

The environment is built by the fake uv (fake_uv/, the test suite's uv simulator): figures 1
and 4 compare our own work, which is what the git sources add; repositories are ``file://``
ones made with the real ``git``. Usage::

    .venv/bin/python scripts/bench_sources.py [--rounds 7] [--blob-mb 200] [--many-rounds 3]
        [--markdown]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_lib import interleave, median, remove_venv, timed

from testing.gitrepo import Daemon, Repo
from testing.world import World

N_SKILLS = 20
VERIFY_SKILLS, VERIFY_FILES = 100, 25
MANY_SKILLS = 300


def _files(i: int, n: int) -> dict[str, bytes]:
    return {f"part{k % 3}/file{k:02}.txt": os.urandom(2048 + (i * 131 + k * 17) % 2048)
            for k in range(n - 1)}


def _config(world: World, skills: str) -> None:
    world.config.write_text(f'venv = "venv"\nskills = [{skills}]\n', encoding="utf-8")


def worlds(base: Path) -> tuple[World, World]:
    """A world with 20 git skills (one ``file://`` repository) and one with the same 20 local."""
    repo = Repo(base / "repo")
    local = World(base / "local")
    for i in range(N_SKILLS):
        files = _files(i, 8)
        repo.skill(f"s{i:02}", files=files)
        local.skill(f"s{i:02}", python=False, files=files)
    repo.commit("skills")
    git = World(base / "git")
    _config(git, f'{{ git = "{repo.file_url}", subdirectory = "skills/*" }}')
    _config(local, '"skills/*"')
    return git, local


def ensure(world: World, env: dict[str, str] | None = None) -> Callable[[], float]:
    return lambda: timed(world.command("ensure"), {**world.env, **(env or {})})


def settle(world: World) -> None:
    for _ in range(3):  # the later runs take the stamps that were too close to the clock
        timed(world.command("ensure"), world.env)


def fresh_venv(world: World) -> Callable[[], float]:
    def run() -> float:
        remove_venv(world.venv)
        return ensure(world, {"KERNEL_BOOTSTRAP_OFFLINE": "1"})()
    return run


def cold_fetch(base: Path, blob_mb: int) -> tuple[int, int]:
    """(bytes the cache received, the skill's bytes) for one skill beside a big blob."""
    repo = Repo(base / "big")
    files = _files(7, 25)
    repo.skill("small", files=files)
    with open(repo.path / "big.bin", "wb") as f:
        for _ in range(blob_mb):
            f.write(os.urandom(1024 * 1024))
    repo.commit("big")
    world = World(base / "cold")
    _config(world, f'{{ git = "{repo.file_url}", subdirectory = "skills/small" }}')
    timed(world.command("ensure"), world.env)
    skill = sum(p.stat().st_size for p in (repo.path / "skills" / "small").rglob("*")
                if p.is_file())
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "kernel-bootstrap" / "git" / "repos"
    [clone] = [p for p in cache.iterdir() if p.is_dir() and _remote(p) == repo.file_url]
    objects = sum(p.stat().st_size for p in (clone / "objects").rglob("*")
                  if p.is_file() and (p.suffix == ".pack" or len(p.parent.name) == 2))
    return objects, skill


def _remote(clone: Path) -> str:
    for line in (clone / "config").read_text().splitlines():
        if line.strip().startswith("url ="):
            return line.split("=", 1)[1].strip()
    return ""


def verify_setup(base: Path) -> list[object]:
    """100 materialised trees of 25 files in the cache, and lock entries pinning them."""
    from bootstrap.sources.lockfile import LockedSkill
    from bootstrap.sources.paths import tree_path
    from bootstrap.sources.treehash import tree_sha256
    from testing.skills import make_skill

    entries: list[object] = []
    for i in range(VERIFY_SKILLS):
        made = make_skill(base / "v", f"v{i:03}", _files(i, VERIFY_FILES), description="bench",
                          body="# bench\n")
        sha = tree_sha256(made)
        dest = tree_path(sha, made.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(made, dest)
        _read_only(dest)  # as materialised trees are: verify names any other as loose
        entries.append(LockedSkill(made.name, "file:///bench", None, None, None,
                                   f"skills/{made.name}", "0" * 40, sha))
    return entries


def _read_only(root: Path) -> None:
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            os.chmod(os.path.join(directory, name), 0o444)
        os.chmod(directory, 0o555)


def verify_in_process(entries: list[object]) -> Callable[[], float]:
    from bootstrap.sources.verify import check_git

    def run() -> float:
        start = time.perf_counter()
        count, problems = check_git(entries, lambda e: None)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - start
        assert count == VERIFY_SKILLS and not problems, problems[:3]
        return elapsed
    return run


def hash_floor(entries: list[object]) -> Callable[[], float]:
    """sha256 of the same files' bytes, already in memory: the floor any check has here."""
    import hashlib

    from bootstrap.sources.paths import tree_path

    blobs = [p.read_bytes() for e in entries
             for p in tree_path(e.sha256, e.name).rglob("*")  # type: ignore[attr-defined]
             if p.is_file()]

    def run() -> float:
        start = time.perf_counter()
        for blob in blobs:
            hashlib.sha256(blob).digest()
        return time.perf_counter() - start
    return run


def many_setup(base: Path) -> tuple[World, Daemon, dict[str, str], Path]:
    """A repository of 300 small skills behind a started ``git daemon``; a world whose one
    source is all of them; the environment of its ``lock`` (a logging ``git`` first on PATH)
    and that log."""
    repo = Repo(base / "served" / "many")
    for i in range(MANY_SKILLS):
        repo.skill(f"m{i:03}", files={"doc.md": f"skill {i}\n" * 20,
                                      "scripts/run.py": f"print({i})\n"})
    repo.commit("many")
    served = Daemon(base / "served")
    served.start()  # before the shim is on any PATH: the daemon's own git is not counted
    world = World(base / "many")
    _config(world, f'{{ git = "{served.url("many")}", subdirectory = "skills/*" }}')
    real = shutil.which("git")
    assert real is not None
    log = base / "many-git.log"
    shim = base / "shim" / "git"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(log))}\n'
                    f'exec {shlex.quote(real)} "$@"\n')
    shim.chmod(0o755)
    env = {**world.env, "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}",
           "XDG_CACHE_HOME": str(base / "many-cache")}
    return world, served, env, log


def many_lock(world: World, env: dict[str, str], log: Path) -> Callable[[], tuple[float, int]]:
    """One ``lock`` from nothing (no skills lock, no git cache): (seconds, git processes)."""
    def run() -> tuple[float, int]:
        shutil.rmtree(env["XDG_CACHE_HOME"], ignore_errors=True)
        (world.root / "skills-lock.toml").unlink(missing_ok=True)
        log.unlink(missing_ok=True)
        took = timed(world.command("lock"), env)
        locked = (world.root / "skills-lock.toml").read_text().count("[[skill]]")
        assert locked == MANY_SKILLS, f"locked {locked} skills"
        return took, len(log.read_text().splitlines())
    return run


def many_row(base: Path, rounds: int) -> tuple[str, str, str, str, str]:
    world, served, env, log = many_setup(base)
    try:
        runs = [many_lock(world, env, log)() for _ in range(rounds)]
    finally:
        served.stop()
    took, processes = median(t for t, _ in runs), median(n for _, n in runs)
    return (f"`lock`, {MANY_SKILLS} skills of one repository (git daemon, new cache)",
            f"{took:.2f} s", f"{processes:.0f} git processes", "-", "<= 3 s, <= 10 git")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--blob-mb", type=int, default=200)
    parser.add_argument("--many-rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sources-") as tmp:
        base = Path(tmp)
        os.environ["XDG_CACHE_HOME"] = str(base / "cache")
        os.environ["HOME"] = str(base / "home")
        rows = run_all(base, args.rounds, args.blob_mb)
        if args.many_rounds:
            rows.append(many_row(base, args.many_rounds))
    print_table(rows, args.markdown)
    return 0


def run_all(base: Path, rounds: int, blob_mb: int) -> list[tuple[str, str, str, str, str]]:
    git, local = worlds(base)
    settle(git)
    settle(local)
    warm = interleave({"git": ensure(git), "local": ensure(local)}, rounds)
    new = interleave({"git": fresh_venv(git), "local": fresh_venv(local)}, rounds)
    fetched, size = cold_fetch(base, blob_mb)
    entries = verify_setup(base)
    timings = interleave({"verify": verify_in_process(entries),
                          "floor": hash_floor(entries)}, rounds)
    check, floor = timings["verify"], timings["floor"]
    ms = 1000.0
    w_git, w_local = median(warm["git"]), median(warm["local"])
    n_git, n_local = median(new["git"]), median(new["local"])
    return [
        ("warm `ensure`, 20 skills: git / local", f"{w_git * ms:.1f} ms",
         f"{w_local * ms:.1f} ms", f"{w_git / w_local:.2f}x", "<= 1.05x"),
        (f"cold fetch, 1 skill beside a {blob_mb} MB blob: bytes / skill size",
         f"{fetched:,} B", f"{size:,} B", f"{fetched / size:.2f}x", "<= 3x"),
        (f"`verify` check, {VERIFY_SKILLS} skills x {VERIFY_FILES} files (in process)",
         f"{median(check) * ms:.1f} ms", f"{median(floor) * ms:.1f} ms (sha256 alone)",
         f"{median(check) / median(floor):.2f}x", "<= 50 ms"),
        ("new venv, offline, 20 skills: git (locked, cached) / local",
         f"{n_git * ms:.0f} ms", f"{n_local * ms:.0f} ms", f"{n_git / n_local:.2f}x",
         "<= 1.05x"),
    ]


def print_table(rows: list[tuple[str, str, str, str, str]], markdown: bool) -> None:
    head = ("figure", "git", "local / reference", "ratio", "bar")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    raise SystemExit(main())

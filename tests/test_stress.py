"""Concurrency stress: many processes at once on one venv and one skill root.

Eight cold ``ensure`` at once build one venv and install each skill once. Four ``ensure`` race
a ``repair --force`` and two publishers that swap v1 and v2 of a skill, alternately, into the
very root the config's skills come from: every process exits 0 (some after waiting for the
lock), no more venvs are built than the rebuild and one cold start need, a reader never sees a
mixed tree, and one more ``ensure`` leaves the environment ready. ``KB_STRESS=1`` runs more
rounds of each.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.trees.publish import publish, state_dir
from testing.processes import sampling, spawn, start
from testing.skills import Package, make_skill
from testing.world import World

STRESS = bool(os.environ.get("KB_STRESS"))
SKILLS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")


def finish(procs: list[subprocess.Popen[str]], timeout: float = 300
           ) -> list[tuple[int, str, str]]:
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        results.append((p.returncode, out, err))
    return results


def test_eight_cold_ensures_at_once_build_one_venv_and_install_each_skill_once(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    world.write_config(requirements=["requests>=2"])
    for name in SKILLS:
        world.skill(name)
    began = time.monotonic()
    # A slower uv widens the window in which the seven others find the lock held.
    procs = [start(world, "--json", env={"FAKE_UV_DELAY": "0.2"}) for _ in range(8)]
    results = finish(procs)
    seconds = time.monotonic() - began
    assert [code for code, _, _ in results] == [0] * 8, [err for _, _, err in results]
    actions = Counter(json.loads(out)["action"] for _, out, _ in results)
    assert {json.loads(out)["python"] for _, out, _ in results} == {str(world.python)}
    assert len(world.venv_calls()) == 1
    installed = [e for c in world.installs() for e in world.editables(c)]
    assert sorted(installed) == sorted(SKILLS)  # each skill once, by whoever built
    runtime_installs = [c for c in world.installs() if "requests" in c.requirements]
    assert len(runtime_installs) == 1
    assert world.status()["ready"] is True
    print(f"\n8 cold ensures at once: {seconds:.2f} s, actions {dict(actions)}, "
          f"{len(world.uv_calls())} uv calls")


# --- ensure, repair --force and publish, all at once -------------------------------------------

def write_version(src: Path, version: str) -> Path:
    """Skill `demo`, v1 or v2: every file ends with its version, except pyproject.toml, which
    is the same in both. With pyprojects that differ, `repair --force` rightly exits 1 now and
    then: a publish landing between its fix and its final check makes the recorded skill
    stale, and repair says so (seen in 1 of 3 runs here)."""
    files = {"data/table.txt": "row\n" * 50 + f"# {version}\n",
             "data/deep/notes.txt": f"note\n# {version}\n"}
    package = Package(version="1.0", module_text=f"VALUE = {version!r}\n# {version}\n")
    return make_skill(src, "demo", files, description="raced", body=f"# {version}\n",
                      package=package, exist_ok=True)


def classify(live: Path) -> str:
    """v1, v2, or what a reader must never see: missing, partial (vanished under us), mixed.

    Read through the directory's descriptor, as an agent that opened the skill does: a swap
    during the walk must not hand it half of each version. (Walking by path name would, and
    no swap can prevent that.)"""
    try:
        fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return "missing"
    try:
        versions = set(_versions(fd))
    except OSError:
        return "partial"
    finally:
        os.close(fd)
    if not versions:
        return "missing"
    return versions.pop() if len(versions) == 1 else "mixed"


def _versions(fd: int) -> Iterator[str]:
    for name in os.listdir(fd):
        if name == "__pycache__":
            # Bytecode of the skill's modules, cached beside them whenever the venv imports
            # the skill (repair does): the interpreter's, not published content.
            continue
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            try:
                yield from _versions(sub)
            finally:
                os.close(sub)
        elif name != "pyproject.toml":
            f = os.open(name, os.O_RDONLY, dir_fd=fd)
            try:
                yield os.read(f, 1 << 16).decode().rsplit("# ", 1)[-1].strip()
            finally:
                os.close(f)


def publisher(world: World, root: Path, sources: list[Path], rounds: int
              ) -> subprocess.Popen[str]:
    """One process publishing ``sources`` in turn, ``rounds`` times; it stops at a failure."""
    cli = shlex.join([sys.executable, "-m", "bootstrap", "publish"])
    steps = [f"{cli} {shlex.quote(str(s))} --into {shlex.quote(str(root))} --grace 0 "
             "|| exit $?" for _ in range(rounds) for s in sources]
    return spawn(["sh", "-c", "\n".join(steps)], world.env)


@pytest.mark.parametrize("attempt", range(5 if STRESS else 1))
def test_ensures_racing_repair_force_and_publishes_into_the_skill_root_all_succeed(
    tmp_path: Path, attempt: int
) -> None:
    world = World(tmp_path)
    root = tmp_path / "skill-root"
    v1, v2 = write_version(tmp_path / "v1", "v1"), write_version(tmp_path / "v2", "v2")
    publish([v1], root)
    world.write_config(requirements=["requests>=2"], skills=[f"{root}/*"])
    rounds = 6 if STRESS else 3
    began = time.monotonic()
    with sampling(lambda: classify(root / "demo"), pause=0.002) as seen:
        procs = [start(world, env={"FAKE_UV_DELAY": "0.1"}) for _ in range(4)]
        procs.append(spawn(world.command("repair", "--force"), world.env))
        procs.append(publisher(world, root, [v2, v1], rounds))
        procs.append(publisher(world, root, [v1, v2], rounds))
        results = finish(procs)
    seconds = time.monotonic() - began
    names = ["ensure"] * 4 + ["repair --force", "publish", "publish"]
    failed = {f"{n} #{i}": err for i, (n, (code, _, err)) in enumerate(zip(names, results,
                                                                            strict=True))
              if code != 0}
    assert not failed, failed
    builds = len(world.venv_calls())
    assert 1 <= builds <= 2, builds  # repair --force's rebuild, and at most one cold build
    assert seen["mixed"] == seen["partial"] == seen["missing"] == 0, dict(seen)
    assert classify(root / "demo") in ("v1", "v2")
    assert sorted(os.listdir(root)) == ["demo"]
    base = state_dir(root)
    assert os.listdir(base / "staging") == [] and os.listdir(base / "journal") == []
    assert all(stat.S_ISDIR(p.stat().st_mode) for p in (base / "retired").iterdir())

    world.ensure()
    assert world.status()["ready"] is True
    print(f"\nensure x4 + repair --force + 2 publishers x{2 * rounds}: {seconds:.2f} s, "
          f"{builds} venv builds, reader saw {dict(seen)}")

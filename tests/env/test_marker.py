"""The marker: tolerant reads, merges that keep earlier entries, writes that survive faults."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bootstrap.env import marker as m
from bootstrap.env.identity import SCHEMA
from bootstrap.primitives.atomic import write_atomic
from testing.world import World

RUNTIME: m.RuntimeRecord = {"identity": "sha256:abc", "inputs": {}, "python": "/v/bin/python"}


def record(name: str) -> m.SkillRecord:
    return {"path": f"/skills/{name}", "pyproject": "sha256:1", "project": name}


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    path = tmp_path / "venv"
    path.mkdir()
    m.write_marker(path, m.base_marker(RUNTIME))
    return path


def leftovers(venv: Path) -> list[str]:
    return sorted(p.name for p in venv.iterdir() if p.name != m.MARKER_NAME)


def test_merge_keeps_entries_recorded_earlier(venv: Path) -> None:
    m.merge_skills(venv, RUNTIME, m.SkillChanges(installed={"a": record("a")}))
    m.merge_skills(venv, RUNTIME, m.SkillChanges(installed={"b": record("b")}))
    data = m.read_marker(venv).data
    assert data is not None and sorted(data["skills"]) == ["a", "b"]


def test_a_failure_replaces_an_install_record_and_vice_versa(venv: Path) -> None:
    m.merge_skills(venv, RUNTIME, m.SkillChanges(installed={"a": record("a")}))
    failure: m.FailedRecord = {"path": "/skills/a", "pyproject": "sha256:2", "error": "boom"}
    m.merge_skills(venv, RUNTIME, m.SkillChanges(failed={"a": failure}))
    data = m.read_marker(venv).data
    assert data is not None and data["skills"] == {} and data["failed"]["a"]["error"] == "boom"


def test_replace_failing_twice_then_succeeding_still_writes(
        venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.replace
    calls = {"n": 0}

    def flaky(src: Any, dst: Any) -> None:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise PermissionError(errno.EACCES, "file is open in another process")
        real(src, dst)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", flaky)
        m.merge_skills(venv, RUNTIME, m.SkillChanges(installed={"a": record("a")}))
    assert calls["n"] == 3
    data = m.read_marker(venv).data
    assert data is not None and "a" in data["skills"]
    assert leftovers(venv) == []


@pytest.mark.parametrize("seam", ["replace", "fsync", "write"])
def test_a_write_that_always_fails_keeps_the_old_marker_byte_identical(
        venv: Path, monkeypatch: pytest.MonkeyPatch, seam: str) -> None:
    before = m.marker_path(venv).read_bytes()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch, pytest.raises(OSError, match="No space left"):
        patch.setattr(os, seam, broken)
        m.merge_skills(venv, RUNTIME, m.SkillChanges(installed={"a": record("a")}))
    assert m.marker_path(venv).read_bytes() == before
    assert leftovers(venv) == []


def test_write_atomic_never_writes_in_place(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"old")
    inode = target.stat().st_ino
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and target.stat().st_ino != inode


@pytest.mark.parametrize(("content", "state"), [
    (None, "missing"),
    (b"", "corrupt"),
    (b'{"schema": 1, "runtime"', "corrupt"),
    (b"[]", "corrupt"),
    (b"\xff\xfe", "corrupt"),
    (b'{"schema": 99}', "legacy"),
    (b'{"schema": "1"}', "legacy"),
    (b'{"version": "0.3.1"}', "legacy"),
    (json.dumps({"schema": SCHEMA, "runtime": RUNTIME, "skills": {"a": {"path": 1}},
                 "failed": {}, "updated": 0}).encode(), "corrupt"),
])
def test_reading_never_raises(tmp_path: Path, content: bytes | None, state: str) -> None:
    if content is not None:
        (tmp_path / m.MARKER_NAME).write_bytes(content)
    read = m.read_marker(tmp_path)
    assert read.state == state and read.data is None
    if state != "missing":
        assert "marker" in read.problem and str(tmp_path / m.MARKER_NAME) in read.problem


# -- planted markers: never followed, never blocking, never read whole -------------------------

def _bounded_cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI under a 2 GiB address-space limit and a timeout: reading /dev/zero whole or
    blocking on a FIFO fails the test instead of taking the machine down or hanging it."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run(world.command(*args), capture_output=True, text=True, env=world.env,
                          timeout=60, preexec_fn=limit, check=False)


def _plant(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "symlink to /dev/zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)


PLANTS = ["symlink to /dev/zero", "FIFO"]


@pytest.mark.parametrize("kind", PLANTS)
def test_a_planted_marker_is_corrupt_with_a_warning_and_ensure_rebuilds(
        tmp_path: Path, kind: str) -> None:
    world = World(tmp_path)
    world.skill("alpha")
    world.ensure()
    marker = world.venv / m.MARKER_NAME
    _plant(marker, kind)

    status = _bounded_cli(world, "status", "--json")
    assert status.returncode == 1, status.stderr
    report = json.loads(status.stdout)
    assert report["marker"] == "corrupt" and report["ready"] is False
    assert str(marker) in report["why"][0]
    assert "Traceback" not in status.stderr

    world.clear_log()
    ensure = _bounded_cli(world, "ensure", "--json")
    assert ensure.returncode == 0, ensure.stderr
    assert json.loads(ensure.stdout)["action"] == "rebuild"
    assert str(marker) in ensure.stderr and "Traceback" not in ensure.stderr
    assert marker.is_file() and not marker.is_symlink()
    assert m.read_marker(world.venv).state == "ok"


@pytest.mark.parametrize("kind", PLANTS)
def test_a_planted_pyvenv_cfg_neither_hangs_nor_exhausts_memory(tmp_path: Path,
                                                                 kind: str) -> None:
    world = World(tmp_path)
    world.ensure()
    cfg = world.venv / "pyvenv.cfg"
    _plant(cfg, kind)

    status = _bounded_cli(world, "status", "--json")
    assert status.returncode == 1, status.stderr
    report = json.loads(status.stdout)
    assert report["runtime"] == "missing" and str(cfg) in report["why"][0]
    ensure = _bounded_cli(world, "ensure")
    # Whether it rebuilds or refuses a directory it no longer recognises as a venv, it answers
    # within the bound, with one clear line and no traceback.
    assert ensure.returncode in (0, 2), ensure.stderr
    assert "Traceback" not in ensure.stderr

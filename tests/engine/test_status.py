"""The ready gate (engine/status.py) called directly: what it concludes from what lies on disk,
without the lock, uv or a child process. Each case changes one thing another process could."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootstrap.config import load_config
from bootstrap.engine.status import Status, status
from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("notes", python=False)
    w.write_config(requirements=["requests>=2"])
    return w


def _status(world: World) -> Status:
    return status(load_config(world.config))


def _ready(world: World) -> World:
    result = world.ensure()
    assert result.returncode == 0, result.stderr
    return world


def test_a_venv_never_built_is_missing_and_not_ready(world: World) -> None:
    found = _status(world)
    assert (found.ready, found.marker.state, found.runtime) == (False, "missing", "missing")
    assert found.why == [f"no marker in {world.venv}"]
    assert {s.name: s.state for s in found.skills} == {"alpha": "pending", "notes": "installed"}


def test_a_built_venv_is_ready_and_nothing_is_written_by_asking(world: World) -> None:
    _ready(world)
    before = sorted((p, p.stat().st_mtime_ns) for p in world.root.rglob("*") if p.is_file())
    found = _status(world)
    assert found.ready and found.runtime == "current" and found.python == world.python
    assert [(s.name, s.python, s.state) for s in found.skills] == [
        ("alpha", True, "installed"), ("notes", False, "installed")]
    assert sorted((p, p.stat().st_mtime_ns) for p in world.root.rglob("*")
                  if p.is_file()) == before
    calls = len(world.uv_calls())
    _status(world)
    assert len(world.uv_calls()) == calls


def test_an_edited_pyproject_makes_its_skill_stale_and_the_base_stays_current(
        world: World) -> None:
    _ready(world)
    pyproject = world.skills_dir / "alpha" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# edited\n")
    found = _status(world)
    assert not found.ready and found.base_current
    assert found.pending == ["alpha"]


def test_a_changed_requirement_makes_the_runtime_stale_and_says_what_changed(
        world: World) -> None:
    _ready(world)
    world.write_config(requirements=["requests>=2", "six"])
    found = _status(world)
    assert found.runtime == "stale" and not found.base_current
    assert any("six" in line for line in found.why), found.why


def test_a_torn_marker_is_corrupt_and_named(world: World) -> None:
    _ready(world)
    (world.venv / ".bootstrap-version").write_bytes(b'{"schema": 1, "runti')
    found = _status(world)
    assert found.marker.state == "corrupt" and found.runtime == "missing"
    assert str(world.venv / ".bootstrap-version") in found.why[0]


def test_a_missing_interpreter_means_the_runtime_is_missing(world: World) -> None:
    _ready(world)
    world.python.unlink()
    found = _status(world)
    assert found.runtime == "missing"
    assert found.why == [f"interpreter {world.python} does not exist"]


def test_a_skill_no_longer_configured_is_stray(world: World) -> None:
    _ready(world)
    world.write_config(requirements=["requests>=2"], skills=["skills/notes"])
    found = _status(world)
    assert found.stray == ("alpha",) and not found.ready

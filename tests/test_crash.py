"""Real processes, really killed: a SIGKILLed session's work is never redone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testing.processes import kill_group, start, wait_for
from testing.world import World


def hanging_on(world: World, name: str) -> bool:
    return any(name in world.editables(c) for c in world.installs())


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.write_config(requirements=["requests>=2"])
    for name in ("alpha", "beta"):
        w.skill(name)
    return w


def test_a_session_killed_mid_install_resumes_without_redoing_work(world: World) -> None:
    world.ensure()
    world.skill("gamma")
    world.skill("delta")
    world.clear_log()
    proc = start(world, env={"FAKE_UV_HANG": "delta"})
    wait_for(lambda: hanging_on(world, "delta"))
    kill_group(proc)

    # The killed session left a valid marker: runtime current, old skills installed.
    status = world.status()
    assert status["marker"] == "ok" and status["runtime"] == "current"
    states = {s["name"]: s["state"] for s in status["skills"]}
    assert states == {"alpha": "installed", "beta": "installed", "gamma": "pending",
                      "delta": "pending"}

    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert out["action"] == "skills"
    assert sorted(out["installed"]) == ["delta", "gamma"]
    assert world.venv_calls() == []
    installed_now = [e for c in world.installs() for e in world.editables(c)]
    assert "alpha" not in installed_now and "beta" not in installed_now
    assert not any("requests>=2" in c for c in world.installs())
    assert world.status()["ready"] is True


def test_a_cold_session_killed_after_the_runtime_never_rebuilds_it(world: World) -> None:
    proc = start(world, env={"FAKE_UV_HANG": "beta"})
    wait_for(lambda: hanging_on(world, "beta"))
    kill_group(proc)
    assert world.status()["runtime"] == "current"

    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert out["action"] == "skills"
    assert world.venv_calls() == []
    assert not any("requests>=2" in c for c in world.installs())
    assert world.imports("alpha") and world.imports("beta") and world.imports("requests")


def test_a_session_killed_during_isolation_keeps_what_landed(world: World) -> None:
    for name in ("gamma", "delta"):
        world.skill(name)
    # beta fails, so the group is isolated skill by skill in name order (alpha, beta, delta,
    # gamma); gamma hangs there, after alpha and delta landed.
    proc = start(world, env={"FAKE_UV_FAIL": "beta", "FAKE_UV_HANG_ALONE": "gamma"})
    wait_for(lambda: any(world.editables(c) == ["gamma"] for c in world.installs()))
    kill_group(proc)
    marker = world.marker()
    assert sorted(marker["skills"]) == ["alpha", "delta"]
    assert sorted(marker["failed"]) == ["beta"]

    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert sorted(out["installed"]) == ["beta", "gamma"]
    installed_now = [e for c in world.installs() for e in world.editables(c)]
    assert "alpha" not in installed_now and "delta" not in installed_now
    assert world.venv_calls() == []


def test_concurrent_cold_starts_build_once_and_install_each_skill_once(world: World) -> None:
    world.skill("gamma")
    procs = [start(world, env={"FAKE_UV_DELAY": "0.3"}) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [o[1] for o in outs]
    assert {o[0] for o in outs} == {f"{world.python}\n"}
    assert len(world.venv_calls()) == 1
    installed = [e for c in world.installs() for e in world.editables(c)]
    assert sorted(installed) == ["alpha", "beta", "gamma"]


def test_after_a_kill_inside_a_group_the_next_session_installs_in_halves(world: World) -> None:
    world.ensure()
    for name in ("gamma", "delta", "epsilon", "zeta"):
        world.skill(name)
    proc = start(world, env={"FAKE_UV_HANG": "zeta"})
    wait_for(lambda: hanging_on(world, "zeta"))
    kill_group(proc)
    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert sorted(out["installed"]) == ["delta", "epsilon", "gamma", "zeta"]
    groups = [world.editables(c) for c in world.installs()]
    assert [len(g) for g in groups] == [2, 2], groups
    assert "attempt" not in world.marker()

"""SIGTERM, SIGHUP and ^C of a real ``ensure`` child, and a SIGKILL that spares its children.

Each signal goes to the ``ensure`` process alone (as ``timeout(1)``, ``docker stop`` and
``kill PID`` send it), never to its group: the test then looks at what another process sees.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bootstrap.env import generations
from bootstrap.primitives.lock import holder_path, inspect, lock_path
from testing.processes import alive, session_members, spawn, start, wait_for
from testing.uvlog import read_uv_entries
from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.write_config(requirements=["requests>=2"])
    w.skill("alpha")
    return w


def installing(world: World, name: str) -> bool:
    return any(name in world.editables(c) for c in world.installs())


def uv_pids(world: World) -> list[int]:
    return [int(e["pid"]) for e in read_uv_entries(world.uv_log)]


def leftovers(world: World) -> list[str]:
    """What lies beside the venv other than the venv (its current generation), its lock and a
    holder record."""
    venv = world.venv
    current = generations.current(venv)
    return sorted(p.name for p in venv.parent.iterdir()
                  if p.name.startswith(f".{venv.name}.") and p != current)


def assert_released(world: World, proc: subprocess.Popen[str]) -> None:
    """Nothing of the session is left: no process, no lock, no holder record, no scratch."""
    assert session_members(proc.pid) == []
    assert not inspect(world.venv).held
    assert lock_path(world.venv).exists()  # the lock file is never deleted
    assert not holder_path(world.venv).exists()
    assert leftovers(world) == []


@pytest.mark.parametrize(("signum", "code", "said"), [
    (signal.SIGTERM, 143, "terminated"),
    (signal.SIGHUP, 129, "hung up"),
    (signal.SIGINT, 130, "interrupted"),
])
def test_a_signal_during_a_skill_install_stops_uv_and_cleans_up_before_the_lock_goes(
        world: World, signum: signal.Signals, code: int, said: str) -> None:
    world.ensure()
    world.skill("slow")
    world.clear_log()
    proc = start(world, env={"FAKE_UV_HANG": "slow"})
    wait_for(lambda: installing(world, "slow"), proc=proc)
    wait_for(lambda: any(n.startswith(".venv.work-") for n in leftovers(world)), proc=proc)
    [uv_pid] = uv_pids(world)
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=30)

    assert proc.returncode == code, err
    assert err.rstrip().splitlines()[-1] == said
    assert not alive(uv_pid)
    assert_released(world, proc)
    states = {s["name"]: s["state"] for s in world.status()["skills"]}
    assert states == {"alpha": "installed", "slow": "pending"}

    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert (out["action"], out["installed"]) == ("skills", ["slow"])
    assert world.imports("slow") and world.status()["ready"] is True


def test_sigterm_during_a_rebuild_removes_the_staging_venv_and_keeps_the_old_one(
        world: World) -> None:
    world.ensure()
    world.write_config(requirements=["requests>=2", "idna>=3"])
    world.clear_log()
    proc = start(world, env={"FAKE_UV_HANG": "idna"})
    wait_for(lambda: any("idna>=3" in c for c in world.installs()), proc=proc)
    # The new runtime is being built in a generation of its own beside the current one.
    assert any(n.startswith((".venv.stage-", ".venv.gen-")) for n in leftovers(world))
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=30)

    assert proc.returncode == 143, err
    assert_released(world, proc)
    status = world.status()
    assert status["marker"] == "ok" and status["runtime"] == "stale"
    assert world.imports("alpha") and world.imports("requests")  # the old venv, untouched
    out = json.loads(world.ensure("--json").stdout)
    assert out["action"] == "rebuild" and world.imports("idna")


def test_a_hangup_ignored_when_we_started_stays_ignored(world: World) -> None:
    world.skill("slow")
    proc = spawn(world.command("ensure"), {**world.env, "FAKE_UV_HANG": "slow"},
                 ignore=(signal.SIGHUP,))
    wait_for(lambda: installing(world, "slow"), proc=proc)
    os.kill(proc.pid, signal.SIGHUP)  # as under nohup: carry on
    time.sleep(0.5)
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert_released(world, proc)


def test_a_sigkilled_sessions_uv_keeps_the_lock_until_it_exits(world: World) -> None:
    world.ensure()
    world.skill("slow")
    world.clear_log()
    proc = start(world, env={"FAKE_UV_DELAY": "6"})  # long enough for a loaded machine
    wait_for(lambda: installing(world, "slow"), proc=proc)
    [orphan] = uv_pids(world)
    os.kill(proc.pid, signal.SIGKILL)  # the session alone: its uv lives on, holding the lock
    proc.communicate(timeout=10)

    waited = world.ensure("--lock-timeout", "0.5", ok=False)
    assert waited.returncode == 1 and "timed out" in waited.stderr
    assert f"held by what pid {proc.pid} started (pid {proc.pid} has exited)" in waited.stderr
    assert "lsof" in waited.stderr
    assert world.status()["lock"]["held"] is True
    # The next session waits for the orphan: no uv of its own starts while that one lives.
    nxt = start(world)
    while alive(orphan):
        assert uv_pids(world) == [orphan]
        time.sleep(0.01)
    _, err = nxt.communicate(timeout=60)
    assert nxt.returncode == 0, err
    assert world.status()["ready"] is True and world.imports("slow")

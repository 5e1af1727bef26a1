"""Failures back off: a failure that repeats with unchanged inputs is retried after 1 min, then
2, 4, ... up to 60; between retries the start is warm (no uv); a change of inputs, ``--retry``
and ``repair`` retry at once. Time is moved with ``$KERNEL_BOOTSTRAP_TEST_NOW``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap import warm
from bootstrap.skills import backoff
from testing.clock import T0, at
from testing.processes import spawn
from testing.seams import Seam, seam_argv, seam_env
from testing.world import World

BROKEN = {"FAKE_UV_FAIL": "beta"}


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("beta")
    return w


def _fail_twice(world: World) -> None:
    """beta fails twice in a row at T0: the second failure backs off for a minute."""
    for _ in range(2):
        world.ensure(env=at(0, **BROKEN))
    world.clear_log()


def _skill(world: World, name: str, **env: str) -> dict[str, object]:
    result = world.run("status", "--json", env=env)
    entry: dict[str, object] = {s["name"]: s for s in json.loads(result.stdout)["skills"]}[name]
    return entry


def test_the_delays_double_from_one_minute_to_an_hour() -> None:
    assert [backoff.delay(n) for n in range(1, 10)] == [
        0, 60, 120, 240, 480, 960, 1920, 3600, 3600]
    assert backoff.delay(10_000) == 3600


def test_a_first_failure_is_retried_at_the_next_start(world: World) -> None:
    world.ensure(env=at(0, **BROKEN))
    world.clear_log()
    world.ensure(env=at(0, **BROKEN))
    assert [c.editables for c in world.installs()] == [["beta"]]


def test_a_repeated_failure_is_not_retried_before_its_time_and_the_start_is_warm(
        world: World) -> None:
    _fail_twice(world)
    assert _skill(world, "beta", **at(1)) | {"error": ""} == {
        "name": "beta", "python": True, "state": "failed", "error": "", "warnings": [],
        "failures": 2, "retry_at": backoff.iso(T0 + 60),
        "path": str(world.skills_dir / "beta")}
    for seconds in (1, 30, 59):
        result = world.ensure("--json", env=at(seconds, **BROKEN))
        out = json.loads(result.stdout)
        assert out["action"] == "ready"
        assert [f["name"] for f in out["failed"]] == ["beta"]
        assert "fake build failure" in out["failed"][0]["error"]
        assert "skill=beta" in result.stderr or '"skill": "beta"' in result.stderr
        assert world.ensure("--strict", env=at(seconds), ok=False).returncode == 3
    assert world.uv_calls() == []

    # Due: retried, and failing again it waits twice as long.
    world.ensure(env=at(60, **BROKEN))
    assert [c.editables for c in world.installs()] == [["beta"]]
    assert _skill(world, "beta", **at(60))["retry_at"] == backoff.iso(T0 + 60 + 120)
    world.clear_log()
    world.ensure(env=at(60 + 119, **BROKEN))
    assert world.uv_calls() == []
    world.ensure(env=at(60 + 120))
    assert [c.editables for c in world.installs()] == [["beta"]]
    assert world.imports("beta") and _skill(world, "beta")["state"] == "installed"


def _warm(world: World, seconds: float, *args: str) -> subprocess.CompletedProcess[str]:
    """``ensure`` with ``args``, asserting that the warm path answered: it imports none of the
    full path's modules (python -X importtime)."""
    cmd = [sys.executable, "-X", "importtime", "-m", "bootstrap", "ensure", *args,
           "--config", str(world.config)]
    result = subprocess.run(cmd, capture_output=True, text=True,
                            env={**world.env, **at(seconds)}, check=False)
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "bootstrap.warm" in imported and "bootstrap.config" not in imported
    return result


def test_between_retries_ensure_takes_the_warm_path(world: World) -> None:
    _fail_twice(world)
    world.ensure(env=at(1, **BROKEN))  # a full check that saves the fingerprint
    result = _warm(world, 2, "--json", "--log-format", "json")
    assert result.returncode == 0
    assert [f["name"] for f in json.loads(result.stdout)["failed"]] == ["beta"]
    warning = json.loads(next(line for line in result.stderr.splitlines()
                              if line.startswith("{")))
    assert warning["level"] == "warning" and warning["skill"] == "beta"
    assert warning["retry_at"] == backoff.iso(T0 + 60)
    # Once due, the fingerprint no longer holds: the full path retries.
    world.ensure(env=at(61, **BROKEN))
    assert [c.editables for c in world.installs()] == [["beta"]]


def test_an_edited_pyproject_retries_at_once(world: World) -> None:
    _fail_twice(world)
    world.skill("beta", version="0.2.0")
    out = json.loads(world.ensure("--json", env=at(5)).stdout)
    assert out["installed"] == ["beta"] and out["failed"] == []


def test_a_changed_runtime_retries_at_once(world: World) -> None:
    _fail_twice(world)
    world.write_config(uv_args=["--link-mode", "copy"])
    out = json.loads(world.ensure("--json", env=at(5)).stdout)
    assert out["action"] == "rebuild" and "beta" in out["installed"]


@pytest.mark.parametrize("command", [("ensure", "--retry"), ("repair",)])
def test_retry_and_repair_retry_at_once(world: World, command: tuple[str, ...]) -> None:
    _fail_twice(world)
    result = world.run(*command, env=at(5))
    assert result.returncode == 0, result.stderr
    assert [c.editables for c in world.installs()] == [["beta"]]
    assert _skill(world, "beta")["state"] == "installed"


def test_a_failure_recorded_before_backoff_existed_is_retried_and_counts_once(
        world: World) -> None:
    world.ensure(env=at(0, **BROKEN))
    marker = world.marker()
    for key in ("failures", "retry_at"):
        del marker["failed"]["beta"][key]
    (world.venv / ".bootstrap-version").write_text(json.dumps(marker))
    world.clear_log()
    world.ensure(env=at(0, **BROKEN))
    assert [c.editables for c in world.installs()] == [["beta"]]
    assert _skill(world, "beta")["failures"] == 2


# -- a failed rebuild ----------------------------------------------------------------------------

def test_a_failed_rebuild_backs_off_keeps_the_old_venv_and_retries_on_a_change(
        world: World) -> None:
    world.ensure(env=at(0))
    world.write_config(requirements=["requests"])
    for _ in range(2):
        result = world.run("ensure", env=at(0, FAKE_UV_FAIL="requests"))
        assert result.returncode == 1 and "requests" in result.stderr
    world.clear_log()
    # The failing session told the warm path: the very next start answers from it.
    result = _warm(world, 30)
    assert result.returncode == 1 and result.stdout == ""
    assert "fake download failure for requests" in result.stderr
    assert backoff.iso(T0 + 60) in result.stderr and "--retry" in result.stderr
    assert world.imports("alpha"), "the old venv is left as it was"
    # The full path gives the same answer (a fingerprint cache that is gone changes nothing).
    fingerprint = warm.fingerprint_path(str(world.config))
    assert fingerprint is not None
    Path(fingerprint).unlink()
    again = world.run("ensure", env=at(40, FAKE_UV_FAIL="requests"))
    assert again.returncode == 1 and again.stdout == ""
    assert "fake download failure for requests" in again.stderr
    assert backoff.iso(T0 + 60) in again.stderr
    assert world.uv_calls() == []
    status = json.loads(world.run("status", "--json", env=at(30)).stdout)
    assert status["runtime"] == "failed"
    assert status["rebuild"]["failures"] == 2
    assert status["rebuild"]["retry_at"] == backoff.iso(T0 + 60)
    assert "fake download failure" in status["rebuild"]["error"]

    assert world.run("ensure", "--retry", env=at(31, FAKE_UV_FAIL="requests")).returncode == 1
    assert world.venv_calls() != []
    world.clear_log()
    world.write_config(requirements=["requests", "six"])  # other inputs: tried at once
    out = json.loads(world.ensure("--json", env=at(32)).stdout)
    assert out["action"] == "rebuild" and world.venv_calls() != []
    assert "rebuild" not in json.loads(world.run("status", "--json").stdout)
    assert not (world.venv.parent / "venv.rebuild-failed").exists()


def test_a_skill_failing_because_of_its_dependency_is_retried_with_the_fixed_dependency(
        world: World) -> None:
    world.skill("gamma", deps=("beta",))
    broken = {"FAKE_UV_FAIL": "beta", "FAKE_UV_OFFINDEX": "beta"}
    for _ in range(2):
        world.ensure(env=at(0, **broken))
    assert _skill(world, "gamma", **at(1))["failures"] == 2
    world.clear_log()
    world.ensure(env=at(1, **broken))
    assert world.uv_calls() == [], "both back off: no uv call, not even for gamma's group"
    world.skill("beta", version="0.2.0")  # fixed: beta is tried at once, and gamma with it
    out = json.loads(world.ensure("--json", env=at(2)).stdout)
    assert sorted(out["installed"]) == ["beta", "gamma"] and out["failed"] == []


def _failing_rebuild(world: World) -> dict[str, str]:
    world.ensure(env=at(0))
    world.write_config(requirements=["requests"])
    return at(0, FAKE_UV_FAIL="requests")


def test_killed_while_recording_a_failed_rebuild_leaves_a_whole_record_or_none(
        world: World) -> None:
    env = _failing_rebuild(world)
    assert world.run("ensure", env=env).returncode == 1  # failure 1 is recorded
    kill = Seam(call="replace", action="kill", match="venv.rebuild-failed")
    killed = spawn(seam_argv(["ensure", "--config", str(world.config)]),
                   seam_env({**world.env, **env}, kill))
    killed.communicate(timeout=120)
    assert killed.returncode == -9
    record = json.loads((world.root / "venv.rebuild-failed").read_text())
    assert record["failures"] == 1, "the killed write changed nothing"
    assert [p.name for p in world.root.glob(".venv.rebuild-failed.tmp-*")] != []
    assert world.run("ensure", env=env).returncode == 1  # failure 2, and the leftover reaped
    assert json.loads((world.root / "venv.rebuild-failed").read_text())["failures"] == 2
    assert list(world.root.glob(".venv.rebuild-failed.tmp-*")) == []


def test_a_full_disk_for_the_record_still_reports_uvs_error(world: World) -> None:
    env = _failing_rebuild(world)
    full = Seam(call="write", action="ENOSPC", match="venv.rebuild-failed")
    result = subprocess.run(seam_argv(["ensure", "--config", str(world.config)]),
                            capture_output=True, text=True,
                            env=seam_env({**world.env, **env}, full), timeout=120, check=False)
    assert result.returncode == 1
    assert "fake download failure for requests" in result.stderr
    assert "could not record the failed rebuild" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (world.root / "venv.rebuild-failed").exists()
    assert world.imports("alpha")

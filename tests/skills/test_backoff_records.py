"""Backoff records are read as untrusted: a forged or far-future ``retry_at`` (in the marker's
``failed`` entries and in ``<venv>.rebuild-failed``) neither crashes a command nor blocks retries
for longer than the longest delay, and a rebuild that failed offline is retried online."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootstrap import warm
from bootstrap.skills import backoff
from testing.clock import T0, at
from testing.world import World

DAY = 86400.0


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("beta")
    return w


# Valid JSON (Python's json reads and writes Infinity and NaN) that no clock of ours writes.
FORGED = ["1e308", "Infinity", "-Infinity", "NaN", "-1", "-1e308", "1" + "0" * 400, '"soon"',
          "true", "null"]


def _forge(path: Path, retry_at: str, failures: str = "2") -> None:
    record = json.loads(path.read_text())
    entry = record["failed"]["beta"] if "failed" in record else record
    entry["retry_at"] = "RETRY_AT"
    entry["failures"] = "FAILURES"
    text = json.dumps(record).replace('"RETRY_AT"', retry_at).replace('"FAILURES"', failures)
    path.write_text(text)


def _run(world: World, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bootstrap", "--config", str(world.config), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env={**world.env, **env},
                          timeout=120, check=False)


def _every_command(world: World,
                   env: dict[str, str]) -> dict[str, subprocess.CompletedProcess[str]]:
    results = {
        "status": _run(world, "status", env=env),
        "status --json": _run(world, "status", "--json", env=env),
        "ensure": _run(world, "ensure", env=env),
        "run": _run(world, "run", "--", "-c", "print('kernel up')", env=env),
    }
    for name, result in results.items():
        assert "Traceback" not in result.stderr, (name, result.stderr)
        assert "OverflowError" not in result.stderr, (name, result.stderr)
    json.loads(results["status --json"].stdout)
    return results


@pytest.mark.parametrize("retry_at", FORGED)
def test_a_forged_retry_time_in_the_marker_breaks_no_command(world: World, retry_at: str) -> None:
    for _ in range(2):
        world.ensure(env=at(0, FAKE_UV_FAIL="beta"))
    _forge(world.venv / ".bootstrap-version", retry_at, failures="1" + "0" * 30)
    results = _every_command(world, at(1, FAKE_UV_FAIL="beta"))
    assert results["ensure"].returncode == 0
    assert results["run"].returncode == 0 and results["run"].stdout == "kernel up\n"
    beta = {s["name"]: s for s in json.loads(results["status --json"].stdout)["skills"]}["beta"]
    assert beta["state"] == "failed"
    if "retry_at" in beta:  # shown only while it backs off; never beyond the longest delay
        assert beta["retry_at"] <= backoff.iso(T0 + 1 + backoff.LONGEST_DELAY)


def _failed_rebuild(world: World) -> Path:
    world.ensure(env=at(0))
    world.write_config(requirements=["requests"])
    for _ in range(2):
        assert world.run("ensure", env=at(0, FAKE_UV_FAIL="requests")).returncode == 1
    world.clear_log()
    return world.root / "venv.rebuild-failed"


@pytest.mark.parametrize("retry_at", FORGED)
def test_a_forged_retry_time_in_the_rebuild_record_breaks_no_command(
        world: World, retry_at: str) -> None:
    _forge(_failed_rebuild(world), retry_at)
    results = _every_command(world, at(1, FAKE_UV_FAIL="requests"))
    # The rebuild is refused (backing off) or retried and fails again: exit 1 either way, and
    # `run` starts the earlier runtime.
    assert results["ensure"].returncode == 1
    assert "fake download failure for requests" in results["ensure"].stderr
    assert results["run"].returncode == 0 and results["run"].stdout == "kernel up\n"
    rebuild = json.loads(results["status --json"].stdout)["rebuild"]
    assert rebuild["retry_at"] <= backoff.iso(T0 + 1 + backoff.LONGEST_DELAY)


def test_a_skill_failure_recorded_by_a_clock_30_days_ahead_is_retried_at_the_next_start(
        world: World) -> None:
    for _ in range(2):
        world.ensure(env=at(0, FAKE_UV_FAIL="beta"))
    _forge(world.venv / ".bootstrap-version", repr(T0 + 30 * DAY))
    world.clear_log()
    # No failure of ours waits more than an hour: this one's wait means nothing. Retried, it is
    # recorded again by this clock, and backs off from now.
    world.ensure(env=at(1, FAKE_UV_FAIL="beta"))
    assert [c.editables for c in world.installs()] == [["beta"]]
    beta = {s["name"]: s for s in world.status()["skills"]}["beta"]
    assert beta["failures"] == 3
    world.ensure(env=at(2 + backoff.delay(3)))
    assert world.imports("beta")


def test_a_rebuild_failure_recorded_by_a_clock_30_days_ahead_is_retried_at_the_next_start(
        world: World) -> None:
    _forge(_failed_rebuild(world), repr(T0 + 30 * DAY))
    status = json.loads(world.run("status", "--json", env=at(1)).stdout)
    assert status["runtime"] == "failed" and status["rebuild"]["retry_at"] <= backoff.iso(T0 + 1)
    out = json.loads(world.ensure("--json", env=at(2)).stdout)
    assert out["action"] == "rebuild" and world.venv_calls() != []
    assert world.imports("requests")


def test_a_rebuild_that_failed_offline_is_retried_online(world: World) -> None:
    world.ensure(env=at(0))
    world.write_config(requirements=["requests"], offline=True)
    for _ in range(2):  # the package is in no cache: offline, it cannot be had
        assert world.run("ensure", env=at(0, FAKE_UV_FAIL="requests")).returncode == 1
    world.clear_log()
    assert world.run("ensure", env=at(1, FAKE_UV_FAIL="requests")).returncode == 1
    assert world.venv_calls() == [], "offline, the failure backs off"
    world.write_config(requirements=["requests"], offline=False)  # the fix
    out = json.loads(world.ensure("--json", env=at(2)).stdout)
    assert out["action"] == "rebuild" and world.venv_calls() != []
    assert world.imports("requests")


@pytest.mark.parametrize("how", ["config", "environment"])
def test_a_skill_that_failed_offline_is_retried_online(world: World, how: str) -> None:
    offline = {"KERNEL_BOOTSTRAP_OFFLINE": "1"} if how == "environment" else {}
    if how == "config":
        world.write_config(offline=True)
    for _ in range(2):
        world.ensure(env=at(0, FAKE_UV_FAIL="beta", **offline))
    world.clear_log()
    world.ensure(env=at(1, FAKE_UV_FAIL="beta", **offline))
    assert world.uv_calls() == [], "offline, the failure backs off"
    if how == "config":
        world.write_config(offline=False)  # the fix
    out = json.loads(world.ensure("--json", env=at(2)).stdout)
    assert out["installed"] == ["beta"] and out["failed"] == []
    assert world.imports("beta")


_JSON = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                  st.lists(st.integers(), max_size=2))


@given(error=_JSON, failures=_JSON, retry_at=_JSON)
def test_any_record_is_a_failure_that_prints_or_none(error: object, failures: object,
                                                      retry_at: object) -> None:
    failure = backoff.from_record({"error": error, "failures": failures, "retry_at": retry_at})
    if failure is not None:
        assert 1 <= failure.failures <= backoff.MAX_FAILURES
        assert 0 <= failure.retry_at <= warm.now() + backoff.LONGEST_DELAY
        json.dumps(failure.as_json())
        backoff.backed_off_message(failure).encode()


def _fingerprint_holds(world: World, env: dict[str, str]) -> bool:
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        return warm.holds(str(world.config)) is not None


def test_a_warm_refusal_recorded_by_a_clock_30_days_ahead_is_retried_at_the_next_start(
        world: World) -> None:
    ahead = 30 * DAY
    world.ensure(env=at(ahead))
    world.write_config(requirements=["requests"])
    for _ in range(3):  # two failures, then a refusal inside the window, which the warm path keeps
        assert world.run("ensure", env=at(ahead, FAKE_UV_FAIL="requests")).returncode == 1
    assert _fingerprint_holds(world, at(ahead)), "the refusal is answered warm"
    world.clear_log()
    # The clock came back 30 days: the warm path decides as the full path does (due), not
    # "not retrying before <30 days later>" with no uv run.
    out = json.loads(world.ensure("--json", env=at(61 * 60)).stdout)
    assert out["action"] == "rebuild" and world.venv_calls() != []
    assert world.imports("requests")


def test_a_warm_skill_failure_recorded_by_a_clock_30_days_ahead_is_retried_at_the_next_start(
        world: World) -> None:
    ahead = 30 * DAY
    for _ in range(3):  # the third start finds beta backing off and saves that
        world.ensure(env=at(ahead, FAKE_UV_FAIL="beta"))
    assert _fingerprint_holds(world, at(ahead)), "the backoff is answered warm"
    world.clear_log()
    out = json.loads(world.ensure("--json", env=at(1)).stdout)
    assert [c.editables for c in world.installs()] == [["beta"]]
    assert out["failed"] == [] and world.imports("beta")


def test_the_warm_path_and_backoff_read_a_retry_time_by_one_rule() -> None:
    for offset in (-1.0, 0.0, 1.0, backoff.LONGEST_DELAY - 1, backoff.LONGEST_DELAY + 1, 30 * DAY):
        when = warm.now() + offset
        recorded = backoff.from_record({"error": "x", "retry_at": when})
        assert recorded is not None
        assert recorded.retry_at == warm.believed(when)

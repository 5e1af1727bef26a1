"""The bootstrap lock: bounded waits that name the holder, and a dead holder frees it at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.primitives.lock import holder_path, inspect, lock_path
from testing.world import World

HOLDER = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from bootstrap.primitives.lock import hold, lock_path\n"
    "with hold(lock_path(Path(sys.argv[1])), 60):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(float(sys.argv[2]))\n"
)
ANNOUNCEMENT = "to release the bootstrap lock"


def hold_lock(venv: Path, seconds: float = 60) -> subprocess.Popen[str]:
    """A child process holding the lock of ``venv``, in a session of its own."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(venv), str(seconds)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    return w


@pytest.fixture
def holder(world: World) -> Iterator[subprocess.Popen[str]]:
    proc = hold_lock(world.venv)
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def timed_ensure(world: World, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = world.ensure(*args, ok=False)
    return result, time.monotonic() - started


def test_a_lock_timeout_exits_1_in_time_naming_the_holder(
    world: World, holder: subprocess.Popen[str]
) -> None:
    result, elapsed = timed_ensure(world, "--lock-timeout", "1")
    assert result.returncode == 1
    assert elapsed >= 1.0  # it waited the whole timeout (how much longer is load, not the tool)
    assert result.stdout == ""
    assert f"held by pid {holder.pid}" in result.stderr
    assert f"kill {holder.pid}" in result.stderr
    assert "kernel-bootstrap status" in result.stderr
    assert "Traceback" not in result.stderr
    # Under ~2 s there is nothing to announce: the error says it all.
    assert ANNOUNCEMENT not in result.stderr
    assert world.uv_calls() == [] and not world.venv.exists()


def test_a_longer_wait_says_once_whom_it_waits_for(
    world: World, holder: subprocess.Popen[str]
) -> None:
    result, elapsed = timed_ensure(world, "--lock-timeout", "3")
    assert result.returncode == 1
    assert elapsed >= 3.0
    waiting = [line for line in result.stderr.splitlines() if ANNOUNCEMENT in line]
    assert len(waiting) == 1
    assert f"waiting for pid {holder.pid} {ANNOUNCEMENT}" in waiting[0]


def test_status_reports_the_holder_at_once_without_waiting(
    world: World, holder: subprocess.Popen[str]
) -> None:
    # The holder keeps the lock until the test ends: a status that waited would never return.
    status = world.status()
    assert status["lock"] == {"held": True, "pid": holder.pid}
    text = world.run("status").stdout
    assert f"busy:    yes, pid {holder.pid} holds the venv's lock" in text


def test_a_killed_holder_releases_the_lock_at_once(
    world: World, holder: subprocess.Popen[str]
) -> None:
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    assert world.status()["lock"] == {"held": False, "pid": None}
    # No wait at all is allowed, and none is needed: the kernel released the flock.
    result, _ = timed_ensure(world, "--lock-timeout", "0")
    assert result.returncode == 0, result.stderr
    assert world.imports("alpha")


def test_a_waiter_proceeds_when_the_holder_finishes(world: World) -> None:
    proc = hold_lock(world.venv, seconds=0.5)
    result, _ = timed_ensure(world, "--lock-timeout", "30")
    proc.wait(timeout=10)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{world.python}\n"


def test_a_ready_environment_never_waits_for_the_lock(world: World) -> None:
    world.ensure()
    proc = hold_lock(world.venv)
    try:
        result, _ = timed_ensure(world, "--lock-timeout", "0")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    # With the lock held and no wait allowed, taking it would have failed (exit 1).
    assert result.returncode == 0, result.stderr


def test_the_holder_records_its_pid_and_start_time_and_clears_it_on_release(
    world: World,
) -> None:
    proc = hold_lock(world.venv, seconds=0.3)
    record = json.loads(holder_path(world.venv).read_text())
    assert record["pid"] == proc.pid
    assert abs(record["started"] - time.time()) < 30
    proc.wait(timeout=10)
    assert not holder_path(world.venv).exists()
    assert lock_path(world.venv).exists()  # never deleted: waiters must share one inode


def test_status_on_a_cold_machine_creates_no_lock(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.write_config(venv="state/venv")
    result = world.run("status", "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["lock"] == {"held": False, "pid": None}
    assert not (tmp_path / "state").exists()
    assert inspect(tmp_path / "state" / "venv").held is False
    assert not (tmp_path / "state").exists()


# --- what the lock finds on disk beside the venv --------------------------------------------


@pytest.mark.parametrize("planted", ["symlink", "hard link"])
def test_a_holder_record_planted_as_a_link_is_never_written_through(
    world: World, tmp_path: Path, planted: str
) -> None:
    victim = tmp_path / "victim.conf"
    victim.write_bytes(b"someone else's bytes\n")
    holder = holder_path(world.venv)
    holder.parent.mkdir(parents=True, exist_ok=True)
    if planted == "symlink":
        holder.symlink_to(victim)
    else:
        os.link(victim, holder)
    world.ensure()
    assert victim.read_bytes() == b"someone else's bytes\n"
    proc = hold_lock(world.venv, seconds=0.3)  # and the record is written, as a file of ours
    assert json.loads(holder.read_text())["pid"] == proc.pid and not holder.is_symlink()
    proc.wait(timeout=10)
    assert victim.read_bytes() == b"someone else's bytes\n"


def test_a_venv_under_a_symlink_loop_is_a_config_error_that_says_so(tmp_path: Path) -> None:
    world = World(tmp_path)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    world.write_config(venv="loop/venv")
    result = world.ensure(ok=False)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "symlink loop" in result.stderr and str(tmp_path / "loop") in result.stderr


@pytest.mark.parametrize("planted", ["symlink", "dangling symlink", "directory"])
def test_something_planted_at_the_lock_is_named_with_what_to_do(
        world: World, tmp_path: Path, planted: str) -> None:
    # Every cold ensure, repair and gc failed with a bare "[Errno 40] Too many levels of
    # symbolic links" (or "Is a directory") and no hint (issue 22).
    victim = tmp_path / "victim"
    victim.write_text("someone else's\n")
    lock = lock_path(world.venv)
    if planted == "directory":
        lock.mkdir()
        found, remove = "is a directory", f"rm -r {lock}"
    else:
        lock.symlink_to(victim if planted == "symlink" else tmp_path / "nowhere")
        found, remove = "is a symbolic link (to ", f"rm {lock}"
    for command in (["ensure"], ["repair"], ["gc"]):
        result = world.run(*command)
        assert result.returncode == 1, (command, result.stderr)
        assert f"{lock} {found}" in result.stderr and remove in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and "Errno" not in result.stderr
    assert victim.read_text() == "someone else's\n"
    assert not (tmp_path / "nowhere").exists()
    if planted == "directory":
        lock.rmdir()
    else:
        lock.unlink()
    assert world.ensure().stdout == f"{world.python}\n"  # and as told, that was all

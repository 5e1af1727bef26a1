"""The kernel test kit (testing/kernels.py): the orphan check and the fixture that runs it after
every integration test catch a leaked kernel, end a live server without mistaking the kernels it
forked for it, and the probe times real kernels started one by one and many at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing import innerpytest, kernels, reaper
from testing.kernelworlds import KernelWorlds
from testing.processes import default_signals, wait_for
from tests.integration.conftest import RealWorld, kernel_world_copy

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

SLEEP = "import time; time.sleep(600)"


def kernel_argv(token: str) -> list[str]:
    """A process that looks like a kernel to the check (an ipykernel argv) and just sleeps."""
    return [sys.executable, "-c", SLEEP, "-m", "ipykernel_launcher", "-f", f"{token}.json"]


def spawn_marked(argv: list[str], tag: str) -> subprocess.Popen[bytes]:
    """A child carrying ``TAG=tag``, in a session of its own (as a server's kernels are), every
    signal at its default (the suite's launcher may have left SIGTERM ignored)."""
    return subprocess.Popen(argv, env={**os.environ, reaper.TAG: tag},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=default_signals)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The children a test starts, killed and reaped at its end whatever happened."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_the_check_names_and_kills_a_leaked_kernel_of_the_test_and_nothing_else(
        spawned: list[subprocess.Popen[bytes]]) -> None:
    tag, other_tag = reaper.new_tag(), reaper.new_tag()
    leaked = spawn_marked(kernel_argv("leaked"), tag)
    others = spawn_marked(kernel_argv("others"), other_tag)
    not_a_kernel = spawn_marked(["sleep", "600"], tag)
    spawned += [leaked, others, not_a_kernel]
    wait_for(lambda: len(kernels.kernel_processes(tag)) == 1)
    with pytest.raises(AssertionError, match=rf"left running: {leaked.pid} .*ipykernel_launcher"):
        kernels.assert_no_orphans(tag, grace=0.2)
    assert leaked.wait(timeout=10) == -signal.SIGKILL
    # Another test's kernel, and the test's own non-kernel children (the reaper's), stay.
    assert others.poll() is None and not_a_kernel.poll() is None
    kernels.assert_no_orphans(tag, grace=0.2)  # nothing left: passes


def test_a_process_is_the_tests_when_its_command_line_names_the_tests_directory(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    # As a server started with a scrubbed environment would be: no tag, but its --config.
    mine = subprocess.Popen([*kernel_argv("x"), "--config", str(tmp_path / "k.toml")],
                            env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]})
    # A sibling directory whose name starts with ours is another test's.
    sibling = subprocess.Popen([*kernel_argv("y"), "--config", f"{tmp_path}0/k.toml"],
                               env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]})
    spawned += [mine, sibling]
    wait_for(lambda: alive(mine.pid) and alive(sibling.pid))
    found = [p.pid for p in kernels.kernel_processes(None, [tmp_path])]
    assert found == [mine.pid]


# A stand-in for a kernel server: holds its lock open, forks a "kernel" (same command line, its
# own session, the lock closed, as a fork of the real server is) and waits; SIGTERM ends it.
FAKE_SERVER = """
import os, sys, time
if sys.argv[-1] == "late":
    time.sleep(0.5)
lock = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
if sys.argv[-1] == "kernel" and os.fork() == 0:
    os.close(lock)
    os.setsid()
    time.sleep(600)
with open(sys.argv[2], "w") as f:
    f.write("up")
time.sleep(600)
"""


def fake_server(tmp_path: Path, tag: str, extra: str = "") -> subprocess.Popen[bytes]:
    """The fake server; ``extra``: "kernel" (it forks one), "late" (its lock comes 0.5 s
    after it starts: not waited for here)."""
    lock = tmp_path / "cache" / "kernels" / "%2Fvenv" / "lock"
    lock.parent.mkdir(parents=True)
    up = tmp_path / "up"
    argv = [sys.executable, "-c", FAKE_SERVER, str(lock), str(up), "bootstrap", "serve"]
    proc = spawn_marked([*argv, extra] if extra else argv, tag)
    wait_for(up.exists if extra != "late" else lambda: alive(proc.pid))
    return proc


def test_a_live_server_is_ended_by_the_check_and_not_reported(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    tag = reaper.new_tag()
    server = fake_server(tmp_path, tag)
    spawned.append(server)
    kernels.assert_no_orphans(tag, grace=5.0)
    assert server.wait(timeout=10) == -signal.SIGTERM


def test_a_server_that_takes_its_lock_after_the_test_ended_is_ended_too(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    # A first kernel start spawns its server without waiting: the test may end before it has
    # its lock.
    tag = reaper.new_tag()
    server = fake_server(tmp_path, tag, "late")
    spawned.append(server)
    kernels.assert_no_orphans(tag, grace=5.0)
    assert server.wait(timeout=10) == -signal.SIGTERM


def test_a_kernel_the_server_forked_is_not_taken_for_the_server(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    tag = reaper.new_tag()
    server = fake_server(tmp_path, tag, "kernel")
    spawned.append(server)
    wait_for(lambda: len(kernels.kernel_processes(tag)) == 2)
    kernel = next(p.pid for p in kernels.kernel_processes(tag) if p.pid != server.pid)
    # The server ends on SIGTERM; its kernel (same argv, no lock) is the orphan, seen alive.
    with pytest.raises(AssertionError, match=rf"left running: {kernel} ") as failure:
        kernels.assert_no_orphans(tag, grace=1.0)
    assert str(server.pid) not in str(failure.value)
    assert server.wait(timeout=10) == -signal.SIGTERM
    wait_for(lambda: not alive(kernel))


LEAKS_A_KERNEL = """
import subprocess, sys

pytest_plugins = ["tests.integration.conftest"]

def test_leaks_a_kernel():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                      "-m", "ipykernel_launcher", "-f", "{token}.json"])
"""


def test_the_fixture_fails_a_test_that_leaves_a_kernel_running(tmp_path: Path) -> None:
    token = f"kb-leak-{uuid.uuid4().hex}"
    proc = innerpytest.run(tmp_path, textwrap.dedent(LEAKS_A_KERNEL).replace("{token}", token),
                           tmp_path / "home")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "1 passed, 1 error" in out, out
    assert "kernel or server processes of the test outlived it" in out
    assert f"ipykernel_launcher -f {token}.json" in out
    assert [p for p in kernels.processes().values() if f"{token}.json" in p.argv] == []


@pytest.fixture
def bare_kernelspec(kernel_worlds: KernelWorlds[RealWorld],
                    monkeypatch: pytest.MonkeyPatch) -> str:
    """A world whose runtime is ipykernel, with its `--direct` kernelspec (the interpreter
    itself) in a Jupyter data dir of the world's; jupyter_client starts it with our
    environment, made the world's. A copy of one built once."""
    kernel_world_copy(kernel_worlds, monkeypatch, options=("--direct", "--name", "kb-bare"))
    return "kb-bare"


def test_kernels_started_at_once_all_answer_the_probe_and_none_is_left(
        bare_kernelspec: str) -> None:
    burst = kernels.start_many(bare_kernelspec, 3)
    try:
        assert len({k.pid for k in burst.kernels}) == 3
        assert {k.info["implementation"] for k in burst.kernels} == {"ipython"}
        assert all(0 < k.seconds <= burst.wall for k in burst.kernels)
        reply, printed = kernels.execute(burst.kernels[0], "import os; print(os.getpid())")
        assert reply["status"] == "ok" and printed.split() == [str(burst.kernels[0].pid)]
        assert len(kernels.kernel_processes(os.environ[reaper.TAG])) == 3
    finally:
        kernels.stop_all(burst.kernels)
    kernels.assert_no_orphans(os.environ[reaper.TAG])

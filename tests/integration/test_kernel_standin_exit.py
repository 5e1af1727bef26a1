"""A served kernel's stand-in exits as a bare kernel's launcher sees the kernel exit (issue 35,
item 7), with the real uv, ipykernel from PyPI and jupyter_client: a kernel killed by a signal
makes its stand-in die of that signal (SIGKILL too, whose action cannot be set), never exit 1
with a traceback, whether its server serves on, idles with the kernel running, or was stopped;
a server that stops retires until its last kernel has ended, so its status still arrives. Only a
server killed outright leaves the stand-in to guess (SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from testing import REPO_ROOT, kernels
from testing.processes import alive, wait_for
from tests.integration import test_kernel_server
from tests.integration.conftest import RealWorld
from tests.integration.test_kernel_server import (
    SPEC,
    describe,
    first_start,
    served,
    server_log,
)

pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")
kernel_world = test_kernel_server.kernel_world  # the fixtures: pytest finds them in this module
standin = test_kernel_server.standin


@pytest.fixture(autouse=True)
def _each_stand_in(standin: str) -> str:
    """Every test here on both stand-ins."""
    return standin


def _start_with_stderr(tmp_path: Path) -> tuple[kernels.Started, Path]:
    """A kernel of the kernelspec, its stand-in's stderr kept in a file (to look for a
    traceback once it has ended)."""
    stderr = tmp_path / "stand-in.err"
    with stderr.open("wb") as err:
        return kernels.start(SPEC, stderr=err), stderr


def _killed(kernel: kernels.Started, pid: int, signum: int) -> int:
    """Kill the served kernel ``pid`` by ``signum``; what jupyter_client's Popen then sees."""
    process = kernel.manager.provisioner.process  # type: ignore[union-attr]
    os.kill(pid, signum)
    code: int = process.wait(timeout=30)
    return code


def test_sigkill_of_a_served_kernel_kills_its_stand_in_by_sigkill_without_a_traceback(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    server = first_start(kernel_world)
    kernel, stderr = _start_with_stderr(tmp_path)
    try:
        pid = served(kernel, server)["pid"]
        # The OOM killer's way: as a bare kernel, -9 to its launcher (not exit 1).
        assert _killed(kernel, pid, signal.SIGKILL) == -signal.SIGKILL
    finally:
        kernels.stop(kernel)
    assert "Traceback" not in stderr.read_text(errors="replace")
    assert alive(server) and describe(kernel_world) is not None  # it serves on


def test_a_served_kernel_keeps_its_server_past_the_idle_timeout_and_its_status_arrives(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    idle = 4
    text = kernel_world.config.read_text(encoding="utf-8")
    kernel_world.config.write_text(text + f"kernel-idle-timeout = {idle}\n", encoding="utf-8")
    server = first_start(kernel_world)
    kernel, stderr = _start_with_stderr(tmp_path)
    try:
        pid = served(kernel, server)["pid"]
        time.sleep(idle + 2)  # an idle timeout that counted with a kernel running has passed
        assert _killed(kernel, pid, signal.SIGTERM) == -signal.SIGTERM
    finally:
        kernels.stop(kernel)
    assert "Traceback" not in stderr.read_text(errors="replace")
    # Idle counts from its last kernel's end: then it stops.
    wait_for(lambda: not alive(server), timeout=60)
    assert f"stopping: no request for {idle} s" in server_log(kernel_world)


def test_a_stopped_server_retires_until_its_kernel_ends_and_sends_its_status(
        kernel_world: RealWorld) -> None:
    server = first_start(kernel_world)
    kernel = kernels.start(SPEC)
    try:
        pid = served(kernel, server)["pid"]
        os.kill(server, signal.SIGTERM)  # as `serve --stop`, gc or a supervisor stop it
        # Retiring: it stops answering and lets go of its lock, yet stays.
        wait_for(lambda: describe(kernel_world) is None
                 and not kernels.holds_server_lock(server))
        assert alive(server)
        # Said just after it let go of its lock (and ended its spares): waited for, not raced.
        wait_for(lambda: "retiring: waiting for 1 kernel(s) to end" in server_log(kernel_world))
        assert _killed(kernel, pid, signal.SIGTERM) == -signal.SIGTERM
    finally:
        kernels.stop(kernel)
    wait_for(lambda: not alive(server))  # its last kernel reaped


def test_with_its_server_killed_outright_a_stand_in_guesses_sigkill_without_a_traceback(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    server = first_start(kernel_world)
    kernel, stderr = _start_with_stderr(tmp_path)
    try:
        pid = served(kernel, server)["pid"]
        os.kill(server, signal.SIGKILL)
        wait_for(lambda: not alive(server))
        # Nobody can wait for the kernel now: no status, and a signal death leaves no last
        # word, so SIGKILL is the stand-in's guess (README says so).
        assert _killed(kernel, pid, signal.SIGTERM) == -signal.SIGKILL
    finally:
        kernels.stop(kernel)
    assert "Traceback" not in stderr.read_text(errors="replace")


# A launcher of its own (jupyter_client sets JPY_PARENT_PID to it), on ports of a range no other
# test uses; it reports the stand-in's pid and the kernel's, then waits to be killed.
LAUNCHER = textwrap.dedent("""\
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from testing import kernels
    kernels.reserve_ports(19500, 500)
    kernel = kernels.start(sys.argv[2])
    reply, printed = kernels.execute(kernel, "import os; print(os.getpid())")
    print(json.dumps({"standin": kernel.pid, "kernel": int(printed)}), flush=True)
    time.sleep(600)
""")


def test_a_launcher_that_dies_takes_its_served_kernel_and_stand_in_with_it(
        kernel_world: RealWorld) -> None:
    # ipykernel's parent poller, which a served kernel cannot run (its parent is the server):
    # the stand-in plays it, as a bare kernel would end when its launcher is gone.
    server = first_start(kernel_world)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(REPO_ROOT), SPEC],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        pids = json.loads(launcher.stdout.readline())
        assert pids["kernel"] != pids["standin"] and alive(pids["kernel"])
        assert os.getppid() != server and _parent(pids["kernel"]) == server  # served
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        wait_for(lambda: not alive(pids["kernel"]), timeout=30)
        wait_for(lambda: not alive(pids["standin"]), timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[1])

"""The kernel server's life as a user sees it, with the real uv, ipykernel from PyPI and
jupyter_client starting kernels from the installed kernelspec: the first start spawns a server
and is an ordinary start, later ones are served; a rebuild or a skill added or removed reaches
the next kernel (the old server steps down, its kernels keep their generation);
``kernel-server = false`` means no server ever; ``gc`` stops a server whose generation is gone.
The orphan fixture (tests/integration/conftest.py) checks that nothing outlives each test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing import kernels, reaper
from testing.kernelworlds import KernelWorlds
from testing.processes import alive, default_signals, spawn, wait_for
from tests.integration.conftest import RealWorld, kernel_world_copy

pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux only")

SPEC = "kernel-bootstrap"
# A server warms up (imports ipykernel and the rest) at low priority, on a loaded machine.
SERVER_UP = 120.0


@pytest.fixture
def kernel_world(kernel_worlds: KernelWorlds[RealWorld],
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[RealWorld]:
    """ipykernel as the runtime, a skill, the kernelspec installed in a Jupyter data dir of the
    world's; jupyter_client then starts kernels with the world's environment. A copy of one
    built once."""
    monkeypatch.delenv("KERNEL_BOOTSTRAP_KERNEL_SERVER", raising=False)
    world = kernel_world_copy(kernel_worlds, monkeypatch, skills=("alpha",))
    world.env.pop("KERNEL_BOOTSTRAP_KERNEL_SERVER", None)
    yield world


def whoami(kernel: kernels.Started, imports: str = "") -> tuple[int, str]:
    """The kernel's own pid and ``sys.prefix`` (its generation), after ``imports``."""
    reply, printed = kernels.execute(kernel, f"{imports}\nimport os, sys\n"
                                             "print(os.getpid(), sys.prefix)")
    assert reply["status"] == "ok", reply
    pid, prefix = printed.split()
    return int(pid), prefix


def server(world: RealWorld) -> dict[str, Any] | None:
    found: dict[str, Any] | None = world.status()["kernel_server"]
    return found


def server_up(world: RealWorld) -> dict[str, Any]:
    wait_for(lambda: server(world) is not None, timeout=SERVER_UP)
    found = server(world)
    assert found is not None
    return found


def served_kernel(world: RealWorld) -> kernels.Started:
    """A kernel the server served (the first after it is up may still be an ordinary start
    while the server finishes warming up: started again until one is served)."""
    for _ in range(5):
        kernel = kernels.start(SPEC)
        if whoami(kernel)[0] != kernel.pid:
            return kernel
        kernels.stop(kernel)
    raise AssertionError("no kernel was served")


def test_the_first_start_is_ordinary_and_spawns_a_server_that_serves_the_next(
        kernel_world: RealWorld) -> None:
    assert server(kernel_world) is None
    with kernels.running(SPEC) as first:
        # The ordinary start: the kernel is the process its launcher started.
        assert whoami(first)[0] == first.pid
    up = server_up(kernel_world)
    assert set(up) == {"pid", "generation", "started", "kernels_started", "spares", "kernels",
                       "detached", "serving", "not_serving", "spare_pids"}
    assert up["detached"] is True and up["kernels"] == []  # a kernel start spawned it
    assert up["generation"] == str(kernel_world.venv.resolve())
    second = served_kernel(kernel_world)
    try:
        pid, prefix = whoami(second, "import alpha")
        # Served: the launcher's process is the stand-in, the kernel another process.
        assert pid != second.pid and prefix == str(kernel_world.venv.resolve())
        after = server(kernel_world)
        assert after is not None and after["pid"] == up["pid"] and after["kernels_started"] >= 1
        text = kernel_world.run("status").stdout
        assert f"kernel server: pid {up['pid']}, generation {up['generation']}, " in text
    finally:
        kernels.stop(second)


def test_a_rebuild_reaches_the_next_kernel_and_the_old_one_keeps_its_generation(
        kernel_world: RealWorld) -> None:
    with kernels.running(SPEC):
        pass
    old = server_up(kernel_world)
    before = served_kernel(kernel_world)
    try:
        old_generation = str(kernel_world.venv.resolve())
        kernel_world.write_config(requirements=["ipykernel>=6", kernel_world.runtime_package()])
        kernel_world.ensure()
        new_generation = str(kernel_world.venv.resolve())
        assert new_generation != old_generation
        with kernels.running(SPEC) as after:
            assert whoami(after, "import kb_runtime_demo")[1] == new_generation
        # The old server stepped down: it lets go of its lock, and retires until the kernel it
        # still runs has ended.
        wait_for(lambda: not kernels.holds_server_lock(old["pid"]), timeout=30)
        # The kernel started before the rebuild still answers, from its own generation.
        assert whoami(before)[1] == old_generation
        # And the next server serves the new generation.
        new = server_up(kernel_world)
        assert new["pid"] != old["pid"] and new["generation"] == new_generation
        assert alive(old["pid"])
    finally:
        kernels.stop(before)
    wait_for(lambda: not alive(old["pid"]), timeout=30)  # its last kernel reaped


def test_a_skill_added_or_removed_while_the_server_runs_reaches_the_next_kernel(
        kernel_world: RealWorld) -> None:
    with kernels.running(SPEC):
        pass
    server_up(kernel_world)
    kernel = served_kernel(kernel_world)
    kernels.stop(kernel)
    kernel_world.skill("beta")
    with kernels.running(SPEC) as added:
        reply, printed = kernels.execute(added, "import alpha, beta; print(beta.__name__)")
        assert (reply["status"], printed) == ("ok", "beta\n"), reply
    shutil.rmtree(kernel_world.skills_dir / "alpha")
    with kernels.running(SPEC) as removed:
        reply, printed = kernels.execute(removed, "import beta\ntry:\n    import alpha\n"
                                                  "except ImportError:\n    print('no alpha')")
        assert (reply["status"], printed) == ("ok", "no alpha\n"), reply


def test_with_kernel_server_false_no_server_ever_appears(kernel_world: RealWorld,
                                                          tmp_path: Path) -> None:
    kernel_world.write_config(requirements=["ipykernel>=6"], kernel_server=False)
    for _ in range(3):
        with kernels.running(SPEC) as kernel:
            assert whoami(kernel)[0] == kernel.pid  # every start is the ordinary one
    assert server(kernel_world) is None
    tag = os.environ.get(reaper.TAG)
    home = Path(os.environ["HOME"])
    assert [p.line for p in kernels.of_test(tag, [tmp_path, home])
            if kernels.holds_server_lock(p.pid)] == []


def test_a_server_whose_generation_is_gone_does_not_outlive_gc(kernel_world: RealWorld) -> None:
    with kernels.running(SPEC):
        pass
    old = server_up(kernel_world)
    kernel_world.write_config(requirements=["ipykernel>=6", kernel_world.runtime_package()])
    kernel_world.ensure()  # a rebuild: the server's generation is no longer current
    result = kernel_world.run("gc", "--json")
    assert result.returncode == 0, result.stderr
    stopped = json.loads(result.stdout)["kernel_servers_stopped"]
    # The server checks its own key every 10 s (loop.STALE_CHECK) and stops, removing what gc
    # would, when the config or its generation changed: a rebuild that takes longer (under
    # load it took 14 s) leaves gc nothing to stop. Either way the stale server must not
    # survive, and gc reports only what it stopped (that it stops a stale server, and only
    # that one, is tests/kernels/test_info.py's, on a server that cannot stop by itself).
    assert [(s["pid"], s["generation"]) for s in stopped] in \
        ([(old["pid"], old["generation"])], [])
    wait_for(lambda: not alive(old["pid"]), timeout=30)
    assert server(kernel_world) is None
    text = kernel_world.run("gc").stdout  # nothing left to stop
    assert "kernel server" not in text


def test_serve_runs_the_server_in_the_foreground_until_sigterm(kernel_world: RealWorld) -> None:
    supervised = spawn(kernel_world.command("serve"), env=kernel_world.env)
    try:
        # The command becomes the server (exec): the pid a supervisor started is the server's.
        wait_for(lambda: server(kernel_world) is not None, timeout=SERVER_UP, proc=supervised)
        up = server(kernel_world)
        assert up is not None and up["pid"] == supervised.pid
        kernel = served_kernel(kernel_world)  # no first ordinary start: a server is up already
        kernels.stop(kernel)
        supervised.send_signal(signal.SIGTERM)
        assert supervised.wait(timeout=30) == 0
    finally:
        if supervised.poll() is None:
            supervised.kill()
        supervised.communicate()
    assert server(kernel_world) is None


def _serve_logged(world: RealWorld, log: Path) -> subprocess.Popen[str]:
    """``serve`` as a supervisor starts it, its stderr in ``log`` (read while it runs)."""
    with log.open("w") as err:
        return subprocess.Popen(world.command("serve"), env=world.env, stdout=subprocess.DEVNULL,
                                stderr=err, text=True, start_new_session=True,
                                preexec_fn=default_signals)


def _stopped(supervised: subprocess.Popen[str]) -> None:
    if supervised.poll() is None:
        supervised.send_signal(signal.SIGTERM)
        try:
            assert supervised.wait(timeout=30) == 0
        finally:
            if supervised.poll() is None:
                supervised.kill()
                supervised.wait()


def test_serve_beside_a_detached_server_takes_over_instead_of_exiting(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    with kernels.running(SPEC):
        pass
    detached = server_up(kernel_world)  # a kernel start spawned it
    supervised = _serve_logged(kernel_world, tmp_path / "serve.err")
    try:
        # Not exit 0 at once (a restart storm under `Restart=always`): the detached server is
        # stopped, and the supervised one serves, in the foreground.
        wait_for(lambda: (server(kernel_world) or {}).get("pid") == supervised.pid,
                 timeout=SERVER_UP, proc=supervised)
        assert (server(kernel_world) or {}).get("detached") is False
        wait_for(lambda: not alive(detached["pid"]))  # it had no kernel: retired at once
        text = (tmp_path / "serve.err").read_text()
        assert f"taking over from the detached kernel server (pid {detached['pid']})" in text
        kernel = served_kernel(kernel_world)
        kernels.stop(kernel)
    finally:
        _stopped(supervised)


def test_serve_beside_another_serve_waits_for_it(kernel_world: RealWorld,
                                                 tmp_path: Path) -> None:
    first = _serve_logged(kernel_world, tmp_path / "first.err")
    second: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: server(kernel_world) is not None, timeout=SERVER_UP, proc=first)
        second = _serve_logged(kernel_world, tmp_path / "second.err")
        waiting = f"waiting for the kernel server (pid {first.pid}) that runs in the foreground"
        wait_for(lambda: waiting in (tmp_path / "second.err").read_text(), timeout=SERVER_UP,
                 proc=second)
        assert alive(first.pid) and server(kernel_world)["pid"] == first.pid  # type: ignore[index]
        _stopped(first)  # its supervisor stops it: the one waiting takes over
        wait_for(lambda: (server(kernel_world) or {}).get("pid") == second.pid,
                 timeout=SERVER_UP, proc=second)
    finally:
        _stopped(first)
        if second is not None:
            _stopped(second)


def _cmdline(pid: int) -> list[str]:
    """``/proc/PID/cmdline``'s arguments (a retitled process pads its area with NULs)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")


def _pgrep(pattern: str) -> set[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return {int(p) for p in found.stdout.split()}


def test_ps_names_the_server_and_each_served_kernel_and_status_lists_the_kernels(
        kernel_world: RealWorld) -> None:
    if shutil.which("pgrep") is None or shutil.which("ps") is None:
        pytest.skip("needs procps (ps, pgrep)")
    with kernels.running(SPEC) as bare:
        bare_argv = _cmdline(bare.pid)  # exec's own argv: the ordinary start's kernel
    up = server_up(kernel_world)
    title = ["kernel-bootstrap", "kernel", "server", str(kernel_world.venv)]
    assert _cmdline(up["pid"]) == title
    ps = subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(up["pid"])], capture_output=True,
                        text=True, check=True).stdout.strip()
    assert ps == " ".join(title)
    kernel = served_kernel(kernel_world)
    try:
        pid = whoami(kernel)[0]
        argv = _cmdline(pid)
        # The kernelspec's argv, as exec made the bare kernel's: only the connection differs.
        assert argv == [*bare_argv[:-1], kernel.manager.connection_file]
        assert argv[:3] == [str(kernel_world.venv / "bin" / "python"), "-m", "ipykernel_launcher"]
        assert pid in _pgrep("ipykernel_launcher") and pid not in _pgrep("kernel server")
        assert up["pid"] in _pgrep("kernel server")
        assert server(kernel_world)["kernels"] == [pid]  # type: ignore[index]
        assert f"  kernels running: {pid}\n" in kernel_world.run("status").stdout
    finally:
        kernels.stop(kernel)


def test_serve_stop_stops_this_configs_server_and_says_whether_one_ran(
        kernel_world: RealWorld) -> None:
    with kernels.running(SPEC):
        pass
    up = server_up(kernel_world)
    stopped = kernel_world.run("serve", "--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == f"stopped the kernel server (pid {up['pid']})\n"
    assert server(kernel_world) is None
    wait_for(lambda: not alive(up["pid"]))  # no kernel running: nothing to retire for
    again = kernel_world.run("serve", "--stop", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"stopped": False, "pid": None, "kernels": []}
    assert kernel_world.run("serve", "--stop").stdout == "no kernel server was running\n"

"""Spares (issue 36) with the real uv, ipykernel from PyPI and jupyter_client: a kernel prepared
before the request, claimed by it, is as fresh as a bare start; what it read before the claim
that a request changes sends that request to the forked start; no spare outlives its server."""

from __future__ import annotations

import functools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from testing import kernels
from testing.processes import alive, wait_for
from tests.integration import test_kernel_server
from tests.integration.conftest import RealWorld
from tests.integration.test_kernel_server import (
    SPEC,
    describe,
    first_start,
    interrupted_sleep,
    report,
    served,
    server_log,
    wait_for_server,
)

kernel_world = test_kernel_server.kernel_world  # the fixture: pytest finds it in this module
pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")

# What a spare must not carry over from before its claim: the shell's view of its start.
SHELL = textwrap.dedent("""\
    import json, os
    ip = get_ipython()
    hm = ip.history_manager
    print(json.dumps({"dh": [str(d) for d in _dh], "session": hm.session_number,
                      "mpl": os.environ.get("MPLBACKEND"), "term": os.environ.get("TERM"),
                      "jpy_session": globals().get("__session__"),
                      "startup": globals().get("ka_startup"), "home": os.path.expanduser("~")}))
""")


def spare_pids(world: RealWorld, count: int = 1) -> list[int]:
    """The server's ready spares, once it has ``count`` of them."""
    found: list[list[int]] = []

    def ready() -> bool:
        answer = describe(world)
        if answer is not None and len(answer.get("spare_pids", [])) >= count:
            found.append(answer["spare_pids"])
        return bool(found)

    try:
        wait_for(ready, timeout=120)
    except AssertionError as e:
        raise AssertionError(f"no spare; the server's log:\n{server_log(world)}") from e
    return found[0]


def shell(kernel: kernels.Started) -> dict[str, Any]:
    reply, printed = kernels.execute(kernel, SHELL)
    assert reply["status"] == "ok", reply
    return json.loads(printed)  # type: ignore[no-any-return]


def history_sessions(world: RealWorld) -> list[tuple[int, str]]:
    db = Path(world.env["HOME"]) / ".ipython" / "profile_default" / "history.sqlite"
    with sqlite3.connect(db) as conn:
        return list(conn.execute("SELECT session, start FROM sessions ORDER BY session"))


def test_a_claimed_spare_is_as_fresh_as_a_bare_start(kernel_world: RealWorld,
                                                     tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "KA_MARK": "bare", "JPY_SESSION_NAME": "/notebooks/a.ipynb"}
    with kernels.running(SPEC, cwd=str(work), env=env) as kernel:
        bare, bare_shell = report(kernel), shell(kernel)
    server = wait_for_server(kernel_world)
    spare = spare_pids(kernel_world)[0]
    sessions_before = history_sessions(kernel_world)
    env = {**env, "KA_MARK": "one", "JPY_SESSION_NAME": "/notebooks/b.ipynb"}
    with kernels.running(SPEC, cwd=str(work), env=env) as one:
        facts, view = served(one, server), shell(one)
    assert facts["pid"] == spare, "the kernel was not the spare"
    assert facts["pid"] == facts["pgid"] == facts["sid"]
    assert (facts["cwd"], facts["env"]) == (str(work), "one")
    for key in ("signals", "prefix", "modules", "defined", "path", "files"):
        assert facts[key] == bare[key], key
    # The environment asked for, plus what ipykernel sets: as the bare start's.
    assert facts["environ"] == {**bare["environ"], "JPY_SESSION_NAME": "/notebooks/b.ipynb"}
    assert facts["random"] != bare["random"]
    # The shell's own start: _dh is the claim's cwd, the history session is new (started at
    # the claim, after those before it), the environment ipykernel sets, the session name.
    assert view["dh"] == [str(work)] == bare_shell["dh"]
    assert (view["mpl"], view["term"]) == (bare_shell["mpl"], bare_shell["term"])
    assert view["jpy_session"] == "/notebooks/b.ipynb"
    sessions = history_sessions(kernel_world)
    assert view["session"] == sessions[-1][0] and len(sessions) == len(sessions_before) + 1
    assert sessions[-1][1] > sessions_before[-1][1]
    # Kernels writing their history (sqlite's journal comes and goes in the profile directory)
    # do not retire the next spare.
    spare = spare_pids(kernel_world)[0]
    with kernels.running(SPEC, cwd=str(work), env=env) as other:
        assert report(other)["pid"] == spare
        following = spare_pids(kernel_world)[0]
        kernels.execute(other, "1 + 1")
        with kernels.running(SPEC, cwd=str(work), env=env) as third:
            assert report(third)["pid"] == following


def test_a_startup_file_runs_at_the_claim_in_the_requests_directory(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    first_start(kernel_world)
    spare_pids(kernel_world)
    startup = Path(kernel_world.env["HOME"]) / ".ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-ka.py").write_text("import os\nka_startup = os.getcwd()\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    # The new file changed the startup directory: that spare is retired, the kernel forked.
    with kernels.running(SPEC, cwd=str(work)) as kernel:
        assert shell(kernel)["startup"] == str(work)
    spare = spare_pids(kernel_world)[0]
    with kernels.running(SPEC, cwd=str(tmp_path)) as kernel:
        assert report(kernel)["pid"] == spare
        assert shell(kernel)["startup"] == str(tmp_path)


def test_a_variable_the_spare_read_that_differs_means_a_forked_kernel(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    first_start(kernel_world)
    spare = spare_pids(kernel_world)[0]
    ipython = tmp_path / "ipython-elsewhere"
    profile = "import os; print(os.path.realpath(get_ipython().profile_dir.location))"
    with kernels.running(SPEC, cwd=str(tmp_path),
                         env={**os.environ, "IPYTHONDIR": str(ipython)}) as kernel:
        assert report(kernel)["pid"] != spare
        _, printed = kernels.execute(kernel, profile)
        assert printed.strip() == str(ipython.resolve() / "profile_default")
    assert alive(spare), "the spare was spent on a request it could not serve"
    # MPLBACKEND is read too, but the claim redoes what depends on it.
    with kernels.running(SPEC, cwd=str(tmp_path), env={**os.environ, "MPLBACKEND": "agg"}) \
            as kernel:
        facts = report(kernel)
        assert facts["pid"] == spare and facts["environ"]["MPLBACKEND"] == "agg"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_spares_end_with_their_server(kernel_world: RealWorld, signum: int) -> None:
    server = first_start(kernel_world)
    spare = spare_pids(kernel_world)[0]
    assert f"  spares ready: {spare}\n" in kernel_world.run("status").stdout
    os.kill(server, signum)
    wait_for(lambda: not alive(spare), timeout=60)


def test_kernel_spares_zero_prepares_none(kernel_world: RealWorld, tmp_path: Path) -> None:
    kernel_world.write_config(requirements=["ipykernel>=6"], kernel_spares=0)
    assert kernel_world.run("ensure").returncode == 0
    server = first_start(kernel_world)
    with kernels.running(SPEC, cwd=str(tmp_path)) as kernel:
        served(kernel, server)
    answer = describe(kernel_world)
    assert answer is not None and answer["spares"] == 0 and answer["kernels_started"] == 1


def test_an_interrupt_reaches_a_claimed_spare_and_its_output_is_its_own(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    first_start(kernel_world)
    spare = spare_pids(kernel_world)[0]
    with (tmp_path / "stderr").open("w") as stderr, \
            kernels.running(SPEC, cwd=str(tmp_path), stderr=stderr) as kernel:
        assert report(kernel)["pid"] == spare
        # What ipykernel printed as the spare was prepared is the kernel's, as a bare start
        # prints it on its stderr (not the server's log).
        assert "Kernel is running over TCP without encryption" in \
            (tmp_path / "stderr").read_text()
        reply = interrupted_sleep(kernel, tmp_path)
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        after, printed = kernels.execute(kernel, "print(1 + 1)")
        assert after["status"] == "ok" and printed == "2\n"


def ended(process: subprocess.Popen[bytes]) -> bool:
    return process.poll() is not None


def test_a_kernel_that_cannot_bind_its_port_ends_instead_of_hanging(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    """Its IOPub port held for good by another process: after the patient retries the kernel
    ends with exit 1 and a traceback (ipykernel's exit hook waited forever on a zmq context the
    failed start left a socket in, and its launcher on a kernel that never answered)."""
    import socket

    from jupyter_client.manager import KernelManager

    first_start(kernel_world)
    spare_pids(kernel_world)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        for _ in range(2):  # the spare, then a forked kernel (no spare is ready yet)
            manager = kernels.reserved(KernelManager(kernel_name=SPEC),
                                       iopub_port=held.getsockname()[1])
            with (tmp_path / "stderr").open("w") as stderr:
                manager.start_kernel(cwd=str(tmp_path), stderr=stderr)
            process: subprocess.Popen[bytes] = manager.provisioner.process  # type: ignore[union-attr]
            try:
                wait_for(functools.partial(ended, process), timeout=120)
            finally:
                manager.shutdown_kernel(now=True)
            assert process.returncode == 1
            assert "Address already in use" in (tmp_path / "stderr").read_text()


def test_a_port_held_for_a_moment_is_waited_for(kernel_world: RealWorld, tmp_path: Path) -> None:
    """In a burst, jupyter_client's own bind-and-close probes hold ports for a moment: a kernel
    that found one of its ports held died of EADDRINUSE; it now keeps trying for a while."""
    import socket
    import threading

    from jupyter_client.manager import KernelManager

    first_start(kernel_world)
    spare_pids(kernel_world)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    manager = kernels.reserved(KernelManager(kernel_name=SPEC), iopub_port=held.getsockname()[1])
    threading.Timer(2.0, held.close).start()  # let go once the kernel has tried and failed
    manager.start_kernel(cwd=str(tmp_path))
    try:
        assert kernels.first_reply(manager)["status"] == "ok"
    finally:
        manager.shutdown_kernel(now=True)

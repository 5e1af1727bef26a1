"""The kernel server with the real uv, ipykernel from PyPI and jupyter_client starting kernels
from the installed kernelspec: the first start is ordinary and spawns the server, later ones are
forked by it, each as fresh as a bare start; the stand-in is the kernel to its launcher; the
server's death ends none of its kernels; nobody else can ask it for one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testing import kernels
from testing.kernelworlds import KernelWorlds
from testing.processes import alive, session_members, wait_for
from tests.integration.conftest import RealWorld, kernel_world_copy

pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")

SPEC = "kernel-bootstrap"
# What a kernel reports about itself: compared between a bare start and a served one.
SELF = textwrap.dedent("""\
    import json, os, random, signal, sys
    def _kind(fd):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return "gone"
        return target.split(":")[0] if ":" in target else target
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
        "cwd": os.getcwd(), "env": os.environ.get("KA_MARK"), "random": random.random(),
        "environ": {k: v for k, v in os.environ.items() if k != "KA_MARK"},
        "argv": sys.argv[1:], "path": sys.path, "defined": "ka_x" in globals(),
        # Files (zmq's sockets and pipes come and go with its threads; sqlite's history file
        # and journal while it writes; deleted temporary files).
        "files": sorted({k for k in map(_kind, os.listdir("/proc/self/fd")) if k.startswith("/")
                         and ".ipython" not in k and not k.endswith("(deleted)")}),
        "signals": [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)],
        "prefix": sys.prefix, "modules": sorted(m for m in sys.modules
                                               if m.split(".")[0] == "bootstrap"),
        # The files the debugger is told are the kernel's own, and those of every module now.
        "kernel_modules": get_ipython().kernel._kernel_modules,
        "module_files": [m.__file__ for m in sys.modules.copy().values()
                         if hasattr(m, "__file__") and m.__file__],
        "ipkernel_sys": sys.modules["ipykernel.ipkernel"].sys is sys,
    }))
    ka_x = 1
""")


@pytest.fixture
def kernel_world(kernel_worlds: KernelWorlds[RealWorld],
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[RealWorld]:
    """A world whose runtime is ipykernel, its kernelspec installed for the user (as in
    test_jupyter.py); the test process's environment is the world's, so what jupyter_client
    starts (stand-ins, the server they spawn) shares its caches. A copy of one built once."""
    yield kernel_world_copy(kernel_worlds, monkeypatch)


@pytest.fixture(params=["native", "lean"])
def standin(request: pytest.FixtureRequest, kernel_world: RealWorld) -> Iterator[str]:
    """Which stand-in the kernelspec starts: the native one (this checkout has a C compiler
    build it) or the lean Python one (what the native one execs for anything it does not
    serve, and the only one an install without a compiler has). :func:`served` checks it."""
    spec = Path(kernel_world.env["JUPYTER_DATA_DIR"]) / "kernels" / SPEC / "kernel.json"
    data = json.loads(spec.read_text())
    if not kernels.native_argv(data["argv"]):  # an install no C compiler built it for
        assert shutil.which("cc") is None, f"a C compiler is here, yet no native stand-in: {data}"
        if request.param == "native":
            pytest.skip("this install has no native stand-in (no C compiler built it)")
    elif request.param == "lean":
        data["argv"] = kernels.lean_argv(data["argv"])
        spec.write_text(json.dumps(data))
    STANDIN[0] = request.param
    try:
        yield str(request.param)
    finally:
        STANDIN[0] = None


# The stand-in the kernelspec starts (set by the standin fixture): what served() expects.
STANDIN: list[str | None] = [None]


def describe(world: RealWorld) -> dict[str, Any] | None:
    from bootstrap.kernels import info

    return info.describe(world.venv)


def wait_for_server(world: RealWorld, other_than: int | None = None) -> int:
    """The pid of the venv's server once it answers (a new one: not ``other_than``)."""
    found: list[int] = []

    def up() -> bool:
        answer = describe(world)
        if answer is not None and answer["pid"] != other_than:
            found.append(answer["pid"])
        return bool(found)

    wait_for(up, timeout=120)
    return found[0]


def report(kernel: kernels.Started) -> dict[str, Any]:
    reply, printed = kernels.execute(kernel, SELF)
    assert reply["status"] == "ok", reply
    return json.loads(printed)  # type: ignore[no-any-return]


def served(kernel: kernels.Started, server: int) -> dict[str, Any]:
    """The kernel's report, asserting the server forked it (the stand-in is another process,
    the one the standin fixture asked for)."""
    facts = report(kernel)
    assert facts["pid"] != kernel.pid and facts["ppid"] == server, facts
    if STANDIN[0] is not None:
        assert kernels.runs_native(kernel.pid) == (STANDIN[0] == "native"), STANDIN[0]
    return facts


def server_log(world: RealWorld) -> str:
    from bootstrap.kernels import places

    directory = places.server_dir(str(world.venv))
    assert directory is not None
    try:
        return Path(directory, places.LOG).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def first_start(world: RealWorld) -> int:
    """Start (and stop) the first kernel, which finds no server, starts the ordinary way and
    spawns one; the server's pid once it answers."""
    with kernels.running(SPEC) as kernel:
        facts = report(kernel)
        assert facts["pid"] == kernel.pid  # the ordinary start: jupyter_client's own child
    return wait_for_server(world)


def test_a_served_kernel_is_as_fresh_as_a_bare_start(kernel_world: RealWorld,
                                                     tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with kernels.running(SPEC, cwd=str(work), env={**os.environ, "KA_MARK": "bare"}) as kernel:
        bare = report(kernel)
    assert bare["pid"] == kernel.pid
    server = wait_for_server(kernel_world)
    with kernels.running(SPEC, cwd=str(work), env={**os.environ, "KA_MARK": "one"}) as one, \
            kernels.running(SPEC, cwd=str(tmp_path), env={**os.environ, "KA_MARK": "two"}) as two:
        first, second = served(one, server), served(two, server)
    for facts, cwd, mark in ((first, work, "one"), (second, tmp_path, "two")):
        # Its own session and process group; the cwd and environment asked for.
        assert facts["pid"] == facts["pgid"] == facts["sid"]
        assert (facts["cwd"], facts["env"]) == (str(cwd), mark)
        # What a bare start has: argv, descriptors (kinds), signal handlers, the generation,
        # and none of the server's modules; no namespace carried over.
        for key in ("signals", "prefix", "modules", "defined", "path", "environ"):
            assert facts[key] == bare[key], key
        # No file of the server's (its lock, its log) or of another kernel's: those of a bare
        # start (the generation's .in-use lock among them).
        assert facts["files"] == bare["files"]
        assert any(f.endswith("/.in-use") for f in facts["files"])
        assert facts["argv"][0] == "-f" and facts["argv"][1] != bare["argv"][1]
    assert len({bare["random"], first["random"], second["random"]}) == 3
    assert describe(kernel_world)["kernels_started"] == 2  # type: ignore[index]
    for facts in (bare, first, second):
        listed = debugger_list(facts)
        assert listed == debugger_list(facts, now=True)[:len(listed)]
        assert len(listed) > 100 and facts["ipkernel_sys"]


def debugger_list(facts: dict[str, Any], now: bool = False) -> list[str]:
    """The files ipykernel listed for its debugger as it made the kernel (a served kernel: from
    the server's list, bootstrap.kernels.module_list), or with ``now`` those of every module
    loaded now; without the tool's own (a spare made its kernel before they were unloaded) and
    ``__main__``'s (the launcher as the kernel is made, the shell's namespace as it runs)."""
    import bootstrap

    own = os.path.dirname(bootstrap.__file__) + os.sep
    return [f for f in facts["module_files" if now else "kernel_modules"]
            if not f.startswith(own) and os.path.basename(f) != "ipykernel_launcher.py"]


def test_an_interrupt_reaches_the_served_kernel_through_its_stand_in(
        kernel_world: RealWorld, standin: str) -> None:
    server = first_start(kernel_world)
    with kernels.running(SPEC) as kernel:
        pid = served(kernel, server)["pid"]
        reply = interrupted_sleep(kernel, kernel_world.root)
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        # And the command a cell runs, as jupyter_client's killpg reaches it in a bare start:
        # system() ignores SIGINT in the kernel itself while it waits.
        reply = interrupted(kernel, "import os; print(os.system('sleep 60'))",
                            lambda: any(line.endswith(" sleep 60")
                                        for line in session_members(os.getsid(pid))))
        assert reply["status"] == "ok"
        after, printed = kernels.execute(kernel, "print(1 + 1)")
        assert after["status"] == "ok" and printed == "2\n"


def interrupted_sleep(kernel: kernels.Started, scratch: Path) -> dict[str, Any]:
    """The reply to a cell that sleeps for a minute, interrupted once it sleeps."""
    mark = scratch / f"sleeping-{kernel.pid}"
    return interrupted(kernel, f"import time; open({str(mark)!r}, 'w').close(); "
                               "time.sleep(60)", mark.exists)


def interrupted(kernel: kernels.Started, code: str, started: Callable[[], bool]
                ) -> dict[str, Any]:
    """The reply to ``code``, interrupted once ``started()`` says the cell is in its wait."""
    client = kernel.manager.client()
    client.start_channels()
    try:
        # stop_on_error off: ipykernel aborts a request that reaches it while it is still
        # handling the previous cell's error, and under load the next cell can be that early.
        msg_id = client.execute(code, stop_on_error=False)
        wait_for(started)
        kernel.manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id
        return reply["content"]  # type: ignore[no-any-return]
    finally:
        client.stop_channels()


@pytest.mark.parametrize("how", ["shutdown_now", "sigkill_stand_in", "sigterm_stand_in"])
def test_the_served_kernel_ends_with_its_stand_in(kernel_world: RealWorld, how: str,
                                                   standin: str) -> None:
    server = first_start(kernel_world)
    kernel = kernels.start(SPEC)
    try:
        pid = served(kernel, server)["pid"]
        process = kernel.manager.provisioner.process  # type: ignore[union-attr]
        if how == "shutdown_now":
            kernel.manager.shutdown_kernel(now=True)
            assert process.wait(timeout=10) == -signal.SIGKILL
        elif how == "sigkill_stand_in":
            os.kill(kernel.pid, signal.SIGKILL)
            assert process.wait(timeout=10) == -signal.SIGKILL
        else:
            # Forwarded: the kernel dies of it, and the stand-in exits as it did.
            os.kill(kernel.pid, signal.SIGTERM)
            assert process.wait(timeout=10) == -signal.SIGTERM
        wait_for(lambda: not alive(pid), timeout=10)
    finally:
        kernels.stop(kernel)


def test_a_kernel_that_exits_makes_its_stand_in_exit_with_its_code(
        kernel_world: RealWorld, standin: str) -> None:
    server = first_start(kernel_world)
    kernel = kernels.start(SPEC)
    try:
        served(kernel, server)
        client = kernel.manager.client()
        client.start_channels()
        process = kernel.manager.provisioner.process  # type: ignore[union-attr]
        try:
            client.execute("import os; os._exit(7)")
            assert process.wait(timeout=30) == 7
        finally:
            client.stop_channels()
    finally:
        kernels.stop(kernel)


def test_killing_the_server_ends_none_of_its_kernels_and_the_next_start_replaces_it(
        kernel_world: RealWorld) -> None:
    server = first_start(kernel_world)
    with kernels.running(SPEC) as kernel:
        served(kernel, server)
        os.kill(server, signal.SIGKILL)
        wait_for(lambda: not alive(server))
        time.sleep(1.5)  # ipykernel's parent poller would have shut it down by now
        reply, printed = kernels.execute(kernel, "print('alive')")
        assert reply["status"] == "ok" and printed == "alive\n"
        # The next start: ordinary (no server), and it spawns the next server.
        with kernels.running(SPEC) as second:
            assert report(second)["pid"] == second.pid
        replacement = wait_for_server(kernel_world, other_than=server)
        with kernels.running(SPEC) as third:
            served(third, replacement)
        # The orphaned kernel still ends with its stand-in, and says how.
        kernel.manager.shutdown_kernel(now=False)
        process = kernel.manager.provisioner.process  # type: ignore[union-attr]
        assert process is None or process.wait(timeout=30) == 0


def test_a_server_that_stops_answering_mid_request_means_an_ordinary_start_and_a_warning(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    server = first_start(kernel_world)
    os.kill(server, signal.SIGSTOP)
    try:
        stderr = tmp_path / "stand-in.err"
        with stderr.open("wb") as err, kernels.running(SPEC, stderr=err) as kernel:
            assert report(kernel)["pid"] == kernel.pid
        assert stderr.read_text().count("the kernel server did not answer") == 1
    finally:
        os.kill(server, signal.SIGKILL)
        os.kill(server, signal.SIGCONT)
    wait_for(lambda: not alive(server))
    with kernels.running(SPEC) as kernel:
        assert report(kernel)["pid"] == kernel.pid
    replacement = wait_for_server(kernel_world, other_than=server)
    with kernels.running(SPEC) as kernel:
        served(kernel, replacement)



@contextlib.contextmanager
def fake_server(world: RealWorld, handle: Callable[[socket.socket], None]) -> Iterator[None]:
    """A listener of our own at the venv's server socket (no lock: no server runs) that gives
    each connection to ``handle`` and then closes it, in a thread, until the block ends."""
    from bootstrap.kernels import places

    directory = places.server_dir(str(world.venv))
    assert directory is not None
    dirfd = places.open_dir(directory, create=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(places.sock_path(dirfd))
    listener.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                handle(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=70)
        os.close(dirfd)


def test_a_server_gone_mid_request_is_replaced_by_the_next_start(kernel_world: RealWorld,
                                                                 tmp_path: Path) -> None:
    # What a client of a server that is stopping meets: its connection, still in the backlog,
    # is closed unanswered, and the lock is free (the server lets go of it first). Here a
    # listener of our own plays that server, deterministically.
    with fake_server(kernel_world, lambda conn: None):
        stderr = tmp_path / "stand-in.err"
        with stderr.open("wb") as err, kernels.running(SPEC, stderr=err) as kernel:
            assert report(kernel)["pid"] == kernel.pid  # the ordinary start
        assert stderr.read_text().count("the kernel server did not answer") == 1
        # ... which spawned the next server: it serves the start after.
        server = wait_for_server(kernel_world)
        with kernels.running(SPEC) as kernel:
            served(kernel, server)


ATTEMPT = textwrap.dedent("""\
    import json, os, socket, sys
    path = sys.argv[1]
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    try:
        s.connect(path)
    except OSError as e:
        sys.exit(f"connect: errno {e.errno}")
    try:  # closed on us: EOF, or EPIPE/ECONNRESET when it closed before we wrote
        s.sendall(json.dumps({"kind": "info"}).encode() + b"\\n")
        print("answer:", s.recv(65536))
    except OSError as e:
        print("answer: b''", e.errno)
""")


def test_another_user_gets_nothing_from_the_server(kernel_world: RealWorld,
                                                   tmp_path: Path) -> None:
    if os.getuid() != 0 or not os.path.exists("/usr/bin/setpriv"):
        pytest.skip("needs root and setpriv to act as another user")
    from bootstrap.kernels import places

    server = first_start(kernel_world)
    directory = places.server_dir(str(kernel_world.venv))
    assert directory is not None
    # A short name for the socket: its path is longer than an AF_UNIX address holds.
    sock = tmp_path / "s"
    sock.symlink_to(os.path.join(directory, places.SOCK))
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
              sys.executable, "-c", ATTEMPT, str(sock)]
    # The 0700 directory: the socket cannot even be reached.
    out = subprocess.run(nobody, capture_output=True, text=True, timeout=60, check=False)
    assert out.stderr.strip() == "connect: errno 13"
    # Opened up by mistake, the server still refuses the peer (SO_PEERCRED): EOF, no answer.
    modes = [(p, os.stat(p).st_mode & 0o777)
             for p in {*_parents(Path(directory)), *_parents(tmp_path)}]
    try:
        for path, mode in modes:
            os.chmod(path, mode | 0o011)
        os.chmod(os.path.join(directory, places.SOCK), 0o777)
        out = subprocess.run(nobody, capture_output=True, text=True, timeout=60, check=True)
    finally:
        for path, mode in modes:
            os.chmod(path, mode)
    assert out.stdout.startswith("answer: b''"), out
    assert "refused a connection of uid 65534" in server_log(kernel_world)
    assert describe(kernel_world)["pid"] == server  # type: ignore[index]


def _parents(directory: Path) -> list[Path]:
    """``directory`` and those above it down from the first one closed to others."""
    chain = [directory, *directory.parents]
    return [p for p in chain if os.stat(p).st_mode & 0o011 != 0o011]


# 50 at once is a stress figure (KB_STRESS=1); the default suite asks for 8, enough to queue
# behind the server's bound on kernels initialising at once.
BURST = 50 if os.environ.get("KB_STRESS") else 8


def test_kernels_requested_at_once_all_answer(kernel_world: RealWorld, tmp_path: Path) -> None:
    # IPC transport: with TCP, jupyter_client picks a port, frees it and the kernel binds it
    # later; 50 probes reconnecting meanwhile take ephemeral ports from the same range, and one
    # of them now and then takes a port a kernel is about to bind (a bare burst too).
    from concurrent.futures import ThreadPoolExecutor

    from jupyter_client.manager import KernelManager

    server = first_start(kernel_world)
    (tmp_path / "ipc").mkdir()
    managers = [KernelManager(kernel_name=SPEC, transport="ipc", ip=str(tmp_path / "ipc" / str(i)))
                for i in range(BURST)]

    def start(manager: KernelManager) -> dict[str, Any]:
        manager.start_kernel()
        client = kernels.probe_client(manager, 50)
        try:
            return kernels.answer(client, 600, manager.is_alive)
        finally:
            kernels.close_client(client)

    try:
        with ThreadPoolExecutor(max_workers=BURST) as pool:
            infos = list(pool.map(start, managers))
        assert [i.get("status") for i in infos] == ["ok"] * BURST
    finally:
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda m: m.has_kernel and m.shutdown_kernel(now=True), managers))
    answer = describe(kernel_world)
    assert answer is not None and answer["pid"] == server and answer["kernels_started"] == BURST


def test_a_preload_module_that_fails_to_import_is_a_warning_and_kernels_are_still_served(
        kernel_world: RealWorld) -> None:
    kernel_world.write_config(requirements=["ipykernel>=6"],
                              kernel_preload=["kb_no_such_module", "json"])
    server = first_start(kernel_world)
    assert server_log(kernel_world).count(
        "kernel-preload: kb_no_such_module failed to import") == 1
    with kernels.running(SPEC) as kernel:
        served(kernel, server)
        _, printed = kernels.execute(kernel, "import sys; print('json' in sys.modules)")
        assert printed == "True\n"


def test_a_request_with_a_python_variable_of_interpreter_start_gets_the_ordinary_start(
        kernel_world: RealWorld) -> None:
    server = first_start(kernel_world)
    with kernels.running(SPEC, env={**os.environ, "PYTHONHASHSEED": "7"}) as kernel:
        _, printed = kernels.execute(kernel, "import os; print(os.getpid(), hash('ka'))")
    pid, seeded = printed.split()
    assert int(pid) == kernel.pid  # not forked: the hash seed is drawn at interpreter start
    python = str(kernel_world.venv / "bin" / "python")
    expected = subprocess.run([python, "-c", "print(hash('ka'))"],
                              env={**os.environ, "PYTHONHASHSEED": "7"}, capture_output=True,
                              text=True, check=True).stdout.split()
    assert [seeded] == expected
    assert describe(kernel_world)["pid"] == server  # type: ignore[index]


def test_a_server_whose_config_changed_stops_serving_and_the_next_start_spawns_a_fresh_one(
        kernel_world: RealWorld) -> None:
    server = first_start(kernel_world)
    later = kernel_world.config.stat().st_mtime + 10
    os.utime(kernel_world.config, (later, later))
    with kernels.running(SPEC) as kernel:
        assert report(kernel)["pid"] == kernel.pid  # told "stale": the ordinary start
    wait_for(lambda: not alive(server))
    replacement = wait_for_server(kernel_world, other_than=server)
    with kernels.running(SPEC) as kernel:
        served(kernel, replacement)


def test_a_server_exits_after_its_idle_timeout(kernel_world: RealWorld) -> None:
    text = kernel_world.config.read_text(encoding="utf-8")
    kernel_world.config.write_text(text + "kernel-idle-timeout = 3\n", encoding="utf-8")
    server = first_start(kernel_world)
    wait_for(lambda: not alive(server), timeout=60)
    assert describe(kernel_world) is None
    assert "stopping: no request for 3 s" in server_log(kernel_world)


def test_the_server_log_holds_no_debugpy_warning_and_kernels_are_as_before(
        kernel_world: RealWorld) -> None:
    # debugpy's "frozen modules" lines, printed at the preload's import, filled the log at
    # every server start, about no kernel.
    server = first_start(kernel_world)
    assert "frozen modules" not in server_log(kernel_world)
    with kernels.running(SPEC) as kernel:
        served(kernel, server)
        _, printed = kernels.execute(kernel, textwrap.dedent("""\
            import os, sys
            constants = sys.modules.get("_pydevd_bundle.pydevd_constants")
            print(getattr(constants, "DISABLE_FILE_VALIDATION", None),
                  os.environ.get("PYDEVD_DISABLE_FILE_VALIDATION"))"""))
    assert printed == "False None\n", "a served kernel's pydevd is a bare start's"

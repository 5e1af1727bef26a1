"""A kernel's ports held from its stand-in's first millisecond (issue 36 item 5): jupyter_client
picks ports by binding and closing them, and in a burst another process took one before the
kernel came to bind it. The native stand-in binds the connection file's ports as it starts and
sends the listening sockets with its request (protocol.py's ``"bound"``); the served kernel,
forked or a claimed spare, binds by adopting them."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootstrap.kernels.protocol import PORTS  # a request's "bound" order
from testing import kernels
from testing.processes import alive, wait_for
from tests.integration import test_kernel_server, test_kernel_spares
from tests.integration.conftest import RealWorld
from tests.integration.test_kernel_server import SPEC, fake_server, first_start

pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")
kernel_world = test_kernel_server.kernel_world  # the fixture: pytest finds it in this module

Received = tuple[dict[str, Any], list[socket.socket]]  # a request, the sockets after 0-2


def connection_file(directory: Path, **changes: Any) -> tuple[Path, dict[str, Any]]:
    """A connection file as jupyter_client writes one, on ports of the suite's reserved range."""
    from jupyter_client.manager import KernelManager

    manager = kernels.reserved(KernelManager(kernel_name=SPEC))
    manager.connection_file = str(directory / "kernel-bound.json")
    manager.write_connection_file()
    info = {**json.loads(Path(manager.connection_file).read_text()), **changes}
    Path(manager.connection_file).write_text(json.dumps(info, indent=2))
    return Path(manager.connection_file), info


@contextlib.contextmanager
def recording_server(world: RealWorld) -> Iterator[list[Received]]:
    """A server of our own (test_kernel_server.fake_server) that records each request and the
    descriptors after 0-2 that came with it (as sockets), holds the connection unanswered while
    the block runs (a request waiting for its fork), then closes it: the stand-in then execs
    its fallback."""
    received: list[Received] = []
    release = threading.Event()

    def record(conn: socket.socket) -> None:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 16)
        while not data.endswith(b"\n"):
            more = conn.recv(1 << 20)
            if not more:
                break
            data += more
        for fd in fds[:3]:
            os.close(fd)
        received.append((json.loads(data), [socket.socket(fileno=fd) for fd in fds[3:]]))
        release.wait(60)

    try:
        with fake_server(world, record):
            try:
                yield received
            finally:
                release.set()
    finally:
        for _, socks in received:
            for sock in socks:
                sock.close()


def native(world: RealWorld, connection: Path) -> list[str]:
    """The native stand-in, its fallback a shell that exits 7 (and python args naming the
    connection file after the fallback's ``run --config CONFIG --``, where it looks)."""
    path = Path(world.env["JUPYTER_DATA_DIR"]) / "kernels" / SPEC / "kernel.json"
    argv = json.loads(path.read_text())["argv"]
    if not kernels.native_argv(argv):
        pytest.skip("this install has no native stand-in (no C compiler built it)")
    config = str(world.config)
    return [argv[0], str(world.venv), config, "/bin/sh", "-c", "exit 7", "run", "--config",
            config, "--", "-m", "ipykernel_launcher", "-f", str(connection)]


def taken(port: int) -> bool:
    """Whether another process's bind of ``port`` (as libzmq binds: SO_REUSEADDR) fails."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as e:
            assert e.errno == errno.EADDRINUSE, e
            return True
    return False


def test_the_native_stand_in_sends_the_connection_files_ports_bound_and_listening(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    connection, info = connection_file(tmp_path)
    with recording_server(kernel_world) as received:
        stand_in = subprocess.Popen(native(kernel_world, connection))
        try:
            wait_for(lambda: bool(received) or stand_in.poll() is not None, timeout=60)
            assert received, f"no request; the stand-in ended with {stand_in.poll()}"
            request, socks = received[0]
            ports = [info[name] for name in PORTS]
            assert request["bound"] == ports
            assert [s.getsockname() for s in socks] == [("127.0.0.1", p) for p in ports]
            for sock in socks:
                assert sock.type == socket.SOCK_STREAM
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
            # While the request waits, the ports are held: no other process takes one.
            assert all(taken(port) for port in ports)
        finally:
            stand_in.kill() if stand_in.poll() is None else None
            stand_in.wait()


def test_a_port_taken_before_the_stand_in_is_left_to_the_kernel_and_the_rest_are_held(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    connection, info = connection_file(tmp_path)
    with socket.socket() as other, recording_server(kernel_world) as received:
        other.bind(("127.0.0.1", info["stdin_port"]))
        other.listen()
        stand_in = subprocess.Popen(native(kernel_world, connection))
        wait_for(lambda: bool(received) or stand_in.poll() is not None, timeout=60)
        assert received
        assert received[0][0]["bound"] == [info[n] for n in PORTS if n != "stdin_port"]
    # Unanswered, the stand-in does what it does for anything but a kernel: its fallback.
    assert stand_in.wait(timeout=60) == 7


def test_a_stand_in_that_falls_back_lets_its_kernel_bind_the_ports_the_server_still_holds(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    # A stopped server never reads the request: its copies of the sockets stay in its backlog.
    # Here a server of our own holds them without answering; after its 2 s the stand-in runs
    # its fallback, the ordinary start, whose kernel must get its ports.
    connection, info = connection_file(tmp_path)
    with recording_server(kernel_world) as received:
        stand_in = subprocess.Popen(native(kernel_world, connection))
        assert stand_in.wait(timeout=60) == 7
        assert received and len(received[0][1]) == len(PORTS)
        assert not any(taken(info[name]) for name in PORTS)
        # They no longer listen: a client is never left waiting in a backlog nobody accepts.
        for sock in received[0][1]:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0


@pytest.mark.parametrize("changes", [{"transport": "ipc"}, {"ip": "localhost"}],
                         ids=["ipc", "a host name"])
def test_what_the_stand_in_cannot_bind_as_the_kernel_would_it_leaves_to_the_kernel(
        kernel_world: RealWorld, tmp_path: Path, changes: dict[str, str]) -> None:
    connection, info = connection_file(tmp_path, **changes)
    with recording_server(kernel_world) as received:
        stand_in = subprocess.Popen(native(kernel_world, connection))
        wait_for(lambda: bool(received) or stand_in.poll() is not None, timeout=60)
        assert received and received[0][0]["bound"] == [] and received[0][1] == []
        assert not any(taken(info[name]) for name in PORTS)
    assert stand_in.wait(timeout=60) == 7


def bound_request(world: RealWorld, connection: Path, info: dict[str, Any],
                  extra: list[str]) -> tuple[socket.socket, int, list[int]]:
    """Send the server the request the native stand-in sends, with listening sockets of our own
    on the connection file's ports: the connection, the kernel's pid, the sockets' inodes."""
    from bootstrap.kernels import client, provisioned

    held = []
    for name in PORTS:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", info[name]))
        sock.listen(100)
        held.append(sock)
    python_args = ["-m", "ipykernel_launcher", "-f", str(connection), *extra]
    request = {**client._kernel_request(str(world.venv), python_args, str(world.config)),
               "bound": [info[name] for name in PORTS]}
    inodes = [os.fstat(s.fileno()).st_ino for s in held]
    conn = provisioned._connect(str(world.venv))  # as the provisioner connects
    assert conn is not None
    try:
        conn.settimeout(120)
        pid = client._request(conn, request, (0, 1, 2, *[s.fileno() for s in held]))
    except BaseException:
        conn.close()
        raise
    finally:
        for sock in held:
            sock.close()  # ours: the server's (then the kernel's) copies hold the ports
    return conn, pid, inodes  # the kernel lives while the connection does


@pytest.mark.parametrize("how", ["forked", "spare"])
def test_the_served_kernel_serves_on_the_very_sockets_the_request_brought(
        kernel_world: RealWorld, tmp_path: Path, how: str) -> None:
    server = first_start(kernel_world)
    spare = test_kernel_spares.spare_pids(kernel_world)[0] if how == "spare" else None
    # An argument beyond `-f FILE` is forked: a spare parsed no command line.
    extra = [] if how == "spare" else ["--IPKernelApp.log_level=30"]
    connection, info = connection_file(tmp_path)
    # The client reads a copy: the kernel writes its file back as it starts, by removing it
    # and creating it again (jupyter_core's secure_write), so the file may be missing a moment.
    ours = tmp_path / "client.json"
    ours.write_text(json.dumps(info))
    conn, pid, inodes = bound_request(kernel_world, connection, info, extra)
    try:
        assert kernels.processes()[pid].ppid == server
        assert (pid == spare) == (how == "spare")
        client = kernels.probe_client(ours)
        try:
            reply = kernels.answer(client, alive=lambda: alive(pid))
        finally:
            kernels.close_client(client)
        assert reply["status"] == "ok"
        # Adopted, not bound anew: the kernel's listening sockets are the ones we sent; a
        # spare's own five ports (held for a provisioner's claim) are closed: what else it
        # listens on is ipykernel's IOPub pipe.
        assert set(inodes) <= kernels.socket_inodes(pid)
        assert len(kernels.listening_ports(pid) - {info[name] for name in PORTS}) <= 1
        assert all(taken(info[name]) for name in PORTS)
    finally:
        conn.close()  # the kernel's watchdog ends it
    # Once it has ended (all its threads: a zombie's last ones may still be closing), the
    # ports are free again: no copy of the sockets stayed behind, in the server or elsewhere.
    wait_for(lambda: not any(taken(info[name]) for name in PORTS), timeout=60)
    assert not alive(pid)


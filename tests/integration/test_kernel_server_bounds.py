"""The kernel server is bounded by construction and trusts its directories as the tool trusts
its caches (issue 35, items 5 and 6), with the real uv, ipykernel from PyPI and jupyter_client:
a connection that sends descriptors past a request's three is closed with all of them; a request
that does not arrive whole within a second is dropped; out of descriptors, the server waits
instead of spinning and serves again once it can; a cache root another user can write means
kernels start the ordinary way, with one warning."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing import kernels
from testing.processes import wait_for
from tests.integration import test_kernel_server, test_kernel_spares
from tests.integration.conftest import RealWorld
from tests.integration.test_kernel_server import (
    SPEC,
    describe,
    first_start,
    report,
    served,
    server_log,
)

pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")
kernel_world = test_kernel_server.kernel_world  # the fixture: pytest finds it in this module

N_FDS = 3  # bootstrap.kernels.protocol.N_FDS: a request's descriptors (the client's 0, 1, 2)
MOST_FDS = 8  # and up to N_BOUND (5) listening sockets of the native stand-in's


@contextlib.contextmanager
def connected(world: RealWorld) -> Iterator[socket.socket]:
    """A connection to the venv's server, as a client that is not the stand-in."""
    from bootstrap.kernels import places

    directory = places.server_dir(str(world.venv))
    assert directory is not None
    dirfd = places.open_dir(directory, create=False)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(30)
        sock.connect(places.sock_path(dirfd))
        yield sock
    finally:
        sock.close()
        os.close(dirfd)


def descriptors(pid: int) -> list[int]:
    return sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))


def sockets(pid: int) -> list[int]:
    return [fd for fd in descriptors(pid)
            if _target(f"/proc/{pid}/fd/{fd}").startswith("socket:")]


def _target(link: str) -> str:
    try:
        return os.readlink(link)
    except OSError:
        return ""


def closed(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (EOF, or a reset: it closed with our bytes
    unread), without waiting."""
    try:
        return answered(sock) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def answered(sock: socket.socket) -> bool:
    """Whether something (an answer, EOF, an error) is there to read on ``sock`` now."""
    return bool(select.select([sock], [], [], 0)[0])


def test_descriptors_past_a_requests_three_close_the_connection_and_all_of_them(
        kernel_world: RealWorld) -> None:
    server = first_start(kernel_world)
    before = len(descriptors(server))
    with open(os.devnull, "rb") as null, connected(kernel_world) as sock:
        try:
            for _ in range(1000):  # 3,000 descriptors in chunks of three, never a newline
                socket.send_fds(sock, [b"{"], [null.fileno()] * N_FDS)
        except OSError:
            pass  # closed on us: what is asserted next
        # Either the server closed the connection, or it holds what was sent.
        wait_for(lambda: closed(sock) or len(descriptors(server)) > before + 1 + MOST_FDS,
                 timeout=60)
        assert closed(sock), f"the server holds {len(descriptors(server)) - before} more fds"
        wait_for(lambda: len(descriptors(server)) <= before)
    with kernels.running(SPEC) as kernel:
        served(kernel, server)


def test_a_request_that_is_not_whole_within_a_second_is_dropped(kernel_world: RealWorld) -> None:
    server = first_start(kernel_world)
    with connected(kernel_world) as sock:
        sock.sendall(b'{"kind": "info"')  # and nothing more
        # A bound three times the server's: the drop is asserted, not how fast it came.
        sock.settimeout(3.0)
        assert sock.recv(65536) == b""
    assert describe(kernel_world)["pid"] == server  # type: ignore[index]


def lowest_free(pid: int) -> int:
    taken = set(descriptors(pid))
    return next(fd for fd in range(len(taken) + 1) if fd not in taken)


def test_out_of_descriptors_the_server_waits_without_spinning_and_serves_again(
        kernel_world: RealWorld) -> None:
    server = first_start(kernel_world)
    limits = resource.prlimit(server, resource.RLIMIT_NOFILE)
    # `ulimit -n` at what it holds: every descriptor it could open is taken, so it cannot
    # accept the next connection (EMFILE) while that connection waits in its backlog.
    # Once the connection `describe` made is closed (it answered before closing it), and its
    # spare is ready (each spare holds one end of a socket pair to it).
    spares = test_kernel_spares.spare_pids(kernel_world)
    wait_for(lambda: len(sockets(server)) == 1 + len(spares))  # its listening socket
    resource.prlimit(server, resource.RLIMIT_NOFILE, (lowest_free(server), limits[1]))
    try:
        with connected(kernel_world) as sock:
            sock.sendall(json.dumps({"kind": "info"}).encode() + b"\n")
            cpu = kernels.cpu_seconds(server)
            time.sleep(2.0)  # the window its CPU is measured over, not a wait for an event
            used = kernels.cpu_seconds(server) - cpu
            assert not answered(sock)  # it could not accept meanwhile
            assert used < 0.2, f"{used:.2f} CPU-s in two seconds out of descriptors"
            resource.prlimit(server, resource.RLIMIT_NOFILE, limits)  # descriptors again
            answer = json.loads(sock.recv(65536))
        assert answer["pid"] == server
    finally:
        resource.prlimit(server, resource.RLIMIT_NOFILE, limits)
    assert server_log(kernel_world).count("cannot accept (Too many open files)") == 1
    with kernels.running(SPEC) as kernel:
        served(kernel, server)


def test_a_cache_root_another_user_can_write_means_ordinary_starts_and_one_warning(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    from bootstrap.warm import cache_dir

    server = first_start(kernel_world)
    root = Path(cache_dir())
    st = root.stat()
    # That user could rename our server directories: whatever answers there is not trusted.
    os.chown(root, 65534, 65534)
    os.chmod(root, 0o777)
    try:
        stderr = tmp_path / "stand-in.err"
        with stderr.open("wb") as err, kernels.running(SPEC, stderr=err) as kernel:
            assert report(kernel)["pid"] == kernel.pid  # the ordinary start, not a failure
    finally:
        os.chown(root, st.st_uid, st.st_gid)
        os.chmod(root, st.st_mode & 0o7777)
    warnings = [line for line in stderr.read_text().splitlines() if "kernel-bootstrap" in line]
    assert warnings == [f"kernel-bootstrap: warning: no kernel server: {root} is owned by uid "
                        "65534, not by this user; make it a directory of this user that only "
                        "this user can write (chmod go-w); starting the kernel the ordinary way"]
    with kernels.running(SPEC) as kernel:  # trusted again: served again
        served(kernel, server)

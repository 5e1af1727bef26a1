"""The server's spares (bootstrap.kernels.pool) paced around kernel starts: a spare stopped while
a kernel starts always goes on afterwards, also when it turned out ready meanwhile (its message
was on the way when it was stopped): a spare left stopped hung the request that claimed it."""

from __future__ import annotations

import selectors
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from bootstrap.kernels.pool import Member, Pool
from bootstrap.kernels.spare_reads import Ready
from testing.processes import wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def pool() -> Iterator[tuple[Pool, int]]:
    """A pool with one member: a child standing for a spare still preparing."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ours, theirs = socket.socketpair()
    selector = selectors.DefaultSelector()
    pool = Pool(1, selector, "venv")
    pool.members[child.pid] = Member(ours)
    try:
        yield pool, child.pid
    finally:
        child.kill()
        child.wait()
        ours.close()
        theirs.close()
        selector.close()


def test_a_spare_preparing_is_stopped_while_a_kernel_starts_and_goes_on_after(
        pool: tuple[Pool, int]) -> None:
    spares, pid = pool
    spares.pace(busy=True)
    wait_for(lambda: state(pid) == "T")
    spares.pace(busy=False)
    wait_for(lambda: state(pid) != "T")


def test_a_spare_stopped_then_found_ready_goes_on(pool: tuple[Pool, int]) -> None:
    spares, pid = pool
    spares.pace(busy=True)
    wait_for(lambda: state(pid) == "T")
    spares.members[pid].ready = Ready(frozenset(), {})  # its message, read after the stop
    spares.pace(busy=True)  # still busy: a ready spare may be claimed, so it runs
    wait_for(lambda: state(pid) != "T")

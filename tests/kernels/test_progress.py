"""The progress record of a starting kernel server, and when a start waits for it (issue 36
item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.kernels import places, progress


@pytest.fixture
def dirfd(tmp_path: Path) -> Iterator[int]:
    directory = tmp_path / "server"
    directory.mkdir(mode=0o700)
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_a_record_reads_back_as_written_and_a_shorter_one_replaces_it(dirfd: int) -> None:
    places.write_record(places.PROGRESS, {"phase": "kernel", "extras": "a,b,c"}, dir_fd=dirfd)
    places.write_record(places.PROGRESS, {"phase": "ready"}, dir_fd=dirfd)
    assert places.read_record(places.PROGRESS, dirfd) == {"phase": "ready"}


def test_a_torn_or_foreign_record_is_none(dirfd: int, tmp_path: Path) -> None:
    path = tmp_path / "server" / places.PROGRESS
    path.write_text("phase=ready kcpu=0.4")  # no end: a write in progress
    assert places.read_record(places.PROGRESS, dirfd) == {}
    path.unlink()
    os.mkfifo(path)  # never opened for reading: that would block
    assert places.read_record(places.PROGRESS, dirfd) == {}


def test_the_next_server_expects_what_the_last_preload_took(dirfd: int) -> None:
    first = progress.Progress(dirfd, ["kb_extra"])
    assert first.kcpu == progress.DEFAULT_KCPU and first.xwall is None  # nothing measured yet
    first.kernel_done()
    first.done()
    again = progress.Progress(dirfd, ["kb_extra"])
    assert again.kcpu == pytest.approx(first.kcpu, abs=0.001)
    assert again.xwall == pytest.approx(first.xwall, abs=0.001)
    assert progress.Progress(dirfd, ["kb_other"]).xwall is None  # another list: not measured


def record(phase: str, **fields: float | str) -> dict[str, str]:
    base: dict[str, float | str] = {"phase": phase, "kcpu": 0.4, "cpu0": 1.0, "xwall": 0.0,
                                    "xbegan": 100.0}
    return {k: str(v) for k, v in {**base, **fields}.items()}


def test_what_is_left_of_a_kernels_imports_is_cpu_seconds() -> None:
    assert progress.left(record("kernel"), cpu=1.3, now=0) == pytest.approx(0.1)
    assert progress.left(record("kernel"), cpu=1.0, now=0) == pytest.approx(0.4)


def test_kernel_preload_counts_in_wall_seconds_and_only_when_measured() -> None:
    assert progress.left(record("kernel", xwall=30.0), cpu=1.4, now=0) == 30.0
    assert progress.left(record("extra", xwall=30.0), cpu=1.4, now=120.0) == 10.0
    assert progress.left(record("extra", xwall="-"), cpu=1.4, now=120.0) is None
    assert progress.left(record("ready"), cpu=1.4, now=0) == 0.0


def test_a_start_does_not_wait_for_a_server_far_from_done(dirfd: int) -> None:
    places.write_record(places.PROGRESS, {**record("kernel", cpu0=0.0, kcpu=1000.0),
                                          "pid": os.getpid()}, dir_fd=dirfd)
    calls: list[int] = []
    assert progress.wait(dirfd, lambda: calls.append(1)) is None
    assert calls == []  # never even tried to connect


def test_a_start_stops_waiting_for_a_server_that_gets_no_cpu(dirfd: int) -> None:
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        places.write_record(places.PROGRESS, {**record("kernel", cpu0=-1.0, kcpu=0.1),
                                              "pid": sleeping.pid}, dir_fd=dirfd)
        calls: list[int] = []
        assert progress.wait(dirfd, lambda: calls.append(1)) is None
        assert 0 < len(calls) < 100  # tried while its share of a CPU was unknown, then gave up
    finally:
        sleeping.kill()
        sleeping.wait()


def test_a_start_waits_for_a_server_about_to_listen(dirfd: int) -> None:
    places.write_record(places.PROGRESS, {**record("ready"), "pid": os.getpid()}, dir_fd=dirfd)
    tries = iter([None, None, "connection"])
    assert progress.wait(dirfd, lambda: next(tries)) == "connection"

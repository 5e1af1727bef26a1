"""Child processes fed a stream: what the child sees, and how its failures are reported."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.errors import BootstrapError, ProcessError
from bootstrap.primitives import process
from testing import processes


def test_streaming_hands_the_child_everything_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with process.streaming("sh", "-c", f"cat > {out}", what="copy") as stdin:
        for piece in (b"a" * 100_000, b"b"):
            stdin.write(piece)
    assert out.read_bytes() == b"a" * 100_000 + b"b"


def test_a_failing_child_is_a_process_error_with_its_stderr_tail() -> None:
    with pytest.raises(ProcessError) as failed, \
            process.streaming("sh", "-c", "cat >/dev/null; echo 'disk on fire' >&2; exit 3",
                              what="tar could not extract") as stdin:
        stdin.write(b"data")
    assert failed.value.returncode == 3
    assert str(failed.value).startswith("tar could not extract (exit code 3)")
    assert "disk on fire" in str(failed.value)


def test_a_child_that_stops_reading_is_judged_by_its_exit_status() -> None:
    with pytest.raises(ProcessError, match="exit code 4"), \
            process.streaming("sh", "-c", "exit 4", what="early") as stdin:
        time.sleep(0.2)
        for _ in range(100):
            stdin.write(b"x" * 65536)


def test_an_error_in_the_block_kills_the_child_and_propagates(tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    with pytest.raises(KeyboardInterrupt), \
            process.streaming("sh", "-c", f"cat >/dev/null; touch {marker}", what="x"):
        raise KeyboardInterrupt
    assert not marker.exists()


def test_a_missing_command_fails_like_run_does() -> None:
    with pytest.raises(ProcessError) as failed, \
            process.streaming("no-such-command-kb", what="start it"):
        pass
    assert failed.value.returncode == 127 and "not found" in str(failed.value)


def test_feed_returns_stdout_and_reports_a_local_error_after_the_child_ends() -> None:
    def chunks() -> Iterator[bytes]:
        yield b"hello"
        raise BootstrapError("the source vanished")

    cmd = (sys.executable, "-c", "import sys; sys.stdin.read(); print('done')")
    ok = asyncio.run(process.feed(cmd, iter([b"hello"]), ("shown",), "push failed"))
    assert ok == "done\n"
    with pytest.raises(BootstrapError, match="the source vanished"):
        asyncio.run(process.feed(cmd, chunks(), ("shown",), "push failed"))


def test_background_runs_the_child_while_the_block_works_and_waits_for_it(
        tmp_path: Path) -> None:
    started, done = tmp_path / "started", tmp_path / "done"
    with process.background("sh", "-c", f"touch {started}; sleep 0.3; touch {done}", what="x"):
        deadline = time.monotonic() + 10
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert started.exists() and not done.exists()  # both at work at once
    assert done.exists()  # and the block's end waited for the child


def test_a_failing_background_child_fails_after_the_block_with_its_stderr_tail() -> None:
    ran = []
    with pytest.raises(ProcessError) as failed, \
            process.background("sh", "-c", "echo 'no space' >&2; exit 5", what="uv failed"):
        ran.append(True)
    assert ran == [True]
    assert failed.value.returncode == 5
    assert str(failed.value).startswith("uv failed (exit code 5)")
    assert "no space" in str(failed.value)


def test_an_error_in_the_background_block_kills_the_child(tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    with pytest.raises(KeyboardInterrupt), \
            process.background("sh", "-c", f"sleep 1; touch {marker}", what="x"):
        raise KeyboardInterrupt
    time.sleep(1.5)
    assert not marker.exists()


# A child that started one of its own (as uv starts a build backend): `( ... ) &` is a subshell.
_TREE = "(sleep 1.5; touch {marker}) & wait"


def test_stopping_a_background_child_stops_what_it_started(tmp_path: Path) -> None:
    marker = tmp_path / "grandchild-finished"
    with pytest.raises(KeyboardInterrupt), \
            process.background("sh", "-c", _TREE.format(marker=marker), what="x"):
        time.sleep(0.3)  # the subshell is running
        raise KeyboardInterrupt
    time.sleep(2.0)
    assert not marker.exists()


def test_a_timed_out_child_is_stopped_with_what_it_started(tmp_path: Path) -> None:
    marker = tmp_path / "grandchild-finished"
    with pytest.raises(ProcessError, match="timed out"):
        process.run("sh", "-c", _TREE.format(marker=marker), timeout=0.3, what="x")
    time.sleep(2.0)
    assert not marker.exists()


def test_children_inherit_a_descriptor_only_while_it_is_inherited(tmp_path: Path) -> None:
    path = tmp_path / "held"
    path.write_text("")
    fd = os.open(path, os.O_RDONLY)
    try:
        listing = "ls -l /proc/$$/fd"
        with process.inherited(fd):
            inside = process.run("sh", "-c", listing).stdout
        outside = process.run("sh", "-c", listing).stdout
    finally:
        os.close(fd)
    assert str(path) in inside and str(path) not in outside


def test_a_silent_child_is_stopped_as_stalled_with_what_it_started() -> None:
    # The subshell says its pid, then nothing: a server that accepted and never answers.
    script = "(echo $BASHPID $$ >&2; exec sleep 60) & sleep 1; echo said >&2; wait"
    with pytest.raises(ProcessError) as failed:
        process.run("bash", "-c", script, idle=2.0, what="fetch")
    error = failed.value
    assert error.returncode == -9 and "no output for 2 s: stopped as stalled" in error.stderr
    assert "said" in error.stderr  # the silence counted from its last word, not from its start
    grandchild, child = map(int, error.stderr.split()[:2])
    assert not any(processes.alive(pid) for pid in (grandchild, child))


def test_a_child_that_keeps_talking_outlives_the_idle_limit() -> None:
    script = "for i in $(seq 12); do echo $i >&2; sleep 0.1; done; echo done"
    result = process.run("sh", "-c", script, idle=0.5)
    assert result.stdout == "done\n" and result.stderr.split() == [str(i) for i in range(1, 13)]


def test_the_inherited_descriptors_number_is_the_childs() -> None:
    read, write = os.pipe()
    os.write(write, b"from memory\n")
    os.close(write)
    try:
        with process.inherited(read) as fd:
            out = process.run("sh", "-c", f"cat /dev/fd/{fd}").stdout
    finally:
        os.close(read)
    assert out == "from memory\n"

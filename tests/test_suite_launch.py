"""The suite does not depend on how it is launched: under ``nohup``, as a background job of a
non-interactive shell (both leave signals ignored, and that is inherited), and a failed test
leaves no process running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing import innerpytest
from testing.processes import spawn

# What nohup (SIGHUP) and a non-interactive shell's `&` (SIGINT, SIGQUIT) leave ignored, and a
# supervisor may (SIGTERM).
LAUNCHERS_IGNORE = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)


@pytest.fixture
def launched_ignoring() -> Iterator[None]:
    """This pytest process, as a launcher leaves it: those signals ignored, SIGUSR1 blocked."""
    before = {s: signal.signal(s, signal.SIG_IGN) for s in LAUNCHERS_IGNORE}
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        for signum, handler in before.items():
            signal.signal(signum, handler)


def signal_masks(ignore: tuple[signal.Signals, ...] = ()) -> tuple[set[int], set[int]]:
    """(ignored, blocked) signals of a child started by ``spawn``, as the kernel reports them."""
    proc = spawn(["cat", "/proc/self/status"], dict(os.environ), ignore=ignore)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    fields = dict(line.split(":\t", 1) for line in out.splitlines() if ":\t" in line)

    def signals(mask: str) -> set[int]:
        bits = int(mask, 16)
        return {n + 1 for n in range(64) if bits >> n & 1}

    return signals(fields["SigIgn"]), signals(fields["SigBlk"])


def test_a_child_a_test_signals_starts_with_default_dispositions_whatever_pytest_inherited(
        launched_ignoring: None) -> None:
    ignored, blocked = signal_masks()
    assert ignored & set(LAUNCHERS_IGNORE) == set()
    assert blocked == set()


def test_a_test_may_still_start_a_child_with_a_signal_ignored(launched_ignoring: None) -> None:
    ignored, _ = signal_masks(ignore=(signal.SIGHUP,))
    assert ignored & set(LAUNCHERS_IGNORE) == {signal.SIGHUP}


LEAVES_PROCESSES = """
    import os, subprocess, sys
    from testing.processes import spawn

    def test_fails_with_its_children_running():
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)", "{token}"]
        spawn(sleeper, dict(os.environ))  # in a session of its own, as the signal tests do
        subprocess.run(["sh", "-c", '"$0" "$@" &', *sleeper], check=True)  # orphaned at once
        assert False
"""


def running_with(token: str) -> list[int]:
    """The live processes whose command line has ``token``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if token.encode() in cmdline.split(b"\0") and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def test_a_failed_test_leaves_no_process_behind(tmp_path: Path) -> None:
    token = f"kb-left-{uuid.uuid4().hex}"
    proc = innerpytest.run(tmp_path, LEAVES_PROCESSES.replace("{token}", token),
                           tmp_path / "home")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "1 failed" in out, out
    left = running_with(token)
    for pid in left:  # this test's own clean-up, whatever it found
        os.kill(pid, signal.SIGKILL)
    assert left == []


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_reaper_finds_what_the_test_started_and_nothing_else() -> None:
    from testing import reaper

    tag = os.environ[reaper.TAG]
    child = subprocess.Popen(["sleep", "600"])
    other = subprocess.Popen(["sleep", "600"], env={**os.environ, reaper.TAG: "someone-else"})
    try:
        assert [pid for pid, _ in reaper.tagged(tag)] == [child.pid]
        assert reaper.kill_tagged(tag) == [f"{child.pid} sleep 600"]
        assert child.wait(timeout=10) == -signal.SIGKILL and other.poll() is None
    finally:
        other.kill()
        other.wait()

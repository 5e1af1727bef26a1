"""Child processes of a test: start (with default signal dispositions), wait for a condition,
kill the group, run with a terminal on stderr, measure peak memory, and sample a condition from a
thread while they run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testing.world import World


def start(world: World, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``ensure ARGS`` of ``world`` as a child in a process group of its own, so the kill takes
    uv (fake or real) down with it, as a sandbox teardown would."""
    return spawn(world.command("ensure", *args), {**world.env, **(env or {})})


def spawn(argv: Sequence[str], env: dict[str, str],
          ignore: Sequence[signal.Signals] = ()) -> subprocess.Popen[str]:
    """``argv`` as a child in a new session (its own process group), output piped, every signal
    at its default disposition but those in ``ignore`` (see :func:`default_signals`)."""
    return subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: default_signals(ignore))


def default_signals(ignore: Sequence[signal.Signals] = ()) -> None:
    """In a child between fork and exec: every signal unblocked and at its default disposition,
    then ``ignore``'s ignored. The ``preexec_fn`` of every child a test sends a signal to.

    An ignored signal stays ignored across exec: under ``nohup`` (SIGHUP) or as a
    non-interactive shell's background job (SIGINT, SIGQUIT) the suite's children inherited
    it, so the SIGHUP and ^C tests waited for an exit that never came. Reset here, in the
    child, not in pytest itself: the launcher's choice stays with the suite (under nohup a
    hang-up must not stop it) and holds for every child no test signals.
    """
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):  # those the C library keeps for itself
            signal.signal(signum, signal.SIG_DFL)
    for signum in ignore:
        signal.signal(signum, signal.SIG_IGN)


def wait_for(predicate: Callable[[], object], timeout: float = 30.0,
             proc: subprocess.Popen[str] | None = None) -> None:
    """Poll ``predicate`` until true; with ``proc``, fail early (with its stderr) if it ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the child ended (exit {proc.returncode}) before the "
                                 f"condition was reached:\n{err}")
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc``'s whole process group (see spawn) and reap it."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)


def session_members(sid: int) -> list[str]:
    """The live processes (zombies aside) of session ``sid``, as ``pid command`` lines.

    A child started by :func:`spawn` leads a session of its own; the children it starts stay
    in that session even in process groups of their own, so what is left of it after it exited
    is exactly what it leaked. Linux only (it reads /proc).
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # it ended while we looked
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        state, session = fields[0], int(fields[3])
        if session == sid and state not in ("Z", "X"):
            found.append(f"{entry} {cmdline}")
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] not in ("Z", "X")


def run_with_tty_stderr(cmd: list[str], env: dict[str, str], timeout: float = 60.0,
                        ) -> tuple[int, str, str]:
    """Run ``cmd`` with stderr on a pseudo-terminal (stdout stays a pipe): what a person at a
    shell sees. Returns (exit code, stdout, stderr) with the terminal's CRLF turned back into LF.
    """
    import pty
    import select

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=slave, env=env)
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
        else:
            proc.kill()
            raise AssertionError(f"{cmd} did not finish within {timeout} s")
        assert proc.stdout is not None
        stdout = proc.stdout.read().decode()
        code = proc.wait(timeout=timeout)
    finally:
        os.close(master)
        if proc.stdout is not None:
            proc.stdout.close()
    return code, stdout, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")



# Linux carries a process's memory high-water mark across fork and exec into the child's
# ru_maxrss, so a child started straight from a pytest process that has grown to 250 MB reports
# >= 250 MB whatever it used itself (seen in CI, not in a short local run). A small launcher
# process starts the measured command and reports its wait4 figures instead.
_RSS_LAUNCHER = """
import json, os, subprocess, sys
proc = subprocess.Popen(json.loads(sys.argv[1]), stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss]))
"""


def peak_rss_run(argv: Sequence[str], env: dict[str, str], timeout: float = 600.0
                 ) -> tuple[int, float, int, str]:
    """Run ``argv``; return (exit code, wall seconds, peak RSS in bytes, stderr).

    The peak comes from ``os.wait4`` in a small launcher (see above): the child's own maximum
    resident set (Linux counts its waited-for children in too, e.g. the ``sh``/``tar`` of an
    exec push).
    """
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _RSS_LAUNCHER, json.dumps(list(argv))],
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.monotonic() - began
    if done.returncode != 0 or not done.stdout.strip():
        raise AssertionError(f"the RSS launcher failed: {done.stderr[-2000:]}")
    code, maxrss = json.loads(done.stdout.strip().splitlines()[-1])
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
    return int(code), wall, int(maxrss) * scale, done.stderr


@contextlib.contextmanager
def sampling(classify: Callable[[], str], pause: float = 0.0) -> Iterator[Counter[str]]:
    """A reader thread counting ``classify()`` results continuously until the block ends."""
    counts: Counter[str] = Counter()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            counts[classify()] += 1
            if pause:
                time.sleep(pause)

    reader = threading.Thread(target=loop, daemon=True)
    reader.start()
    try:
        yield counts
    finally:
        stop.set()
        reader.join()

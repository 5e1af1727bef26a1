"""The stand-in exits with the kernel's wait status as a bare kernel's launcher would see it
(issue 35, item 7): a signal death as that signal (SIGKILL too, whose action cannot be set),
128+N for a signal that would stop or not end it, an exit code as itself; never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from testing.processes import default_signals

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False, preexec_fn=default_signals)


@pytest.mark.parametrize(("status", "code"), [
    (signal.SIGKILL, -signal.SIGKILL),  # the OOM killer's: signal.signal(SIGKILL) is EINVAL
    (signal.SIGTERM, -signal.SIGTERM),
    (signal.SIGSEGV | 0x80, -signal.SIGSEGV),  # dumped core: the stand-in writes none
    (7 << 8, 7),
    (0, 0),
    (signal.SIGTSTP, 128 + signal.SIGTSTP),  # re-raised, it would stop the stand-in
    (signal.SIGCHLD, 128 + signal.SIGCHLD),  # re-raised, it would do nothing
    (0x7F | signal.SIGSTOP << 8, -signal.SIGKILL),  # a stopped status is no end: the guess
    (1 << 20, -signal.SIGKILL),  # not a wait status at all: the guess
])
def test_the_stand_in_exits_as_the_kernel_did_without_a_traceback(status: int, code: int) -> None:
    done = python("import signal\n"
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as the launcher may leave it\n"
                   "from bootstrap.kernels.standin import _exit_as\n"
                   f"_exit_as({status})")
    assert (done.returncode, done.stderr) == (code, "")


def test_an_exit_read_with_the_pid_is_the_stand_ins_answer() -> None:
    """A kernel that ends as it starts: the server's ``pid`` and ``exit`` arrive in one read;
    the stand-in exits with that status (it once took the next read's EOF for a SIGKILL)."""
    done = python(
        "import os, socket\n"
        "from bootstrap.kernels import client\n"
        "ours, server = socket.socketpair()\n"
        "server.sendall(b'{\"queued\":true}\\n{\"pid\":999999}\\n{\"exit\":1792}\\n')\n"
        "server.shutdown(socket.SHUT_WR)  # EOF after it: only the exit read with the pid says\n"
        "replies = client.Replies(ours)\n"
        "pid = client._request(ours, {'kind': 'kernel'}, replies=replies)\n"
        "client._stand_in(ours, pid, replies)\n")
    assert (done.returncode, done.stderr) == (7, "")

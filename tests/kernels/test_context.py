"""The launcher's context, as the kernel server sees it (issue 35): what a wrapper set up that
the server may set for itself is carried by the forked kernel exactly; what it may not (another
namespace, cgroup, capability set, securebits, a higher limit) refuses the fork.

Each "launcher" is a real process started through a real wrapper (``nice``, ``ulimit``,
``unshare``, ``taskset``, ``ionice``, ``choom``, ``prlimit``, a cgroup); each "server" is a
Python process that reads it through :mod:`bootstrap.kernels.context`, and, when it may, applies
it to itself and reports what /proc then shows of it, compared with what /proc shows of the
launcher.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from testing.processes import wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

ROOT = Path(__file__).resolve().parents[2]
# What /proc shows of a process's settable context, read independently of the code under test.
FACTS = textwrap.dedent("""\
    import json, os
    def facts(pid):
        proc = f"/proc/{pid}"
        status = dict(l.split(":", 1) for l in open(f"{proc}/status").read().splitlines())
        stat = open(f"{proc}/stat").read().rsplit(")", 1)[1].split()
        return {"umask": status["Umask"].strip(), "nice": stat[16],
                "limits": open(f"{proc}/limits").read(),
                "oom_score_adj": open(f"{proc}/oom_score_adj").read(),
                "timerslack": open(f"{proc}/timerslack_ns").read(),
                "affinity": sorted(os.sched_getaffinity(pid)),
                "ioprio": __import__("subprocess").run(["ionice", "-p", str(pid)],
                    capture_output=True, text=True).stdout}
""")
SERVER = FACTS + textwrap.dedent("""\
    import sys
    from bootstrap.kernels import context
    peer = int(sys.argv[1])
    theirs = context.read(peer, int(sys.argv[2]))
    reason = context.refusal(theirs, context.own())
    if reason is None:
        context.apply(theirs)
    print(json.dumps({"refused": reason, "kernel": facts(os.getpid()), "launcher": facts(peer)}))
""")


@contextmanager
def launcher(*wrapper: str) -> Iterator[int]:
    """A process started through ``wrapper`` (which execs it: the pid stays), waiting."""
    mark = f"kb-launcher-{uuid.uuid4().hex}"
    proc = subprocess.Popen([*wrapper, sys.executable, "-c",
                             f"import time; time.sleep(120)  # {mark}"])
    try:
        wait_for(lambda: mark in Path(f"/proc/{proc.pid}/cmdline").read_text(errors="replace"))
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def server(peer: int, *, securebits: int = 0, wrapper: Sequence[str] = ()) -> dict[str, object]:
    result = subprocess.run([*wrapper, sys.executable, "-c", SERVER, str(peer), str(securebits)],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


ULIMITS = 'umask 077; ulimit -n 256; ulimit -v 4000000; ulimit -s 4096; exec "$@"'


@pytest.mark.parametrize("wrapper", [
    [], ["nice", "-n", "5"], ["sh", "-c", ULIMITS, "sh"], ["taskset", "-c", "0"],
    ["ionice", "-c", "3"], ["ionice", "-c", "2", "-n", "7"], ["choom", "-n", "300", "--"],
    ["prlimit", "--nproc=500:600", "--core=0:0", "--cpu=1000", "--"],
], ids=lambda w: " ".join(w[:3]) or "bare")
def test_the_kernel_carries_exactly_what_its_launcher_was_given(wrapper: list[str]) -> None:
    if wrapper and shutil.which(wrapper[0]) is None:
        pytest.skip(f"{wrapper[0]} is not installed")
    with launcher(*wrapper) as pid:
        answer = server(pid)
    assert answer["refused"] is None
    assert answer["kernel"] == answer["launcher"]


def test_a_wrapper_that_changes_something_is_seen_at_all() -> None:
    # The comparison above is not vacuous: the wrapped launcher differs from an unwrapped one.
    with launcher("sh", "-c", ULIMITS, "sh") as wrapped, launcher() as plain:
        assert server(wrapped)["launcher"] != server(plain)["launcher"]


@pytest.mark.parametrize(("wrapper", "what"), [
    (["unshare", "-m"], "mnt namespace"), (["unshare", "-n"], "net namespace"),
    (["unshare", "-u"], "uts namespace"), (["unshare", "-i"], "ipc namespace"),
    (["setpriv", "--no-new-privs"], "NoNewPrivs"),
    (["setpriv", "--bounding-set", "-sys_admin"], "Cap"),  # CapPrm loses it too
    (["nice", "-n", "-5"], "nice value"),
])
def test_what_a_process_cannot_set_for_itself_refuses_the_fork(wrapper: list[str],
                                                                what: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("the wrappers need root")
    with launcher(*wrapper) as pid:
        answer = server(pid)
    assert what in str(answer["refused"])


def test_securebits_the_stand_in_reports_refuse_the_fork() -> None:
    with launcher() as pid:
        assert "securebits" in str(server(pid, securebits=0x2f)["refused"])


def test_a_limit_the_server_cannot_raise_refuses_the_fork() -> None:
    # The first launcher gave the server `ulimit -n 128`: a later launcher with more must not
    # get a kernel with 128 (today: EMFILE in every later kernel).
    with launcher() as pid:
        answer = server(pid, wrapper=["sh", "-c", 'ulimit -n 128; exec "$@"', "sh"])
    assert "RLIMIT_NOFILE" in str(answer["refused"])


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    root = Path("/sys/fs/cgroup/memory")
    if not os.access(root, os.W_OK):
        pytest.skip("no writable cgroup v1 memory hierarchy")
    group = root / f"kb-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        yield group
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip())
        group.rmdir()


def test_a_launcher_in_another_cgroup_refuses_the_fork(memory_cgroup: Path) -> None:
    wrapper = ["sh", "-c", f'echo $$ > {memory_cgroup}/cgroup.procs; exec "$@"', "sh"]
    with launcher(*wrapper) as pid:
        answer = server(pid)
    assert answer["refused"] == "its cgroup differs from the kernel server's"

"""A detached server is spawned only where it will be reaped when it exits (issue 35): in a PID
namespace whose PID 1 is the launcher itself (a container without an init), an idled-out
server would stay its zombie."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux" or shutil.which("unshare") is None,
                                reason="needs Linux and unshare")
ROOT = Path(__file__).resolve().parents[2]
ASK = "from bootstrap.kernels.spawn import reaped; print(reaped())"


def reaped(*wrapper: str) -> str:
    result = subprocess.run([*wrapper, sys.executable, "-c", ASK], capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    if result.returncode != 0 and "unshare" in result.stderr:
        pytest.skip(f"unshare failed: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_in_the_initial_pid_namespace_a_server_is_spawned() -> None:
    assert reaped() == "True"


def test_a_launcher_that_is_pid_1_of_its_namespace_spawns_no_server() -> None:
    assert reaped("unshare", "--pid", "--fork", "--mount-proc") == "False"


def test_under_an_init_that_handles_sigchld_a_server_is_spawned() -> None:
    # sh as PID 1 waits for any child (dash and bash catch SIGCHLD), as tini does.
    shell = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", '"$@"; exit $?', "sh"]
    assert reaped(*shell) == "True"


def test_where_proc_shows_another_namespace_no_server_is_spawned() -> None:
    # Without --mount-proc, /proc's PID 1 is the host's: ours cannot be read.
    assert reaped("unshare", "--pid", "--fork") == "False"

"""The native stand-in with real kernels (issue 36 item 2): where the install has it (a C compiler
built it: hatch_build.py), the kernelspec starts it first; it asks the venv's server itself, the
server making the gate's warm check for it, and stays as the served kernel's stand-in; for
anything else it execs the lean argv, which does what it always did. What both stand-ins share
(signals, exit statuses, the server's refusals) is tested on both in test_kernel_server.py and
test_kernel_standin_exit.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testing import kernels
from tests.integration import test_kernel_server
from tests.integration.conftest import RealWorld
from tests.integration.test_kernel_server import (
    SPEC,
    first_start,
    report,
    served,
    server_log,
    wait_for_server,
)

pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")

kernel_world = test_kernel_server.kernel_world  # the fixture: pytest finds it in this module


def spec_argv(world: RealWorld) -> list[str]:
    path = Path(world.env["JUPYTER_DATA_DIR"]) / "kernels" / SPEC / "kernel.json"
    argv: list[str] = json.loads(path.read_text())["argv"]
    return argv


def exe(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/exe")


@pytest.fixture(autouse=True)
def _native(kernel_world: RealWorld) -> None:
    argv = spec_argv(kernel_world)
    if not kernels.native_argv(argv):
        assert shutil.which("cc") is None, f"a C compiler is here, yet no native stand-in: {argv}"
        pytest.skip("this install has no native stand-in (no C compiler built it)")


def test_the_native_stand_in_hands_the_kernel_to_the_server_and_stands_in_for_it(
        kernel_world: RealWorld) -> None:
    argv = spec_argv(kernel_world)
    assert argv[1:3] == [str(kernel_world.venv), str(kernel_world.config)]
    assert argv[3:6] == [sys.executable, "-I", "-S"]  # the lean argv, for everything else
    # No server yet: the native stand-in execs the lean argv, an ordinary start that spawns one.
    with kernels.running(SPEC) as first:
        assert report(first)["pid"] == first.pid and exe(first.pid) != argv[0]
    server = wait_for_server(kernel_world)  # the one that start spawned
    with kernels.running(SPEC) as kernel:
        served(kernel, server)
        # What jupyter_client launched is the native program itself: it never exec'd.
        assert exe(kernel.pid) == argv[0]
    assert "ordinary start" not in server_log(kernel_world)


def test_the_environment_reaches_the_kernel_byte_for_byte(kernel_world: RealWorld) -> None:
    # The native stand-in writes the request's JSON itself: quotes, backslashes, controls,
    # non-ASCII, characters beyond the BMP, and bytes that are no UTF-8 at all (os.environ
    # reads those with surrogateescape; the kernel's environment must hold the same bytes).
    odd = 'q"uote\\ tab\t nl\n bell\x07 del\x7f caf\u00e9 \u20ac \U0001f600 raw\udce9\udcff end'
    server = first_start(kernel_world)
    with kernels.running(SPEC, env={**os.environ, "KA_ODD": odd}) as kernel:
        served(kernel, server)
        reply, printed = kernels.execute(
            kernel, "import os; print(os.environb[b'KA_ODD'].hex())")
        assert reply["status"] == "ok", reply
    assert bytes.fromhex(printed.strip()) == os.fsencode(odd)


def test_a_failure_to_report_is_the_lean_entrys_to_say(kernel_world: RealWorld,
                                                        tmp_path: Path) -> None:
    # An invalid SKILL.md: the warm fingerprint holds and records it, and the gate must say so
    # at every start: only the lean entry (Python) says it. The server, checking for the native
    # stand-in, refuses; the lean entry then warns once and is served.
    broken = kernel_world.skills_dir / "broken"
    broken.mkdir()
    (broken / "SKILL.md").write_text("no front matter\n")
    server = first_start(kernel_world)
    stderr = tmp_path / "stderr.log"
    with stderr.open("wb") as err, kernels.running(SPEC, stderr=err) as kernel:
        served(kernel, server)
        # The lean stand-in stands in (the tool's interpreter).
        assert exe(kernel.pid) == os.path.realpath(sys.executable)
    assert stderr.read_text().count("skill is invalid") == 1, stderr.read_text()
    assert "the gate has a skill failure to report" in server_log(kernel_world)


def test_a_run_that_is_no_kernel_launch_is_never_forked(kernel_world: RealWorld) -> None:
    first_start(kernel_world)
    argv = spec_argv(kernel_world)
    command = [*argv[:argv.index("--") + 1], "-c", "import os; print(os.getppid())"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == os.getpid()  # what we started ran it: nothing was forked
    assert "not an ipykernel launch" in server_log(kernel_world)

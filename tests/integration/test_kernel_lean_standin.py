"""The kernelspec's lean entry with real kernels (issue 36 item 2): the tool's interpreter started
``-I -S`` hands the kernel to the server and stays as its stand-in, importing only the standard
library and this package; a config whose fingerprint does not hold gets the full ``run`` (uv
runs); a kernelspec of the old form (the console script) is still served."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from testing import kernels
from testing.processes import wait_for
from tests.integration import test_kernel_server
from tests.integration.conftest import RealWorld

pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")

SPEC = "kernel-bootstrap"
SELF = "import os; print(os.getpid(), os.getppid())"


kernel_world = test_kernel_server.kernel_world  # the fixture: pytest finds it in this module


def spec_dir(world: RealWorld, name: str = SPEC) -> Path:
    return Path(world.env["JUPYTER_DATA_DIR"]) / "kernels" / name


def add_spec(world: RealWorld, name: str, argv: list[str]) -> None:
    """A kernelspec ``name`` beside the installed one, with ``argv``."""
    spec = json.loads((spec_dir(world) / "kernel.json").read_text())
    spec["argv"] = argv
    spec_dir(world, name).mkdir()
    (spec_dir(world, name) / "kernel.json").write_text(json.dumps(spec))


def server_pid(world: RealWorld) -> int:
    from bootstrap.kernels import info

    found: list[int] = []

    def up() -> bool:
        answer = info.describe(world.venv)
        if answer is not None:
            found.append(answer["pid"])
        return bool(found)

    wait_for(up, timeout=120)
    return found[0]


def pids(kernel: kernels.Started) -> tuple[int, int]:
    reply, printed = kernels.execute(kernel, SELF)
    assert reply["status"] == "ok", reply
    pid, ppid = map(int, printed.split())
    return pid, ppid


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0")[:-1]]


def imported(log: Path) -> set[str]:
    """The modules ``-X importtime`` reported in ``log``."""
    return {line.rsplit("|", 1)[1].strip() for line in log.read_text().splitlines()
            if line.startswith("import time:") and "|" in line} - {"imported package"}


def lean(world: RealWorld) -> list[str]:
    """The installed kernelspec's lean argv: all of it, or what the native stand-in execs."""
    argv: list[str] = json.loads((spec_dir(world) / "kernel.json").read_text())["argv"]
    return kernels.lean_argv(argv)


def test_the_lean_stand_in_is_served_and_imports_only_the_standard_library(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    argv = lean(kernel_world)
    assert argv[:3] == [sys.executable, "-I", "-S"]
    # The same spec with -X importtime: what the stand-in imported goes to its stderr.
    add_spec(kernel_world, "timed", [argv[0], "-X", "importtime", *argv[1:]])
    with kernels.running(SPEC) as first:  # no server yet: an ordinary start that spawns one
        assert pids(first)[0] == first.pid
    server = server_pid(kernel_world)
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr, kernels.running("timed", stderr=stderr) as kernel:
        pid, ppid = pids(kernel)
        # Forked by the server; what jupyter_client launched is still the lean interpreter.
        assert (ppid, pid != kernel.pid) == (server, True)
        assert cmdline(kernel.pid)[:6] == [*argv[:1], "-X", "importtime", *argv[1:4]]
    modules = imported(log)
    assert {"bootstrap.warm", "bootstrap.kernels.client", "bootstrap.kernels.standin"} <= modules
    assert "site" not in modules
    assert {m for m in modules if m.split(".")[0] not in (*sys.stdlib_module_names,
                                                          "bootstrap")} == set()


def test_a_kernelspec_of_the_old_form_is_still_served(kernel_world: RealWorld) -> None:
    argv = lean(kernel_world)
    add_spec(kernel_world, "old", argv[6:])  # [<kernel-bootstrap>, "run", "--config", ...]
    with kernels.running("old") as first:
        assert pids(first)[0] == first.pid
    server = server_pid(kernel_world)
    with kernels.running("old") as kernel:
        pid, ppid = pids(kernel)
        assert (ppid, pid != kernel.pid) == (server, True)
        assert cmdline(kernel.pid)[1:3] == [argv[6], "run"]  # the console script stands in


def test_a_config_whose_fingerprint_does_not_hold_gets_the_full_run(
        kernel_world: RealWorld) -> None:
    kernel_world.skill("beta")
    kernel_world.clear_log()
    with kernels.running(SPEC) as kernel:
        reply, printed = kernels.execute(kernel, "import beta; print(beta.__name__)")
        assert reply["status"] == "ok" and printed == "beta\n", reply
    # The lean entry cannot run uv: the console script's full `run` did, and installed beta.
    assert kernel_world.uv_calls() != []

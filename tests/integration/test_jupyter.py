"""Kernels started by jupyter_client from the installed kernelspec, with the real uv and ipykernel:
they go through ``kernel-bootstrap run``, so what changed since the install is there."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from testing import kernels
from testing.kernelworlds import KernelWorlds
from tests.integration.conftest import RealWorld, kernel_world_copy

jupyter_client = pytest.importorskip("jupyter_client")


@pytest.fixture
def kernel_world(kernel_worlds: KernelWorlds[RealWorld],
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[RealWorld]:
    """A world whose runtime is ipykernel, with its kernelspec installed for the user (in a
    Jupyter data dir of the world's, which jupyter_client then searches too). A copy of one
    built once."""
    yield kernel_world_copy(kernel_worlds, monkeypatch, skills=("alpha",))


def run_in_kernel(code: str) -> tuple[dict[str, Any], str, int]:
    """Start the installed kernel as Jupyter does, run ``code``, shut it down; return the
    execute reply's content, what the kernel printed and the pid jupyter_client started."""
    manager = jupyter_client.KernelManager(kernel_name="kernel-bootstrap")
    manager.start_kernel()
    launched = manager.provisioner.process.pid
    client = manager.client()
    client.start_channels()
    printed: list[str] = []
    try:
        client.wait_for_ready(timeout=180)

        def output(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                printed.append(msg["content"]["text"])

        reply = client.execute_interactive(code, timeout=60, output_hook=output)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    return reply["content"], "".join(printed), launched


def test_the_kernelspec_starts_the_kernel_through_run(kernel_world: RealWorld) -> None:
    spec = jupyter_client.kernelspec.KernelSpecManager().get_kernel_spec("kernel-bootstrap")
    # The native stand-in where a C compiler built it, then the lean entry (cli.lean_run).
    argv = spec.argv
    if shutil.which("cc") is not None:
        assert kernels.native_argv(argv)
        assert argv[1:3] == [str(kernel_world.venv), str(kernel_world.config)]
        argv = kernels.lean_argv(argv)
    assert argv[1:3] == ["-I", "-S"]
    assert argv[7:10] == ["run", "--config", str(kernel_world.config)]


def test_a_skill_added_after_the_install_imports_in_a_kernel_jupyter_starts(
        kernel_world: RealWorld) -> None:
    kernel_world.skill("beta")
    reply, printed, launched = run_in_kernel(
        "import os, sys, alpha, beta; print(sys.prefix, beta.__name__, os.getpid())")
    assert reply["status"] == "ok", reply
    # sys.prefix is the venv's current generation: the kernel is pinned to the tree it started in.
    assert printed.split() == [str(kernel_world.venv.resolve()), "beta", str(launched)]
    assert kernel_world.status()["ready"] is True


def test_a_kernel_still_starts_when_the_rebuild_fails_and_the_old_venv_is_usable(
        kernel_world: RealWorld) -> None:
    # A runtime requirement no index has: the rebuild fails; the old runtime starts instead.
    kernel_world.write_config(requirements=["ipykernel>=6", "kb-no-such-package-anywhere==1"])
    reply, printed, launched = run_in_kernel("import os, sys, alpha; print(sys.prefix, "
                                             "os.getpid())")
    assert reply["status"] == "ok", reply
    assert printed.split() == [str(kernel_world.venv.resolve()), str(launched)]
    status = kernel_world.status()
    # Still to be rebuilt: recorded as a failed rebuild, retried at the next start (backoff).
    assert status["runtime"] == "failed" and status["marker"] == "ok"

"""Serving from the second start (issue 36 item 4), with the real uv, ipykernel and
jupyter_client: starts right after the first, server-less one wait for the server it spawned
while that is faster than an ordinary start, and start the ordinary way when it is not."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from testing import kernels, kernelserver, reaper
from testing.processes import wait_for
from tests.integration import test_kernel_server as served_tests
from tests.integration.conftest import RealWorld

pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")

kernel_world = served_tests.kernel_world  # the fixture: ipykernel, its kernelspec installed
SPEC = served_tests.SPEC


def progress(world: RealWorld) -> dict[str, str]:
    """The server's progress record, as a start reads it."""
    from bootstrap.kernels import places

    directory = places.server_dir(str(world.venv))
    assert directory is not None
    try:
        fd = places.open_dir(directory, create=False)
    except FileNotFoundError:  # no server made it yet
        return {}
    try:
        return places.read_record(places.PROGRESS, fd)
    finally:
        os.close(fd)


def near(world: RealWorld) -> bool:
    """Whether a start now would find the starting server near enough to wait for it (what
    :func:`bootstrap.kernels.progress.wait` checks first); True once it listens."""
    from bootstrap.kernels import progress as progress_

    if served_tests.describe(world) is not None:
        return True
    record = progress(world)
    cpu = progress_.cpu_seconds(record.get("pid", "0"))
    left = progress_.left(record, cpu, time.time()) if cpu is not None else None
    return left is not None and left < 0.5 * progress_.WORTH * float(record["kcpu"])


PRIORITY = """\
import os
group = "/proc/self/autogroup"
print(os.getpriority(os.PRIO_PROCESS, 0),
      open(group).read().split()[-1] if os.path.exists(group) else "0")
"""


def test_the_second_and_third_starts_right_after_the_first_are_served(
        kernel_world: RealWorld) -> None:
    """Served unless the server had made next to no progress when the start began: its
    imports yield to the first start, and a machine without an idle core gives them none (an
    ordinary start is faster then)."""
    started: list[kernels.Started] = []
    found_near: list[bool] = []
    try:
        for _ in range(3):  # each begun at the previous one's kernel_info reply
            found_near.append(bool(started) and near(kernel_world))
            started.append(kernels.start(SPEC))
        server = served_tests.wait_for_server(kernel_world)
        first = served_tests.report(started[0])
        assert first["pid"] == started[0].pid  # the ordinary start, which spawned the server
        for kernel, waited in zip(started[1:], found_near[1:], strict=True):
            if waited:
                served_tests.served(kernel, server)  # forked (or a spare) of the server
        with kernels.running(SPEC) as kernel:  # whatever the load: the server is up by now
            served_tests.served(kernel, server)
            # Its imports yielded to the first start; none of that reaches a kernel.
            assert kernels.execute(kernel, PRIORITY)[1].split() == ["0", "0"]
        record = progress(kernel_world)
        assert record["pid"] == str(server) and record["phase"] == "ready"
        assert float(record["kcpu"]) > 0  # the next server's starts compare with this preload
    finally:
        for kernel in started:
            kernels.stop(kernel)


NAP = """\
    import time
    time.sleep(1.5)
"""


def test_a_start_waits_for_a_server_near_ready(kernel_world: RealWorld) -> None:
    site = next(kernel_world.venv.glob("lib/python*/site-packages"))
    (site / "kb_nap.py").write_text(textwrap.dedent(NAP))
    kernel_world.write_config(requirements=["ipykernel>=6"], kernel_preload=["kb_nap"])
    served_tests.first_start(kernel_world)  # a server that measured its preload, then stopped
    kernelserver.stop(os.environ[reaper.TAG])
    with kernels.running(SPEC) as first:  # no server: the ordinary start, which spawns one
        assert served_tests.report(first)["pid"] == first.pid
        wait_for(lambda: progress(kernel_world).get("phase") == "extra", timeout=120)
        # kb_nap sleeps; the record says for how long the last one did: near its end, a start
        # waits, whatever the machine's load (what is left is counted in wall seconds).
        wait_for(lambda: near(kernel_world), timeout=120)
        assert served_tests.describe(kernel_world) is None  # not listening yet
        with kernels.running(SPEC) as kernel:
            server = served_tests.wait_for_server(kernel_world)
            served_tests.served(kernel, server)


SLEEPY = """\
    import time
    time.sleep(30)
"""


def test_a_start_does_not_wait_for_a_server_far_from_ready(kernel_world: RealWorld) -> None:
    site = next(kernel_world.venv.glob("lib/python*/site-packages"))
    (site / "kb_sleepy.py").write_text(textwrap.dedent(SLEEPY))
    kernel_world.write_config(requirements=["ipykernel>=6"], kernel_preload=["kb_sleepy"])
    with kernels.running(SPEC) as kernel:
        assert served_tests.report(kernel)["pid"] == kernel.pid  # ordinary, spawns one
    # The server's own imports are done; kernel-preload's sleeps, for how long no server of
    # this venv has measured yet (the test's teardown ends it: SIGTERM).
    wait_for(lambda: progress(kernel_world).get("phase") == "extra", timeout=120)
    with kernels.running(SPEC) as kernel:
        assert served_tests.report(kernel)["pid"] == kernel.pid  # ordinary: not waited for
    assert progress(kernel_world)["phase"] == "extra"  # the server was still not ready
    assert served_tests.describe(kernel_world) is None

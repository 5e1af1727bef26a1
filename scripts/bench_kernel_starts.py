"""Parts of scripts/bench_kernel.py (it imports this module): the kernel-start figures issue 36
added (starts through ``wait_for_ready``, what most launchers call; the back-to-back starts
after a server-less first one; bursts counted by the kernels they lost rather than run again),
a process's PSS, and the warm ``run`` against a bare interpreter.

Not a benchmark of its own: bench_kernel.py's world, kernelspecs and interleaving are used.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_lib import KERNEL_BOOTSTRAP, Timing, check, median, quartiles, run_timed
from bench_report import Table, ms, ratio

from testing import kernels
from testing.world import World


def ready_start(name: str, quiet: dict[str, Any], before: Callable[[], None],
                after: Callable[[], None]) -> Timing:
    """start_kernel -> ``wait_for_ready`` returning, as a launcher that waits for the kernel
    sees it (jupyter_client's client flushes IOPub before it says ready)."""
    from jupyter_client.manager import KernelManager

    before()
    manager = KernelManager(kernel_name=name)
    began = time.perf_counter()
    manager.start_kernel(**quiet)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        seconds = time.perf_counter() - began
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        after()
    return Timing(seconds, 0.0)


# -- jupyter_client's own floor: a provisioner that starts nothing ------------------------------

FLOOR = "kb-bench-floor"


def floor_kernelspec(data_dir: Path, running: kernels.Started) -> str:
    """A kernelspec whose provisioner starts nothing: its launch hands out ``running``, a kernel
    already up. start_kernel -> kernel_info reply through it is what jupyter_client itself
    costs (its pre-start, its connection file and control socket, the 10 ms it sleeps in
    ``in_pending_state``, the probe's round trip): the floor under any provisioner's start.
    The provisioner is registered in jupyter_client's provisioner factory's cache, where its
    entry point would put it."""
    from importlib.metadata import EntryPoint

    from jupyter_client.connect import KernelConnectionInfo
    from jupyter_client.provisioning.factory import KernelProvisionerFactory
    from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase

    class Floor(KernelProvisionerBase):
        pid = running.pid

        @property
        def has_process(self) -> bool:
            return True

        async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
            kwargs.pop("extra_arguments", None)
            return {**await super().pre_launch(**kwargs), "cmd": []}

        async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
            self.connection_info = info.copy()
            return self.connection_info

        async def poll(self) -> int | None:
            return None

        async def wait(self) -> int | None:
            return 0

        async def send_signal(self, signum: int) -> None:
            pass

        async def kill(self, restart: bool = False) -> None:
            pass

        async def terminate(self, restart: bool = False) -> None:
            pass

        async def cleanup(self, restart: bool = False) -> None:
            pass

    info = running.manager.get_connection_info()
    globals()["Floor"] = Floor  # what the entry point loads
    KernelProvisionerFactory.instance().provisioners[FLOOR] = EntryPoint(
        FLOOR, f"{__name__}:Floor", KernelProvisionerFactory.GROUP_NAME)
    spec_dir = data_dir / "kernels" / FLOOR
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": ["/bin/false", "-f", "{connection_file}"], "display_name": "floor",
        "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": FLOOR}}}))
    return FLOOR


def ordinary(pid: int) -> bool:
    """Whether the launched process ``pid`` became the kernel (the ordinary start: the gate
    exec'd the venv's interpreter) rather than staying its stand-in (served)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return argv[1:3] == [b"-m", b"ipykernel_launcher"]


@dataclass
class BackToBack:
    seconds: list[float]  # start_kernel -> kernel_info reply of starts 1, 2, 3
    served: list[bool]


def back_to_back(name: str, quiet: dict[str, Any], no_server: Callable[[], None],
                 after: Callable[[], None], n: int = 3) -> BackToBack:
    """``n`` starts of ``name``, each right after the previous one's reply (all kept running,
    as a user opening notebooks), the first with no server."""
    no_server()
    started: list[kernels.Started] = []
    try:
        for _ in range(n):
            started.append(kernels.start(name, **quiet))
        return BackToBack([k.seconds for k in started],
                          [not ordinary(k.pid) for k in started])
    finally:
        kernels.stop_all(started)
        after()


# A kernel whose port was taken may hang in ipykernel's exit (bare ones do): counted lost after
# 3 min, many times a quiet burst of 100 here, rather than the harness's 10.
LOST_AFTER = 180.0


def lost_in_burst(name: str, n: int, quiet: dict[str, Any]) -> tuple[float, int]:
    """``n`` kernels of ``name`` at once: (wall until the last of those that answered answered,
    how many died or hung instead: a hung one would make the wall :data:`LOST_AFTER`)."""
    burst, errors = kernels.start_each(name, n, timeout=LOST_AFTER, **quiet)
    kernels.stop_all(burst.kernels)
    return burst.answered, len(errors)


def b2b_table(pairs: list[BackToBack]) -> Table:
    rows = [[str(i + 1), ms(median(p.seconds[i] for p in pairs)),
             f"{sum(p.served[i] for p in pairs)}/{len(pairs)}"] for i in range(3)]
    return Table("Three starts back to back, the first with no server",
                 ["start", "median ms", "served"], rows,
                 [f"{len(pairs)} rounds; each start right after the previous one's kernel_info "
                  "reply, all three kept running; the server stopped before each round."])


def pss_kib(pid: int) -> int:
    """The proportional set size of ``pid`` (KiB): its private pages plus its share of those it
    shares, so the sum over processes is what they cost together (0 if it has ended)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


# How many of a page's 512 words a copied page has changed, as the page-table table groups them.
WORD_GROUPS = ((0, 0, "none"), (1, 1, "1"), (2, 7, "2-7"), (8, 63, "8-63"), (64, 512, "64-512"))
NEW = "new: no page of the server's at its address"
_PAGE = 4096


def copied_pages(pid: int, parent: int) -> dict[str, int] | None:
    """Where ``pid``'s private pages (a forked kernel's, ``parent`` its server) come from, in
    KiB: *new* ones, and copies of a page ``parent`` still has at the same address, by how many
    of its 8-byte words differ from the parent's (a refcount written and put back differs in
    none: the page was copied for nothing). None without ptrace access to both (root, or a
    ``ptrace_scope`` of 0). /proc/PID/pagemap: bit 63 present, bit 56 mapped by this process
    alone."""
    import contextlib
    import struct

    groups = dict.fromkeys([label for *_, label in WORD_GROUPS] + [NEW], 0)
    with contextlib.ExitStack() as stack:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
                ranges = [[int(x, 16) for x in line.split()[0].split("-")]
                          for line in f if line.split()[1].startswith("rw")]
            maps, pmaps = (stack.enter_context(open(f"/proc/{p}/pagemap", "rb"))
                           for p in (pid, parent))
            mem, pmem = (stack.enter_context(open(f"/proc/{p}/mem", "rb", buffering=0))
                         for p in (pid, parent))
        except OSError:
            return None
        for start, end in ranges:
            count = (end - start) // _PAGE
            maps.seek(start // _PAGE * 8)
            pmaps.seek(start // _PAGE * 8)
            entries = struct.unpack(f"<{count}Q", maps.read(count * 8))
            raw = pmaps.read(count * 8)
            parents = struct.unpack(f"<{len(raw) // 8}Q", raw)
            for i, entry in enumerate(entries):
                if not (entry >> 63 & 1 and entry >> 56 & 1):
                    continue  # absent, or shared
                if i >= len(parents) or not parents[i] >> 63 & 1:
                    groups[NEW] += _PAGE // 1024
                    continue
                try:
                    mem.seek(start + i * _PAGE)
                    pmem.seek(start + i * _PAGE)
                    ours, theirs = mem.read(_PAGE), pmem.read(_PAGE)
                except OSError:
                    continue
                changed = sum(ours[j:j + 8] != theirs[j:j + 8] for j in range(0, _PAGE, 8))
                groups[next(lab for low, high, lab in WORD_GROUPS if low <= changed <= high)] \
                    += _PAGE // 1024
    return groups


def pages_table(per_kernel: list[dict[str, int]]) -> Table:
    """A served kernel's private pages by where they come from (:func:`copied_pages`), the
    mean over ``per_kernel``."""
    n = len(per_kernel)
    total = sum(sum(g.values()) for g in per_kernel) / n
    labels = {**{lab: f"copied, {lab} of 512 words changed" for *_, lab in WORD_GROUPS},
              NEW: NEW}
    rows = [[text, f"{sum(g[key] for g in per_kernel) / n / 1024:.1f}",
             f"{100 * sum(g[key] for g in per_kernel) / n / total:.0f}%"]
            for key, text in labels.items()]
    rows.append(["all private pages", f"{total / 1024:.1f}", "100%"])
    return Table(f"A served kernel's private pages (mean of {n}: the idle kernels and the spare)",
                 ["pages", "MiB", "share"], rows,
                 ["Copied: the server has a page at the same address, from which the fork's "
                  "copy-on-write made the kernel's; words compared 8 bytes at a time. A page "
                  "copied with few words changed was copied for a reference count written "
                  "(any object the kernel's code touches), not for data of its own."])


def fast_variants(world: World) -> dict[str, Callable[[], Timing]]:
    config = ["--config", str(world.config)]
    argvs: dict[str, list[str | Path]] = {
        "`python -c pass` (the venv's)": [world.python, "-c", "pass"],
        "`kernel-bootstrap run -- -c pass`": [KERNEL_BOOTSTRAP, "run", *config, "--", "-c",
                                              "pass"],
        "`kernel-bootstrap ensure`": [KERNEL_BOOTSTRAP, "ensure", *config],
    }
    for argv in argvs.values():
        check(argv, world.env)  # each works, and the first run's compile is not timed
    return {name: functools.partial(run_timed, argv, world.env) for name, argv in argvs.items()}


def fast_table(times: dict[str, list[Timing]], rounds: int) -> Table:
    base = median(t.wall for t in times["`python -c pass` (the venv's)"])
    rows = []
    for name, runs in times.items():
        wall = [t.wall for t in runs]
        q1, q3 = quartiles(wall)
        rows.append([name, ms(median(wall)), f"{ms(q1)}-{ms(q3)}", ratio(median(wall), base),
                     ms(median(t.cpu for t in runs))])
    return Table("Warm `run` against a bare interpreter start",
                 ["command", "median ms", "IQR ms", "vs python -c pass", "CPU ms"], rows,
                 [f"Median of {rounds} interleaved rounds; `run` is the warm check, then an "
                  "exec of the same interpreter: two interpreter starts in one process."])

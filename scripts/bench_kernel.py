"""Benchmark: kernels served by the kernel server against bare starts (issues 29 and 36); what
the gate costs a kernel start; a warm ``run`` against a bare interpreter.

One warm world (the real uv, the README's ipykernel runtime, two skills) gets four kernelspecs
from ``kernelspec install``: *served* (the default argv: the native stand-in where this
install built it, else the lean one, through ``run``; the server on, its default spare), *bare*
(the same argv, for a second config file naming the same venv with ``kernel-server = false``:
the switch is part of the warm fingerprint, and one file alternating would take the full check
at every start), *direct* (``--direct``: the interpreter itself) and *provisioner*
(``--provisioner``: jupyter_client asks the server itself); and, where the served argv starts
the native stand-in, *served-lean*: the same kernelspec with the lean argv the native one
execs for anything it does not serve (single starts and memory: the native stand-in's gain).
jupyter_client starts them as Jupyter does, each timed from ``start_kernel`` to the
``kernel_info`` reply by testing/kernels.py's probe (``wait_for_ready`` adds ~0.2 s of IOPub
waiting), then shut down (``now=True``). Interleaved rounds, order rotating, cells medians:

- single starts: *served* and *provisioner* with the server up and its spare ready (after the
  first); *first*, the served kernelspec with no server (stopped before, waited for after,
  untimed); *bare*; *direct*; *served* and *bare* through ``wait_for_ready`` instead of the
  probe, as most launchers wait; jupyter_client's *floor* (a provisioner that starts nothing:
  its kernel is one already running), through the probe and through ``wait_for_ready``;
- ``--b2b-rounds`` times, three starts of *served* back to back (each right after the previous
  one's reply, the first with no server): which were served;
- ``--burst`` kernels requested at once (a thread each, jupyter_client's own ports): wall time
  until all have answered or died, and how many died;
- once, ``--pss`` idle kernels of each kind: the summed PSS (/proc/PID/smaps_rollup) of what the
  user pays for them. *served*: the stand-ins (the ``run`` processes jupyter_client started),
  the server and all below it (kernels, spares) and any fork of it elsewhere; *bare*, *direct*:
  the launched processes and all below them (the kernel: ``run`` execs it);
- and for *served*, where each of its kernels' private pages comes from: a copy of a page the
  server still has (by how many of its words differ) or a new one (with ptrace access to the
  server: root);
- the idle server: user + system CPU (/proc/PID/stat) of the server and its spares over
  ``--idle-seconds``, no kernel running;
- as before issue 29, a warm ``kernel-bootstrap run -- -c pass`` against ``python -c pass``.

No timed start called uv (its log says), and no kernel or server of the run is left at the end.
``--no-served``: bare and direct only. Usage::

    .venv/bin/python scripts/bench_kernel.py [--rounds 21] [--burst 100] [--burst-rounds 3]
        [--b2b-rounds 5] [--pss 20] [--idle-seconds 60] [--fast-rounds 51] [--no-served]
        [--markdown]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path lines, so the script runs from a checkout without installing.
from bench_kernel_starts import (
    LOST_AFTER,
    BackToBack,
    b2b_table,
    back_to_back,
    copied_pages,
    fast_table,
    fast_variants,
    floor_kernelspec,
    lost_in_burst,
    pages_table,
    pss_kib,
    ready_start,
)
from bench_lib import (
    KERNEL_BOOTSTRAP,
    RUNTIME,
    Timing,
    bench_parser,
    check,
    interleave,
    log_size,
    median,
    open_workspace,
    quartiles,
    rmtree,
)
from bench_report import Table, ms, ratio, secs

from testing import kernels, kernelserver, reaper
from testing.world import World

SERVED, BARE, DIRECT, PROV = "kb-served", "kb-bare", "kb-direct", "kb-provisioner"
LEAN = "kb-served-lean"  # the served kernelspec without the native stand-in: its lean argv
FIRST = "first"  # the served kernelspec with no server yet
FLOOR = "floor"  # a provisioner that starts nothing: jupyter_client's own cost
READY_SERVED, READY_BARE = "ready-served", "ready-bare"  # through wait_for_ready
READY_FLOOR = "ready-floor"  # the floor through wait_for_ready
# Kernels' output: banners would bury the tables; stderr goes to the run's log (main opens it).
QUIET: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
FAILED: list[str] = []  # bursts run again because a kernel died (the burst table says so)
TAG = reaper.new_tag()  # every process of the run carries it: the server, its kernels too
VENV = Path()  # the world's venv (kernel_world sets it): whose server the figures watch
SPARES = 1  # the config's kernel-spares (the default)


def wait_server_up() -> None:
    kernelserver.wait_up(TAG, VENV)


def settle_kernels(timeout: float = 10.0) -> None:
    kernelserver.settle(TAG, timeout)


def kernel_world(root: Path) -> World:
    """A warm world on the real uv (behind the workspace's logging shim) with the kernelspecs
    installed into a Jupyter data dir of its own (and :data:`LEAN` beside them)."""
    global VENV
    world = World(root / "world")
    VENV = world.venv
    world.env.update(os.environ)  # the workspace's HOME, caches and uv shim
    world.env.pop("KERNEL_BOOTSTRAP_BATCH_BUILDS", None)
    world.env.pop("KERNEL_BOOTSTRAP_KERNEL_SERVER", None)
    world.env["JUPYTER_DATA_DIR"] = str(root / "jupyter")
    world.env[reaper.TAG] = TAG
    world.write_config(requirements=list(RUNTIME))
    bare = world.config.with_name("bare.toml")  # beside it: the same relative venv
    bare.write_text(world.config.read_text() + "kernel-server = false\n", encoding="utf-8")
    world.skill("alpha")
    world.skill("beta")
    for name, config, extra in ((SERVED, world.config, []), (BARE, bare, []),
                                (DIRECT, world.config, ["--direct"]),
                                (PROV, world.config, ["--provisioner"])):
        check([KERNEL_BOOTSTRAP, "kernelspec", "install", "--name", name, *extra,
               "--config", str(config)], world.env)
        check([KERNEL_BOOTSTRAP, "ensure", "--config", str(config)], world.env)  # fingerprint
    spec = json.loads((root / "jupyter" / "kernels" / SERVED / "kernel.json").read_text())
    if kernels.native_argv(spec["argv"]):  # this install built the native stand-in
        spec["argv"] = kernels.lean_argv(spec["argv"])
        (root / "jupyter" / "kernels" / LEAN).mkdir()
        (root / "jupyter" / "kernels" / LEAN / "kernel.json").write_text(json.dumps(spec))
    return world


def has_lean() -> bool:
    """Whether the run has the :data:`LEAN` kernelspec (the served one starts the native)."""
    return Path(os.environ["JUPYTER_DATA_DIR"], "kernels", LEAN).is_dir()


# --- the figures -----------------------------------------------------------------------------


def one_start(name: str) -> Timing:
    """start_kernel -> kernel_info reply, and the launched process's CPU by then (the kernel
    for bare and direct, a process keeps its CPU across exec; the stand-in for served)."""
    kernel = kernels.start(name, **QUIET)
    cpu = kernels.cpu_seconds(kernel.pid)
    kernels.stop(kernel)
    settle_kernels()
    return Timing(kernel.seconds, cpu)


def served_start(name: str = SERVED) -> Timing:
    # After a burst, or the first start's server still importing; and its spare ready, as
    # for kernels started a second or more apart.
    spare_ready()
    return one_start(name)


def floor_start(name: str) -> Timing:
    """start_kernel -> kernel_info reply through a provisioner that hands out a kernel already
    running (bench_kernel_starts.floor_kernelspec): no process of its own to measure."""
    kernel = kernels.start(name, **QUIET)
    kernels.stop(kernel)  # its provisioner's kill: nothing
    return Timing(kernel.seconds, 0.0)


def spare_ready() -> None:
    kernelserver.wait_up(TAG, VENV, spares=SPARES)


def first_start() -> Timing:
    kernelserver.stop(TAG)
    timing = one_start(SERVED)
    wait_server_up()  # the server that start spawned: its warm-up is timed by nobody
    return timing


def many(name: str, n: int) -> kernels.Burst:
    """``n`` idle kernels of ``name`` at once (for their memory); a burst in which one dies
    before answering, or hangs (another process took a port jupyter_client picked), is run
    again, twice at most."""
    for _ in range(3):
        if name in (SERVED, PROV, LEAN):
            spare_ready()
        try:
            return kernels.start_many(name, n, timeout=LOST_AFTER, **QUIET)
        except (RuntimeError, TimeoutError) as e:
            FAILED.append(f"{name}: {e} ({'; '.join(getattr(e, '__notes__', []))})")
            settle_kernels(60.0)
    raise RuntimeError(f"three bursts of {name} in a row failed: {FAILED[-3:]}")


def log_lines() -> list[str]:
    """The kernels' stderr so far, without ipykernel's warning about TCP."""
    path = Path(QUIET["stderr"].name) if hasattr(QUIET["stderr"], "name") else None
    text = path.read_text(errors="replace") if path else ""
    return [line for line in text.splitlines() if "WARNING" not in line]


LOST: dict[str, list[int]] = {}  # kernels of each kind that died in a burst, per round
PAGES: list[dict[str, int]] = []  # where the idle served kernels' private pages come from


def burst(name: str, n: int) -> float:
    if name in (SERVED, PROV, LEAN):
        spare_ready()
    wall, lost = lost_in_burst(name, n, QUIET)
    LOST.setdefault(name, []).append(lost)
    settle_kernels(60.0)
    return wall


def pss(name: str, n: int) -> dict[str, tuple[int, int]]:
    """Summed PSS (KiB) and number of the processes that run for ``n`` idle kernels of ``name``
    (see the module docstring), by part: the launched processes (for served: the stand-ins),
    and for served the server and its kernels and spares."""
    started = many(name, n)
    try:
        time.sleep(2.0)  # idle: past their start-up's last allocations
        table = kernels.processes()
        parts = {"launched": kernels.descendants([k.pid for k in started.kernels], table)}
        main = None
        if name in (SERVED, LEAN):
            tree, main = kernelserver.tree(TAG, table), kernelserver.find(TAG)
            assert main is not None
            parts |= {"server": {main.pid}, "kernels": tree - {main.pid}}
        sizes = {part: (sum(map(pss_kib, pids)), len(pids)) for part, pids in parts.items()}
        if name == SERVED and main is not None:  # after the PSS, which it must not change
            found = [copied_pages(pid, main.pid) for pid in sorted(parts["kernels"])]
            PAGES[:] = [g for g in found if g is not None]
        return sizes
    finally:
        kernels.stop_all(started.kernels)
        settle_kernels(60.0)


def idle_cpu(seconds: float) -> float:
    """CPU seconds the server and its spares used over ``seconds`` with nothing to do."""
    wait_server_up()
    pids = kernelserver.tree(TAG)
    before = sum(map(kernels.cpu_seconds, pids))
    time.sleep(seconds)
    return sum(map(kernels.cpu_seconds, pids)) - before


# --- the tables ------------------------------------------------------------------------------

LEAN_ARGV = "TOOL/bin/python -I -S -c ... run --config C -- -m ipykernel_launcher -f F"
NATIVE_ARGV = "kb-standin VENV C " + LEAN_ARGV
STARTS = ((SERVED, "served, after the first (server up, spare ready)", NATIVE_ARGV),
          (LEAN, "served-lean: the lean stand-in (the served argv without the native one)",
           LEAN_ARGV),
          (PROV, "provisioner, after the first (server up, spare ready)", "(the same argv)"),
          (FLOOR, "jupyter_client's floor: a provisioner that starts nothing (hands out a "
           "kernel already running)", "(none)"),
          (FIRST, "served, first start (no server yet)", NATIVE_ARGV),
          (BARE, "bare: through `run`, `kernel-server = false`", NATIVE_ARGV),
          (DIRECT, "`--direct`", "VENV/bin/python -m ipykernel_launcher -f F"),
          (READY_SERVED, "served, through wait_for_ready", NATIVE_ARGV),
          (READY_BARE, "bare, through wait_for_ready", NATIVE_ARGV),
          (READY_FLOOR, "jupyter_client's floor, through wait_for_ready", "(none)"))


def start_table(times: dict[str, list[Timing]], rounds: int) -> Table:
    bare, direct = (median(t.wall for t in times[k]) for k in (BARE, DIRECT))
    rows = []
    for key, label, argv in STARTS:
        if key not in times:
            continue
        wall = [t.wall for t in times[key]]
        q1, q3 = quartiles(wall)
        rows.append([label, f"`{argv}`", ms(median(wall)), f"{ms(q1)}-{ms(q3)}",
                     ratio(median(wall), bare), ratio(median(wall), direct),
                     ms(median(t.cpu for t in times[key]))])
    return Table("Kernel start by jupyter_client, start_kernel to kernel_info reply (direct probe)",
                 ["kernelspec", "argv", "median ms", "IQR ms", "vs bare", "vs --direct",
                  "launched process CPU ms"], rows,
                 [f"Median of {rounds} interleaved rounds; each kernel shut down (now=True) and "
                  "gone before the next start.",
                  "Launched process CPU: the kernel's for bare and --direct (across the exec), "
                  "the stand-in's for served (its kernel is the server's child)."])


def burst_table(walls: dict[str, list[float]], n: int, rounds: int) -> Table:
    bare, direct = median(walls[BARE]), median(walls[DIRECT])
    rows = []
    for key, label, _ in STARTS:
        if key in walls:
            q1, q3 = quartiles(walls[key])
            rows.append([label.split(",")[0].split(":")[0], secs(median(walls[key])),
                         f"{secs(q1)}-{secs(q3)}", ratio(median(walls[key]), bare),
                         ratio(median(walls[key]), direct),
                         " ".join(map(str, LOST.get(key, [])))])
    return Table(f"{n} kernels requested at once, until all answered kernel_info",
                 ["kernelspec", "median wall s", "IQR s", "vs bare", "vs --direct",
                  "lost (died or hung), per round"], rows,
                 [f"Median of {rounds} interleaved rounds; one thread per kernel, launches "
                  "serialised as on jupyter_server's event loop, the waits overlapping; the "
                  "ports jupyter_client picks itself (the provisioner's: the kernel's own).",
                  "Wall: until the last of the kernels that answered answered; a kernel that "
                  f"died, or had not answered after {LOST_AFTER:g} s (one whose port was taken "
                  "may hang in ipykernel's exit), is counted lost instead.",
                  *(f"Run again (memory figure): {failure}" for failure in FAILED)])


def pss_table(sizes: dict[str, dict[str, tuple[int, int]]], n: int) -> Table:
    total = {k: sum(kib for kib, _ in parts.values()) for k, parts in sizes.items()}
    rows = []
    for key, label, _ in STARTS:
        if key in sizes:
            detail = ", ".join(f"{part} {kib / 1024:.0f} MiB ({count})"
                               for part, (kib, count) in sizes[key].items())
            rows.append([label.split(",")[0].split(":")[0], detail, f"{total[key] / 1024:.0f}",
                         f"{total[key] / 1024 / n:.1f}", ratio(total[key], total[BARE]),
                         ratio(total[key], total[DIRECT])])
    return Table(f"Memory of {n} idle kernels (summed PSS)",
                 ["kernelspec", "parts: PSS (processes)", "PSS MiB", "per kernel MiB",
                  "vs bare", "vs --direct"], rows,
                 ["served: the stand-ins (launched), the server, and below it its kernels and "
                  "spares; bare and --direct: the kernels (launched: `run` execs the kernel)."])


def verdict(value: float, bar: float, goal: float) -> str:
    return "goal met" if value <= goal else "bar met" if value <= bar else "**not met**"


def targets(starts: dict[str, list[Timing]], walls: dict[str, list[float]],
            sizes: dict[str, dict[str, tuple[int, int]]], idle: float, idle_seconds: float,
            pairs: list[BackToBack]) -> Table:
    def r(key: str, base: str = BARE) -> float:
        return median(t.wall for t in starts[key]) / median(t.wall for t in starts[base])
    burst_r = median(walls[SERVED]) / median(walls[BARE])
    lost = sum(LOST.get(SERVED, [])), sum(LOST.get(PROV, []))
    pss_r = (sum(kib for kib, _ in sizes[SERVED].values())
             / sum(kib for kib, _ in sizes[BARE].values()))
    ticks = round(idle * os.sysconf("SC_CLK_TCK"))
    served = [sum(p.served[i] for p in pairs) for i in (1, 2)]
    rows = [["served start (argv kernelspec) / bare", "<= 0.1x", "<= 0.05x",
             f"{r(SERVED):.3f}x", verdict(r(SERVED), 0.1, 0.05)],
            ["provisioner start / bare (jupyter_client's floor / bare)", "<= 0.06x", "<= 0.04x",
             f"{r(PROV):.3f}x ({r(FLOOR):.3f}x)", verdict(r(PROV), 0.06, 0.04)],
            ["served / bare, both through wait_for_ready (jupyter_client's floor / bare)",
             "<= 0.45x", "<= 0.35x",
             f"{r(READY_SERVED, READY_BARE):.3f}x ({r(READY_FLOOR, READY_BARE):.3f}x)",
             verdict(r(READY_SERVED, READY_BARE), 0.45, 0.35)],
            ["first start / bare", "<= 1.05x", "<= 1.0x", f"{r(FIRST):.3f}x",
             verdict(r(FIRST), 1.05, 1.0)],
            ["2nd and 3rd back-to-back starts", "served", "served",
             f"2nd {served[0]}/{len(pairs)}, 3rd {served[1]}/{len(pairs)} served",
             "bar met" if served == [len(pairs)] * 2 else "**not met**"],
            ["burst, default ports: wall / bare; kernels lost (argv; provisioner)", "<= 0.25x; 0",
             "<= 0.15x; 0", f"{burst_r:.3f}x; {lost[0]}; {lost[1]}",
             "**not met**" if lost[0] or lost[1] else verdict(burst_r, 0.25, 0.15)],
            ["PSS of idle served kernels (with spares, stand-ins) / bare", "<= 0.55x",
             "<= 0.45x", f"{pss_r:.3f}x", verdict(pss_r, 0.55, 0.45)],
            [f"idle server (and spare) CPU over {idle_seconds:g} s", "~0 (<= 0.05% of a core)",
             "0 (no clock tick)", f"{ms(idle)} ms ({ticks} ticks)",
             verdict(idle, idle_seconds * 0.0005, 0.0)]]
    return Table("Issue 36 targets", ["figure", "bar", "goal", "measured", "verdict"], rows)


# --- the run ---------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, 21, "single kernel starts per kind", "the real uv")
    p.add_argument("--burst", type=int, default=100, help="kernels requested at once (100)")
    p.add_argument("--burst-rounds", type=int, default=3, help="rounds of the bursts (3)")
    p.add_argument("--b2b-rounds", type=int, default=5,
                   help="rounds of three back-to-back starts (5)")
    p.add_argument("--pss", type=int, default=20, help="idle kernels whose memory is summed (20)")
    p.add_argument("--idle-seconds", type=float, default=60.0,
                   help="how long the idle server's CPU is watched (60)")
    p.add_argument("--fast-rounds", type=int, default=51,
                   help="rounds of the `run -- -c pass` table (default 51)")
    p.add_argument("--no-served", action="store_true",
                   help="bare and --direct only (a host where kernels are not served)")
    return p.parse_args(argv)


def measure(args: argparse.Namespace, world: World) -> list[Table]:
    served = not args.no_served
    kinds = [SERVED, BARE, DIRECT, PROV] if served else [BARE, DIRECT]
    singles: dict[str, Callable[[], Timing]] = {
        BARE: functools.partial(one_start, BARE), DIRECT: functools.partial(one_start, DIRECT)}
    if served:
        singles |= {SERVED: served_start, FIRST: first_start,
                    PROV: functools.partial(served_start, PROV),
                    READY_SERVED: functools.partial(ready_start, SERVED, QUIET, spare_ready,
                                                    settle_kernels),
                    READY_BARE: functools.partial(ready_start, BARE, QUIET, lambda: None,
                                                  settle_kernels)}
    if served and has_lean():
        singles[LEAN] = functools.partial(served_start, LEAN)
        kinds.append(LEAN)
    # The floor's kernel, untagged: it runs through every round, which settle_kernels waits
    # out for the tagged ones.
    untagged = {k: v for k, v in os.environ.items() if k != reaper.TAG}
    running = kernels.start(DIRECT, env=untagged, **QUIET) if served else None
    try:
        if running is not None:
            name = floor_kernelspec(Path(os.environ["JUPYTER_DATA_DIR"]), running)
            singles[FLOOR] = functools.partial(floor_start, name)
            singles[READY_FLOOR] = functools.partial(ready_start, name, QUIET, lambda: None,
                                                     lambda: None)
        starts = interleave(singles, args.rounds)
    finally:
        if running is not None:
            kernels.stop(running)
    pairs = [back_to_back(SERVED, QUIET, functools.partial(kernelserver.stop, TAG),
                          settle_kernels) for _ in range(args.b2b_rounds if served else 0)]
    # A burst of LEAN is the served one's but for the stand-in: its single starts and memory say
    # what the native stand-in changes.
    walls = interleave({k: functools.partial(burst, k, args.burst) for k in kinds if k != LEAN},
                       args.burst_rounds)
    sizes = {k: pss(k, args.pss) for k in kinds if k != PROV}
    tables = [start_table(starts, args.rounds), burst_table(walls, args.burst, args.burst_rounds),
              pss_table(sizes, args.pss)]
    if PAGES:  # else no ptrace access to the server (bench_kernel_starts.copied_pages)
        tables.append(pages_table(PAGES))
    if served:
        idle = idle_cpu(args.idle_seconds)
        tables.insert(1, b2b_table(pairs))
        tables.insert(0, targets(starts, walls, sizes, idle, args.idle_seconds, pairs))
    return tables


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    root = Path(tempfile.mkdtemp(prefix="kb-bench-kernel-"))
    cwd = os.getcwd()
    try:
        QUIET["stderr"] = (root / "kernels.log").open("w")  # closed with the process
        ws = open_workspace(root, args.uv)
        os.environ["KERNEL_BOOTSTRAP_UV"] = str(ws.shim)
        os.chdir(root)
        world = kernel_world(root)
        os.environ.update(world.env)  # jupyter_client starts kernels with our environment
        for name in (BARE, DIRECT) if args.no_served else (SERVED, BARE, DIRECT, PROV):
            one_start(name)  # each works, and the first start's compile is not timed
        calls = log_size(ws.uv_log)
        tables = measure(args, world)
        tables.append(fast_table(interleave(fast_variants(world), args.fast_rounds),
                                 args.fast_rounds))
        assert log_size(ws.uv_log) == calls, "a timed start called uv: it was not warm"
        print("\n".join(t.render(args.markdown) for t in tables))
    except BaseException:
        print("\n".join(log_lines()[-30:]), file=sys.stderr)  # what the kernels said
        raise
    finally:
        os.chdir(cwd)
        try:
            kernelserver.stop(TAG)
            kernels.assert_no_orphans(TAG, [root])
        finally:
            rmtree(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

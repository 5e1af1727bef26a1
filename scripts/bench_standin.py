"""Benchmark: what a served kernel's stand-in costs (issue 36 item 2): the console script's entry,
the lean one and the native one, and the interpreter starts that bound a Python stand-in.

One warm world (the real uv, the README's ipykernel runtime, two skills) gets its kernelspecs
from one ``kernelspec install``: *native* (the default argv where this install built the native
stand-in: it asks the server itself), *lean* (what the native one execs for anything else, and
the default argv without it: the tool's interpreter ``-I -S -c``, the warm ``run`` in-process)
and *gate* (the same spec with the gate argv alone, the console script
``kernel-bootstrap run ...``: what every kernelspec held before). All go to the same venv's
kernel server, which is up before anything is timed. Interleaved rounds, order rotating, medians:

``--head DIR`` adds *head*: the gate run from another copy of the package (e.g. ``git archive
HEAD``), as its console script would (the same interpreter, site and all), for a before/after of
the shared stand-in code (client, standin, protocol).

- single starts: the stand-in's CPU (``/proc/PID/schedstat``, nanoseconds; ``/proc/PID/stat``'s
  ticks are 10 ms) at the kernel_info reply and again after ``--idle`` seconds, and
  start_kernel -> kernel_info reply;
- ``--pss`` idle kernels of each kind at once: the stand-ins' mean PSS (smaps_rollup);
- what bounds a pure-Python stand-in: ``python -I -S -c pass`` and ``python -I -c pass`` (the
  tool's interpreter; CPU from the children's rusage), and the PSS of 20 idle ``-I -S``
  interpreters (blocked on a read).

Every timed start is checked to be served (the stand-in did not exec into the kernel), and no
timed start called uv. Usage::

    .venv/bin/python scripts/bench_standin.py [--rounds 21] [--pss 20] [--pss-rounds 3]
        [--idle 3] [--head DIR] [--markdown]
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path lines, so the script runs from a checkout without installing.
from bench_lib import (
    KERNEL_BOOTSTRAP,
    RUNTIME,
    bench_parser,
    check,
    interleave,
    log_size,
    median,
    open_workspace,
    rmtree,
    run_timed,
)
from bench_report import Table, ms, ratio

from testing import kernels, kernelserver, reaper
from testing.world import World

LEAN, GATE, HEAD, NATIVE = "kb-lean", "kb-gate", "kb-head", "kb-native"
QUIET: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
TAG = reaper.new_tag()
VENV = Path()
MIB = 1024.0


@dataclass(frozen=True)
class Standin:
    start: float  # start_kernel -> kernel_info reply, seconds
    cpu: float  # the stand-in's CPU seconds at the reply
    idle_cpu: float  # ... and after the idle wait


def schedstat(pid: int) -> float:
    """CPU seconds ``pid`` has run (the scheduler's own count, in nanoseconds)."""
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as f:
        return int(f.read().split()[0]) / 1e9


def pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


def served(pid: int, name: str) -> bool:
    """Whether ``pid`` (what jupyter_client launched for ``name``) stayed a stand-in of that
    kind: it did not exec into the kernel, so its command line is still the kernelspec's, `run`
    and all, and it is the native program for :data:`NATIVE` only (which execs the lean argv
    for a start it does not serve)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        stayed = b"\0run\0" in f.read()
    return stayed and kernels.runs_native(pid) == (name == NATIVE)


def kernel_world(root: Path, head: Path | None) -> World:
    """A warm world on the real uv with the lean kernelspec (installed), the gate one (its
    argv cut to the gate part) and, with ``head``, the gate from that copy of the package, in a
    Jupyter data dir of its own."""
    global VENV
    world = World(root / "world")
    VENV = world.venv
    world.env.update(os.environ)
    for key in ("KERNEL_BOOTSTRAP_BATCH_BUILDS", "KERNEL_BOOTSTRAP_KERNEL_SERVER"):
        world.env.pop(key, None)
    world.env["JUPYTER_DATA_DIR"] = str(root / "jupyter")
    world.env[reaper.TAG] = TAG
    world.write_config(requirements=list(RUNTIME))
    world.skill("alpha")
    world.skill("beta")
    out = json.loads(check([KERNEL_BOOTSTRAP, "kernelspec", "install", "--json", "--name", LEAN,
                            "--config", str(world.config)], world.env))
    spec_file = Path(out["path"]) / "kernel.json"
    spec = json.loads(spec_file.read_text())
    if kernels.native_argv(spec["argv"]):  # the native stand-in, then the lean argv
        write_spec(spec_file.parent.parent / NATIVE, spec)
        spec["argv"] = kernels.lean_argv(spec["argv"])
        spec_file.write_text(json.dumps(spec, indent=1))
    assert spec["argv"][1:3] == ["-I", "-S"], spec["argv"]
    spec["argv"] = spec["argv"][6:]  # [<kernel-bootstrap>, "run", ...]: the console script
    write_spec(spec_file.parent.parent / GATE, spec)
    if head is not None:
        code = (f"import sys; sys.path.insert(0, {str(head)!r}); "
                "from bootstrap.cli import run; run()")
        spec["argv"] = [sys.executable, "-c", code, *spec["argv"][1:]]
        write_spec(spec_file.parent.parent / HEAD, spec)
    check([KERNEL_BOOTSTRAP, "ensure", "--config", str(world.config)], world.env)
    return world


def has_native() -> bool:
    """Whether the run has the :data:`NATIVE` kernelspec (this install built the stand-in)."""
    return Path(os.environ["JUPYTER_DATA_DIR"], "kernels", NATIVE).is_dir()


def write_spec(directory: Path, spec: dict[str, Any]) -> None:
    directory.mkdir()
    (directory / "kernel.json").write_text(json.dumps(spec, indent=1))


def one_start(name: str, idle: float) -> Standin:
    kernelserver.wait_up(TAG, VENV)
    kernel = kernels.start(name, **QUIET)
    try:
        assert served(kernel.pid, name), f"{name}: the kernel was not served"
        cpu = schedstat(kernel.pid)
        time.sleep(idle)
        idle_cpu = schedstat(kernel.pid)
    finally:
        kernels.stop(kernel)
        kernelserver.settle(TAG, 10.0)
    return Standin(kernel.seconds, cpu, idle_cpu)


def standins_pss(name: str, n: int) -> float:
    """Mean PSS (KiB) of the stand-ins of ``n`` idle kernels of ``name`` started at once."""
    kernelserver.wait_up(TAG, VENV)
    burst = kernels.start_many(name, n, **QUIET)
    try:
        time.sleep(2.0)  # idle: past their start-up's last allocations
        pids = [k.pid for k in burst.kernels]
        assert all(served(p, name) for p in pids), f"{name}: a kernel of the burst was not served"
        return sum(map(pss_kib, pids)) / n
    finally:
        kernels.stop_all(burst.kernels)
        kernelserver.settle(TAG, 60.0)


def interpreter_pss(argv: list[str], n: int) -> float:
    """Mean PSS (KiB) of ``n`` idle interpreters of ``argv`` (each blocked reading a pipe)."""
    code = "import os; os.write(1, b'up'); os.read(0, 1)"
    procs = [subprocess.Popen([*argv, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE) for _ in range(n)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.read(2) == b"up"
        return sum(pss_kib(p.pid) for p in procs) / n
    finally:
        for p in procs:
            p.communicate(b"x")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, 21, "single kernel starts per kind", "the real uv")
    p.add_argument("--pss", type=int, default=20, help="idle kernels at once (20)")
    p.add_argument("--pss-rounds", type=int, default=3, help="rounds of the PSS figure (3)")
    p.add_argument("--idle", type=float, default=3.0,
                   help="seconds a started kernel idles before its stand-in's CPU is read (3)")
    p.add_argument("--head", type=Path, help="another copy of the package: a third kernelspec")
    return p.parse_args(argv)


def measure(args: argparse.Namespace) -> list[Table]:
    kinds = (*([HEAD] if args.head else []), GATE, LEAN, *([NATIVE] if has_native() else []))
    starts = interleave({k: functools.partial(one_start, k, args.idle) for k in kinds},
                        args.rounds)
    sizes = interleave({k: functools.partial(standins_pss, k, args.pss) for k in kinds},
                       args.pss_rounds)
    tool = [sys.executable, "-I"]
    bounds: dict[str, Callable[[], float]] = {
        "-I -S": lambda: run_timed([*tool, "-S", "-c", "pass"]).cpu,
        "-I": lambda: run_timed([*tool, "-c", "pass"]).cpu}
    floor = interleave(bounds, args.rounds)
    floor_pss = interpreter_pss([*tool, "-S"], args.pss)
    return [standin_table(starts, sizes, args), floor_table(floor, floor_pss, args)]


def standin_table(starts: dict[str, list[Standin]], sizes: dict[str, list[float]],
                  args: argparse.Namespace) -> Table:
    def cell(key: str, fn: Callable[[Standin], float]) -> float:
        return median(fn(s) for s in starts[key])

    kinds = [k for k in (HEAD, GATE, LEAN, NATIVE) if k in starts]
    rows = []
    for label, fn in (("stand-in CPU at the kernel_info reply", lambda s: s.cpu),
                      (f"stand-in CPU after {args.idle:g} s idle", lambda s: s.idle_cpu),
                      ("start_kernel -> kernel_info reply", lambda s: s.start)):
        values = [cell(k, fn) for k in kinds]
        rows.append([label, *map(ms, values), *(ratio(values[-1], v) for v in values[:-1]),
                     "<= 5 ms" if "CPU" in label else ""])
    values = [median(sizes[k]) for k in kinds]
    rows.append([f"stand-in PSS, {args.pss} idle at once", *(f"{v / MIB:.2f} MiB" for v in values),
                 *(ratio(values[-1], v) for v in values[:-1]), "<= 1.5 MiB"])
    heads = {HEAD: f"head gate ({args.head})", GATE: "gate (`kernel-bootstrap run ...`)",
             LEAN: "lean (`python -I -S -c ...`)", NATIVE: "native (`kb-standin ...`)"}
    last = kinds[-1].removeprefix("kb-")
    return Table("A served kernel's stand-in: the console script's entry, the lean one, the "
                 "native one",
                 ["figure", *(heads[k] for k in kinds),
                  *(f"{last} / {k.removeprefix('kb-')}" for k in kinds[:-1]), "bar"], rows,
                 [f"Medians of {args.rounds} interleaved starts ({args.pss_rounds} rounds for "
                  "PSS); every kernel served by the same warm server.",
                  "CPU: /proc/PID/schedstat of the process jupyter_client launched."])


def floor_table(floor: dict[str, list[float]], floor_pss: float,
                args: argparse.Namespace) -> Table:
    rows = [[f"`python {k} -c pass`", ms(median(v)), ""] for k, v in floor.items()]
    rows.append([f"`python -I -S` idle, {args.pss} at once", "", f"{floor_pss / MIB:.2f} MiB"])
    return Table(f"The floor of a pure-Python stand-in ({sys.executable})",
                 ["interpreter", "CPU (median)", "PSS each"], rows,
                 [f"Medians of {args.rounds} interleaved runs; CPU from the children's rusage."])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    root = Path(tempfile.mkdtemp(prefix="kb-bench-standin-"))
    cwd = os.getcwd()
    try:
        ws = open_workspace(root, args.uv)
        os.environ["KERNEL_BOOTSTRAP_UV"] = str(ws.shim)
        os.chdir(root)
        world = kernel_world(root, args.head)
        os.environ.update(world.env)
        # The first spawns the server; each works.
        for name in (LEAN, LEAN, GATE, *([HEAD] if args.head else []),
                     *([NATIVE] if has_native() else [])):
            kernels.stop(kernels.start(name, **QUIET))
            kernelserver.wait_up(TAG, VENV)
        calls = log_size(ws.uv_log)
        tables = measure(args)
        assert log_size(ws.uv_log) == calls, "a timed start called uv: it was not warm"
        print("\n".join(t.render(args.markdown) for t in tables))
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

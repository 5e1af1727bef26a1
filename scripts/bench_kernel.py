"""Benchmark: what the gate costs a kernel start, and a warm ``run`` against a bare interpreter.

``kernelspec install`` now writes an argv through ``kernel-bootstrap run`` (the readiness check,
then an exec of the venv's interpreter); ``--direct`` writes the old one, the interpreter alone.
Both are installed for one warm world (the real uv, the README's ipykernel runtime, two skills)
and started by jupyter_client as Jupyter starts them, timed from ``start_kernel`` to the
``kernel_info`` reply (``wait_for_ready``), then shut down. Then, without Jupyter, a warm
``kernel-bootstrap run -- -c pass`` against the venv's ``python -c pass`` (and a warm
``ensure`` for scale). Rounds are interleaved with the order rotating; cells are medians; the
uv log shows no call while timing (every start was warm). Usage::

    .venv/bin/python scripts/bench_kernel.py [--rounds 21] [--fast-rounds 51] [--markdown]
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path lines, so the script runs from a checkout without installing.
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
    run_timed,
)
from bench_report import Table, ms, ratio

from testing.world import World

GATE, DIRECT = "kb-gate", "kb-direct"


def kernel_world(root: Path, uv: Path) -> World:
    """A warm world on the real uv (behind the workspace's logging shim) with both kernelspecs
    installed into a Jupyter data dir of its own."""
    world = World(root / "world")
    world.env.update(os.environ)  # the workspace's HOME, caches and uv shim
    world.env.pop("KERNEL_BOOTSTRAP_BATCH_BUILDS", None)
    world.env["JUPYTER_DATA_DIR"] = str(root / "jupyter")
    world.write_config(requirements=list(RUNTIME))
    world.skill("alpha")
    world.skill("beta")
    config = ["--config", str(world.config)]
    check([KERNEL_BOOTSTRAP, "kernelspec", "install", "--name", GATE, *config], world.env)
    check([KERNEL_BOOTSTRAP, "kernelspec", "install", "--name", DIRECT, "--direct", *config],
          world.env)
    check([KERNEL_BOOTSTRAP, "ensure", *config], world.env)  # writes the fingerprint
    return world


def kernel_start(name: str) -> Timing:
    """From jupyter_client's start_kernel to the kernel_info reply: wall seconds, and the CPU
    seconds of the kernel's process by then (through the exec, for the gate: a process keeps
    its CPU times across exec); then shut down."""
    from jupyter_client.manager import KernelManager
    from jupyter_client.provisioning.local_provisioner import LocalProvisioner

    began = time.perf_counter()
    manager = KernelManager(kernel_name=name)
    # ipykernel's banner warnings would bury the table; both kinds lose the same output.
    manager.start_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        wall = time.perf_counter() - began
        # The local provisioner (what a kernelspec without one gets) holds the Popen.
        provisioner = manager.provisioner
        assert isinstance(provisioner, LocalProvisioner), provisioner
        assert provisioner.process is not None
        return Timing(wall, _cpu_seconds(provisioner.process.pid))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (Linux: /proc/PID/stat, in clock ticks)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kernel_table(times: dict[str, list[Timing]], rounds: int) -> Table:
    direct = median(t.wall for t in times[DIRECT])
    direct_cpu = median(t.cpu for t in times[DIRECT])
    rows = []
    for label, name, argv in (("through `kernel-bootstrap run` (the default)", GATE,
                               "kernel-bootstrap run --config C -- -m ipykernel_launcher -f F"),
                              ("`--direct`", DIRECT, "VENV/bin/python -m ipykernel_launcher -f F")):
        wall = [t.wall for t in times[name]]
        cpu = median(t.cpu for t in times[name])
        q1, q3 = quartiles(wall)
        rows.append([label, f"`{argv}`", ms(median(wall)), f"{ms(q1)}-{ms(q3)}",
                     ratio(median(wall), direct), ms(cpu), ratio(cpu, direct_cpu)])
    return Table("Warm kernel start by jupyter_client, start_kernel to kernel_info reply",
                 ["kernelspec", "argv", "median ms", "IQR ms", "vs --direct", "kernel CPU ms",
                  "CPU vs --direct"], rows,
                 [f"Median of {rounds} interleaved rounds; target: the gate <= 1.03x --direct.",
                  f"Runtime {', '.join(RUNTIME)} (real uv), two Python skills; both "
                  "kernelspecs installed by `kernelspec install` for the same config."])


def fast_variants(world: World) -> dict[str, Callable[[], Timing]]:
    config = ["--config", str(world.config)]
    argvs: dict[str, list[str | Path]] = {
        "`python -c pass` (the venv's)": [world.python, "-c", "pass"],
        "`kernel-bootstrap run -- -c pass`": [KERNEL_BOOTSTRAP, "run", *config, "--", "-c",
                                              "pass"],
        "`kernel-bootstrap ensure`": [KERNEL_BOOTSTRAP, "ensure", *config],
    }
    for argv in argvs.values():
        check(argv, world.env)
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


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = bench_parser(__doc__, 21, "kernel starts per kind", "the real uv")
    p.add_argument("--fast-rounds", type=int, default=51,
                   help="rounds of the `run -- -c pass` table (default 51)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    root = Path(tempfile.mkdtemp(prefix="kb-bench-kernel-"))
    cwd = os.getcwd()
    try:
        ws = open_workspace(root, args.uv)
        os.environ["KERNEL_BOOTSTRAP_UV"] = str(ws.shim)
        os.chdir(root)
        world = kernel_world(root, args.uv)
        os.environ.update(world.env)  # jupyter_client starts kernels with our environment
        for name in (GATE, DIRECT):
            kernel_start(name)  # each works, and the first start's compile is not timed
        calls = log_size(ws.uv_log)
        kernels = interleave({name: functools.partial(kernel_start, name)
                              for name in (GATE, DIRECT)}, args.rounds)
        fast = interleave(fast_variants(world), args.fast_rounds)
        assert log_size(ws.uv_log) == calls, "a timed start called uv: it was not warm"
        print(kernel_table(kernels, args.rounds).render(args.markdown))
        print()
        print(fast_table(fast, args.fast_rounds).render(args.markdown))
    finally:
        os.chdir(cwd)
        rmtree(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

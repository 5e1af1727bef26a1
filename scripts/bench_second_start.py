"""Benchmark (issue 36 item 4): the first kernel start, with no server yet, against a bare start;
and whether the 2nd and 3rd starts right after it (each begun at the previous one's kernel_info
reply, all three left running) were served.

One warm world (the real uv, ipykernel) with two kernelspecs from ``kernelspec install``:
*served* (the server on) and *bare* (a second config file naming the same venv with
``kernel-server = false``). Interleaved rounds: a bare start; then, the server stopped (untimed),
three served starts back to back, timed from ``start_kernel`` to the ``kernel_info`` reply. A
start was served when what jupyter_client launched is a one-thread stand-in (an ordinary start
execs into the kernel, which runs its zmq and heartbeat threads). Usage::

    .venv/bin/python scripts/bench_second_start.py [--rounds 15] [--uv UV] [--compare DIR]

``--compare DIR``: the same back-to-back starts, interleaved, through a copy of the served
kernelspec that runs the package in DIR (a checkout's root, e.g. ``git archive HEAD``'s), with
``PYTHONPATH=DIR`` so that the server it spawns is that copy's too.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from bench_lib import (
    KERNEL_BOOTSTRAP,
    RUNTIME,
    bench_parser,
    check,
    interleave,
    median,
    open_workspace,
    rmtree,
)

from testing import kernels, kernelserver, reaper
from testing.world import World

SERVED, BARE, OTHER = "kb-served", "kb-bare", "kb-other"
QUIET: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
TAG = reaper.new_tag()
VENV = Path()


def kernel_world(root: Path) -> World:
    global VENV
    world = World(root / "world")
    VENV = world.venv
    world.env.update(os.environ)
    world.env.pop("KERNEL_BOOTSTRAP_BATCH_BUILDS", None)
    world.env.pop("KERNEL_BOOTSTRAP_KERNEL_SERVER", None)
    world.env["JUPYTER_DATA_DIR"] = str(root / "jupyter")
    world.env[reaper.TAG] = TAG
    world.write_config(requirements=list(RUNTIME))
    bare = world.config.with_name("bare.toml")
    bare.write_text(world.config.read_text() + "kernel-server = false\n", encoding="utf-8")
    for name, config in ((SERVED, world.config), (BARE, bare)):
        check([KERNEL_BOOTSTRAP, "kernelspec", "install", "--name", name,
               "--config", str(config)], world.env)
        check([KERNEL_BOOTSTRAP, "ensure", "--config", str(config)], world.env)
    return world


def other_kernelspec(root: Path, package: Path) -> None:
    """kb-served's kernelspec, running the package in ``package`` (see the module docstring)."""
    spec = json.loads((root / "jupyter" / "kernels" / SERVED / "kernel.json").read_text())
    spec["argv"] = [str(package) if a == str(Path(__file__).resolve().parent.parent) else a
                    for a in spec["argv"]]
    spec["env"] = {**spec.get("env", {}), "PYTHONPATH": str(package)}
    spec["display_name"] = OTHER
    (root / "jupyter" / "kernels" / OTHER).mkdir()
    (root / "jupyter" / "kernels" / OTHER / "kernel.json").write_text(json.dumps(spec))


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def bare() -> tuple[float, ...]:
    kernel = kernels.start(BARE, **QUIET)
    kernels.stop(kernel)
    kernelserver.settle(TAG)
    return (kernel.seconds,)


def back_to_back(name: str = SERVED) -> tuple[float, ...]:
    """The first start's seconds, then 1.0/0.0 for starts 2 and 3 served, then their seconds."""
    kernelserver.stop(TAG)
    kernelserver.settle(TAG)
    started = [kernels.start(name, **QUIET) for _ in range(3)]
    served = [1.0 if threads(k.pid) == 1 else 0.0 for k in started[1:]]
    for kernel in started:
        kernels.stop(kernel)
    kernelserver.wait_up(TAG, VENV)  # the server the first start spawned: for the next round
    kernelserver.settle(TAG)
    return (started[0].seconds, *served, *(k.seconds for k in started[1:]))


def report(runs: dict[str, list[tuple[float, ...]]], rounds: int) -> None:
    b = median(r[0] for r in runs["bare"])
    print(f"load {os.getloadavg()[0]:.2f}; {rounds} rounds, medians; bare {b * 1000:.1f} ms")
    for kind in [k for k in runs if k != "bare"]:
        f = median(r[0] for r in runs[kind])
        ratios = sorted(r[0] / s[0] for r, s in zip(runs[kind], runs["bare"], strict=True))
        print(f"{kind}: first {f * 1000:.1f} ms, first / bare {f / b:.3f}x (median of per-round "
              f"ratios {median(ratios):.3f}x)")
        for i, label in ((1, "2nd"), (2, "3rd")):
            n = sum(r[i] for r in runs[kind])
            t = median(r[i + 2] for r in runs[kind])
            print(f"  {label} served in {n:.0f} of {rounds}; median {t * 1000:.1f} ms")


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(__doc__, 15, "rounds", "the real uv")
    parser.add_argument("--compare", type=Path, help="another checkout's root (see above)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kb-bench-second-"))
    cwd = os.getcwd()
    try:
        ws = open_workspace(root, args.uv)
        os.environ["KERNEL_BOOTSTRAP_UV"] = str(ws.shim)
        os.chdir(root)
        world = kernel_world(root)
        os.environ.update(world.env)
        variants = {"bare": bare, "first": back_to_back}
        if args.compare is not None:
            other_kernelspec(root, args.compare.resolve())
            variants["other"] = functools.partial(back_to_back, OTHER)
        for name in (SERVED, BARE, *([OTHER] if args.compare else [])):
            kernels.stop(kernels.start(name, **QUIET))  # compiles, spawns the server: untimed
            kernelserver.wait_up(TAG, VENV)
        runs = interleave(variants, args.rounds)
        report(runs, args.rounds)
    except BaseException:
        from bootstrap.kernels import places

        log = Path(places.server_dir(str(VENV)) or root, places.LOG)
        print(log.read_text(errors="replace")[-3000:] if log.exists() else "", file=sys.stderr)
        raise
    finally:
        os.chdir(cwd)
        kernelserver.stop(TAG)
        time.sleep(0.5)
        kernels.assert_no_orphans(TAG)
        rmtree(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

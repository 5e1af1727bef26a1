"""Benchmark: what `compile-bytecode` costs a cold build, and what it saves every kernel start.

(a) A cold ``kernel-bootstrap ensure`` of the README's runtime (``ipykernel>=6``) into a new
venv, from a warm uv cache (offline after one online install), with ``compile-bytecode`` on
(the default: uv ``--compile-bytecode``) and off. (b) An ordinary kernel-like start,
``python -c "import ipykernel.kernelapp, IPython"``, in venvs built by those two configs:
compiled and uncompiled with ``PYTHONDONTWRITEBYTECODE=1`` (as many images set, and these
machines' shells), against an uncompiled venv whose bytecode is writable, timed from its second
run on (its first run wrote the bytecode). Issue 36's bar: compiled + DONTWRITE / writable
second run <= 1.05x. Rounds are interleaved with the order rotating
(:func:`bench_lib.interleave`); cells are medians. Usage::

    .venv/bin/python scripts/bench_bytecode.py [--rounds 3] [--start-rounds 15] [--markdown]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path lines, so the script runs from a checkout without installing.
from bench_lib import (
    KERNEL_BOOTSTRAP,
    RUNTIME,
    Timing,
    Workspace,
    bench_parser,
    check,
    interleave,
    median,
    open_workspace,
    quartiles,
    remove_venv,
    rmtree,
    run_timed,
)
from bench_report import Table, machine, ms, ratio, secs

from bootstrap.env.venv import Venv

START = "import ipykernel.kernelapp, IPython"


def child_env(**extra: str) -> dict[str, str]:
    """The workspace's environment without its bytecode prefix: with PYTHONPYCACHEPREFIX set,
    uv's compile writes (and a start reads) bytecode there, not in the venv's __pycache__."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    return {**env, **extra}


def build(ws: Workspace, tag: str, compiled: bool) -> tuple[Path, Timing]:
    """A cold ``ensure`` of the runtime into a new venv; the venv and its time."""
    run = ws.fresh(tag)
    config = run / "kernel-bootstrap.toml"
    runtime = ", ".join(f'"{r}"' for r in RUNTIME)
    config.write_text(f'venv = "venv"\nrequirements = [{runtime}]\n'
                      f"compile-bytecode = {'true' if compiled else 'false'}\n")
    timing = run_timed([KERNEL_BOOTSTRAP, "ensure", "--config", config], child_env())
    return run / "venv", timing


def cold(ws: Workspace, compiled: bool) -> Timing:
    venv, timing = build(ws, "cold", compiled)
    remove_venv(venv)
    return timing


def pyc_count(venv: Path) -> int:
    return sum(1 for site in Venv.at(venv).site_packages() if site.is_dir()
               for _ in site.rglob("*.pyc"))


def start_variants(ws: Workspace) -> tuple[dict[str, Callable[[], Timing]], dict[str, int]]:
    """The three kernel-like starts, each in a venv of its own; and each venv's .pyc count."""
    compiled, _ = build(ws, "start", True)
    bare, _ = build(ws, "start", False)
    writable, _ = build(ws, "start", False)
    # Its first run writes the bytecode: every timed run is a later one.
    run_timed([Venv.at(writable).python, "-c", START], child_env())
    found: dict[str, tuple[Path, str]] = {
        "compiled, PYTHONDONTWRITEBYTECODE=1": (compiled, "1"),
        "uncompiled, PYTHONDONTWRITEBYTECODE=1": (bare, "1"),
        "uncompiled, bytecode writable (2nd+ run)": (writable, ""),
    }
    variants: dict[str, Callable[[], Timing]] = {}
    for name, (venv, dont) in found.items():
        env = child_env(PYTHONDONTWRITEBYTECODE=dont) if dont else child_env()
        variants[name] = functools.partial(run_timed, [Venv.at(venv).python, "-c", START], env)
    return variants, {name: pyc_count(venv) for name, (venv, _) in found.items()}


def cold_table(times: dict[str, list[Timing]], rounds: int) -> Table:
    base = median(t.wall for t in times["off"])
    base_cpu = median(t.cpu for t in times["off"])
    rows = []
    for key, label in (("off", "compile-bytecode = false"), ("on", "compile-bytecode = true")):
        wall = [t.wall for t in times[key]]
        cpu = median(t.cpu for t in times[key])
        q1, q3 = quartiles(wall)
        rows.append([label, secs(median(wall)), f"{secs(q1)}-{secs(q3)}",
                     ratio(median(wall), base), secs(cpu), ratio(cpu, base_cpu)])
    return Table(f"(a) cold `ensure` of {', '.join(RUNTIME)} from a warm uv cache",
                 ["config", "median s", "IQR s", "vs off", "CPU s", "CPU vs off"], rows,
                 [f"Median of {rounds} interleaved rounds; a new venv each; offline "
                  "(UV_OFFLINE=1) after one online install."])


def start_table(times: dict[str, list[Timing]], rounds: int, pycs: dict[str, int]) -> Table:
    names = list(times)
    bar = median(t.wall for t in times[names[2]])
    bar_cpu = median(t.cpu for t in times[names[2]])
    rows = []
    for name in names:
        wall = [t.wall for t in times[name]]
        cpu = median(t.cpu for t in times[name])
        q1, q3 = quartiles(wall)
        rows.append([name, str(pycs[name]), ms(median(wall)), f"{ms(q1)}-{ms(q3)}",
                     ratio(median(wall), bar), ms(cpu), ratio(cpu, bar_cpu)])
    return Table(f"(b) `python -c \"{START}\"` in the venv",
                 ["venv", ".pyc files", "median ms", "IQR ms", "vs writable", "CPU ms",
                  "CPU vs writable"], rows,
                 [f"Median of {rounds} interleaved rounds; wall time of the whole process. "
                  "Bar (issue 36): compiled + DONTWRITE / writable 2nd run <= 1.05x."])


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = bench_parser(__doc__, 3, "interleaved rounds of cold builds",
                          "the real uv ensure runs")
    parser.add_argument("--start-rounds", type=int, default=15,
                        help="interleaved rounds of kernel-like starts (default 15)")
    return parser.parse_args(argv)


def warm_cache(ws: Workspace) -> None:
    """One online install of the runtime; every later uv call is offline, from this cache."""
    venv = ws.fresh("warmup") / "venv"
    check([ws.uv, "venv", "--quiet", venv])
    check([ws.uv, "pip", "install", "--quiet", "--python", Venv.at(venv).python, *RUNTIME])
    os.environ["UV_OFFLINE"] = "1"
    rmtree(venv.parent)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    root = Path(tempfile.mkdtemp(prefix="kb-bench-bytecode-"))
    try:
        ws = open_workspace(root, args.uv)
        print("\n".join(machine(args.uv)))
        warm_cache(ws)
        builds = interleave({"off": functools.partial(cold, ws, False),
                             "on": functools.partial(cold, ws, True)}, args.rounds)
        print(cold_table(builds, args.rounds).render(args.markdown))
        variants, pycs = start_variants(ws)
        starts = interleave(variants, args.start_rounds)
        print(start_table(starts, args.start_rounds, pycs).render(args.markdown))
        print(f"1-minute load average at the end: {os.getloadavg()[0]:.2f}")
    finally:
        rmtree(root) if not os.environ.get("KB_KEEP") else print(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

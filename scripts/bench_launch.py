"""Benchmark: a warm ``kernel-bootstrap ensure`` started the ways users install it.

A kernel runs ``kernel-bootstrap ensure`` at every start, so what the console script does before
our code runs counts. The same wheel is installed four ways, each into a venv of the same base
interpreter: pip's console script (``python -m venv`` + ``pip install``; pipx writes the same
one), uv's (``uv venv`` + ``uv pip install``), ``uv tool install`` (uv's, behind a symlink), and
no console script at all (``python -m bootstrap``); plus ``uvx``, which starts uv first. Each
runs ``ensure`` on one small world (6 Python skills and a plain one, installed by the fake uv
and made warm first), against ``python -c pass`` of the same venv. Rounds are interleaved with
the order rotating (:func:`bench_lib.interleave`); the cells are medians. Usage::

    .venv/bin/python scripts/bench_launch.py [--rounds 51] [--markdown] [--uv PATH]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path lines, so the script runs from a checkout without installing.
from bench_lib import (
    BASE_PYTHON,
    REPO,
    Timing,
    bench_parser,
    check,
    interleave,
    median,
    open_workspace,
    quartiles,
    rmtree,
    run_timed,
)
from bench_report import Table, ms, ratio

from testing.world import World


@dataclass(frozen=True)
class Installs:
    """Where each install kind put its ``kernel-bootstrap`` (and the venvs' interpreters)."""

    pip_venv: Path  # python -m venv + pip install WHEEL
    uv_venv: Path  # uv venv + uv pip install WHEEL
    tool_bin: Path  # uv tool install WHEEL: the symlink uv puts on PATH
    uv_env: dict[str, str]  # uv's tool directories, for `uv tool install` and `uvx`


def build_wheel(root: Path, uv: Path) -> Path:
    dist = root / "dist"
    check([uv, "build", "--wheel", "--out-dir", dist, REPO])
    wheels = sorted(dist.glob("kernel_bootstrap-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def install_all(root: Path, uv: Path, wheel: Path) -> Installs:
    """The same wheel, installed by pip, by ``uv pip`` and by ``uv tool`` (from the index for
    the dependencies: a private cache under ``root``)."""
    pip_venv, uv_venv = root / "pip-venv", root / "uv-venv"
    check([BASE_PYTHON, "-m", "venv", pip_venv])
    check([pip_venv / "bin" / "python", "-m", "pip", "install", "-q",
           "--disable-pip-version-check", wheel])
    check([uv, "venv", "-q", "--python", BASE_PYTHON, uv_venv])
    check([uv, "pip", "install", "-q", "--python", uv_venv / "bin" / "python", wheel])
    uv_env = {**os.environ, "UV_TOOL_DIR": str(root / "uv-tools"),
              "UV_TOOL_BIN_DIR": str(root / "uv-tools-bin")}
    check([uv, "tool", "install", "-q", "--python", BASE_PYTHON, wheel], uv_env)
    return Installs(pip_venv, uv_venv, root / "uv-tools-bin" / "kernel-bootstrap", uv_env)


def ready_world(root: Path, installs: Installs) -> World:
    """6 Python skills and a plain one, installed by the fake uv and made warm."""
    world = World(root / "world")
    for i in range(6):
        world.skill(f"skill-{i}")
    world.skill("notes", python=False)
    for _ in range(2):  # the second run finds everything ready and writes the fingerprint
        check([installs.uv_venv / "bin" / "kernel-bootstrap", "ensure", "--config",
               world.config], world.env)
    return world


def launcher_head(script: Path) -> str:
    """The console script's first lines up to our import: what runs before our code does."""
    lines = script.resolve().read_text().splitlines()
    end = next((i for i, line in enumerate(lines) if "bootstrap" in line), len(lines) - 1)
    return " / ".join(line.strip() for line in lines[: end + 1] if line.strip())


def variants(installs: Installs, world: World, uv: Path) -> dict[str, Callable[[], Timing]]:
    ensure = ["ensure", "--config", str(world.config)]
    pip_py, uv_py = installs.pip_venv / "bin" / "python", installs.uv_venv / "bin" / "python"
    uvx_env = {**world.env, **installs.uv_env, "UV_OFFLINE": "1"}
    argvs: dict[str, tuple[list[str | Path], dict[str, str]]] = {
        "`python -c pass` (uv venv)": ([uv_py, "-c", "pass"], world.env),
        "`python -c pass` (pip venv)": ([pip_py, "-c", "pass"], world.env),
        "`python -c 'import re'` (uv venv)": ([uv_py, "-c", "import re"], world.env),
        "pip's console script (`pip install`, pipx)":
            ([installs.pip_venv / "bin" / "kernel-bootstrap", *ensure], world.env),
        "uv's console script (`uv pip install`)":
            ([installs.uv_venv / "bin" / "kernel-bootstrap", *ensure], world.env),
        "`uv tool install` (uv's console script)": ([installs.tool_bin, *ensure], world.env),
        "`python -m bootstrap` (uv venv)": ([uv_py, "-m", "bootstrap", *ensure], world.env),
        "`uvx kernel-bootstrap` (the tool above, via uv)":
            ([uv, "tool", "run", "kernel-bootstrap", *ensure], uvx_env),
    }
    for argv, env in argvs.values():
        check(argv, env)  # each works, and is warm, before anything is timed
    return {name: functools.partial(run_timed, argv, env) for name, (argv, env) in argvs.items()}


def table(times: dict[str, list[Timing]], rounds: int) -> Table:
    base = median(t.wall for t in times["`python -c pass` (uv venv)"])
    base_cpu = median(t.cpu for t in times["`python -c pass` (uv venv)"])
    rows = []
    for name, runs in times.items():
        wall = [t.wall for t in runs]
        cpu = median(t.cpu for t in runs)
        q1, q3 = quartiles(wall)
        rows.append([name, ms(median(wall)), f"{ms(q1)}-{ms(q3)}", ratio(median(wall), base),
                     ms(cpu), ratio(cpu, base_cpu)])
    return Table("Warm `kernel-bootstrap ensure` by install kind (6 Python skills + 1 plain)",
                 ["command", "median ms", "IQR ms", "vs python -c pass", "CPU ms",
                  "CPU vs python -c pass"], rows,
                 [f"Median of {rounds} interleaved rounds; wall time of the whole process as a "
                  "kernel launcher would run it; CPU is user + system of the process tree.",
                  "Every install is the same wheel in a venv of the same base interpreter."])


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    return bench_parser(__doc__, 51, "interleaved rounds", "the uv that installs").parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    root = Path(tempfile.mkdtemp(prefix="kb-bench-launch-"))
    cwd = os.getcwd()
    try:
        open_workspace(root, args.uv)
        os.chdir(root)  # never the checkout: `python -m bootstrap` would import it from there
        installs = install_all(root, args.uv, build_wheel(root, args.uv))
        world = ready_world(root, installs)
        to_time = variants(installs, world, args.uv)
        calls_before = world.uv_calls()
        times = interleave(to_time, args.rounds)
        assert world.uv_calls() == calls_before, "a timed ensure called uv: it was not warm"
        print(table(times, args.rounds).render(args.markdown))
        for kind, script in (("pip", installs.pip_venv), ("uv", installs.uv_venv)):
            print(f"{kind}'s console script: {launcher_head(script / 'bin' / 'kernel-bootstrap')}")
    finally:
        os.chdir(cwd)
        rmtree(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 21's figures for an unfriendly host, against the real uv: medians and ratios.

    .venv/bin/python scripts/bench_hostile.py [--rounds N]
        [--only offline-cold,locked-new,backoff-warm] [--markdown] [--code DIR]

- ``offline-cold``  a cold ``ensure`` (ipykernel + 4 hatchling skills, everything in uv's cache
                    and the build cache) inside ``unshare -n`` (no network: no route, no DNS)
                    vs the same online; goal <= 1.2x, bar <= 1.5x. Before the fallback, the
                    unshared one failed after 16-19 s of uv's retries.
- ``locked-new``    a new venv for a **locked** runtime (``kernel-bootstrap lock``'s
                    ``pylock.toml`` for ipykernel, resolved online from PyPI) and 6 hatchling
                    skills, everything cached (uv's cache, the build cache): ``ensure`` online
                    vs uv alone doing the same (``uv venv``, ``uv pip install -r pylock.toml
                    --require-hashes``, then ``uv pip install -r`` a file of ``-e`` lines, so uv
                    reuses the editables it built before) online, goal <= 0.4x, bar <= 0.7x;
                    and vs uv alone with ``--offline`` (the floor), goal <= 1.3x. Then a table
                    of where the time goes, phase by phase (``bench_phases.py``).
                    ``--code DIR`` runs ours from another copy of the package; ``--before
                    DIR`` adds ours from that copy as one more variant of the same rounds
                    (before/after in one interleaved run, phases too).
- ``backoff-warm``  a warm ``ensure`` whose one skill keeps failing (its dependency exists on
                    no index), inside the failure's backoff window, vs ``python -c pass`` and vs
                    a warm ``ensure`` with no failure; goal <= 1.1x ``python -c pass``.

Variants alternate round by round (rotating the order) on the same world; each cold round
removes the venv first. Everything lives in a temporary directory (HOME, XDG dirs, uv's cache).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path lines, so the script runs from a checkout.
import bench_phases
from bench_lib import (
    BASE_PYTHON,
    BIN,
    Timing,
    Workspace,
    World,
    check,
    interleave,
    make_world,
    median,
    open_workspace,
    ours_argv,
    quartiles,
    remove_venv,
    rmtree,
    run_timed,
    settle,
    skills_only_file,
    timed,
    warm_uv_cache,
)
from bench_report import Results, Table, Verdict, machine, ms, ratio, secs

from testing.skills import Package, make_skill

FIGURES = ("offline-cold", "locked-new", "backoff-warm")
LOCKED_SKILLS = 6
# uv alone in locked-new: $0 uv, $1 the base interpreter, $2 the venv, $3 pylock.toml, $4 the
# skills as `-e` lines (given so, uv reuses the editables it built for the same paths).
UV_ALONE = ('set -e; uv=$0 venv=$2; "$uv" venv --quiet --python "$1" "$venv"; '
            '"$uv" pip install --quiet $OFFLINE --python "$venv/bin/python" -r "$3" '
            '--require-hashes')
UV_SKILLS = '; "$uv" pip install --quiet $OFFLINE --python "$venv/bin/python" -r "$4"'


def _online_env() -> dict[str, str]:
    """The environment a user's online ensure has: uv may ask the index (the workspace sets
    UV_OFFLINE after warming the cache, to keep revalidations out of the other figures)."""
    return {k: v for k, v in os.environ.items() if k != "UV_OFFLINE"}


def fig_offline_cold(ws: Workspace, rounds: int, out: Results) -> None:
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-n", "true"], check=False).returncode:
        out.tables["offline-cold"] = [Table("offline-cold: skipped", ["why"],
                                            [["`unshare -n` is not available here"]])]
        return
    world = make_world(ws, "offline-cold", 4)
    env = _online_env()
    check(ours_argv(world), env)  # fills the build cache with the 4 skills' wheels

    def cold(prefix: list[str]) -> float:
        remove_venv(world.venv)
        return timed([*prefix, *ours_argv(world)], env)

    variants: dict[str, Callable[[], float]] = {
        "cold `ensure`, online": functools.partial(cold, []),
        "cold `ensure` in `unshare -n` (no network)": functools.partial(
            cold, [unshare, "-n", "--"]),
    }
    times = interleave(variants, rounds)
    online, offline = (median(times[n]) for n in variants)
    rows = [[name, secs(median(t)), "-".join(map(secs, quartiles(t))),
             ratio(median(t), online)] for name, t in times.items()]
    out.tables["offline-cold"] = [Table(
        "Cold `ensure`, everything cached (ipykernel + 4 hatchling skills): no network vs online",
        ["command", "median s", "IQR s", "vs online"], rows,
        [f"Median of {rounds} interleaved rounds; each removes the venv first. Online, uv "
         "revalidates its cached index pages; without a network the fallback runs it "
         "--offline after one refused connect."])]
    out.verdicts.append(Verdict("cold ensure, cached, unshare -n vs online", "<= 1.2x (bar 1.5x)",
                                f"{offline / online:.2f}x ({secs(offline)} vs {secs(online)} s)",
                                offline / online <= 1.5))


OURS = "`kernel-bootstrap ensure`, new venv, locked runtime, online"
BEFORE = "the same, before (`--before`)"


def _code_env(env: dict[str, str], code: Path | None) -> dict[str, str]:
    return {**env, "PYTHONPATH": str(code)} if code else env


def fig_locked_new(ws: Workspace, rounds: int, out: Results, code: Path | None,
                   before: Path | None = None) -> None:
    world = make_world(ws, "locked-new", LOCKED_SKILLS)
    # Both sides run the real uv (no logging shim): the shim's bash start on each of ours
    # three calls would count against ours alone.
    env = {**_online_env(), "KERNEL_BOOTSTRAP_UV": str(ws.uv)}
    ours_env = _code_env(env, code)
    with world.config.open("a", encoding="utf-8") as f:
        f.write('lock = "pylock.toml"\n')
    check([BIN / "kernel-bootstrap", "lock", "--config", world.config], ours_env)
    check(ours_argv(world), ours_env)  # fills the build cache with the skills' wheels
    if before is not None:  # one cold run each compiles that copy's bytecode
        remove_venv(world.venv)
        check(ours_argv(world), _code_env(env, before))
    uv_venv = world.dir / "venv-uv"
    skills_file = skills_only_file(world)

    def uv_alone(offline: bool, skills: bool = True, uv: Path = ws.uv) -> list[str]:
        return ["env", f"OFFLINE={'--offline' if offline else ''}", "bash", "-c",
                UV_ALONE + (UV_SKILLS if skills else ""), str(uv), BASE_PYTHON, str(uv_venv),
                str(world.dir / "pylock.toml"), str(skills_file)]

    check(uv_alone(False), env)  # uv's cache now holds the skills' editable builds too

    def ours(code_env: dict[str, str] = ours_env) -> Timing:
        remove_venv(world.venv)
        os.sync()
        return run_timed(ours_argv(world), code_env)

    def uv(offline: bool, skills: bool = True) -> Timing:
        rmtree(uv_venv)
        os.sync()
        return run_timed(uv_alone(offline, skills), env)

    variants: dict[str, Callable[[], Timing]] = {
        OURS: ours,
        **({BEFORE: functools.partial(ours, _code_env(env, before))} if before else {}),
        "uv alone, online": functools.partial(uv, False),
        "uv alone, `--offline` (the floor)": functools.partial(uv, True),
        "uv alone, `--offline`, the locked runtime only (no skills)": functools.partial(
            uv, True, False),
    }
    timings = interleave(variants, rounds)
    times = {name: [t.wall for t in got] for name, got in timings.items()}
    ours_s, online, offline = (median(times[n]) for n in (
        OURS, "uv alone, online", "uv alone, `--offline` (the floor)"))
    offline_cpu = median(t.cpu for t in timings["uv alone, `--offline` (the floor)"])
    rows = [[name, secs(median(t)), "-".join(map(secs, quartiles(t))),
             ratio(median(t), online), ratio(median(t), offline),
             secs(cpu := median(x.cpu for x in timings[name])), ratio(cpu, offline_cpu)]
            for name, t in times.items()]
    out.tables["locked-new"] = [Table(
        f"A new venv for a locked runtime (ipykernel) and {LOCKED_SKILLS} cached hatchling "
        "skills", ["command", "median s", "IQR s", "vs uv online", "vs uv --offline",
                   "median CPU s", "CPU vs uv --offline"], rows,
        [f"Median of {rounds} interleaved rounds; the venv is removed (and the removal "
         "flushed) before each run. uv alone: `uv venv`, `uv pip install -r pylock.toml "
         f"--require-hashes`, then `uv pip install -r` a file of the {LOCKED_SKILLS} skills as "
         "`-e` lines: for the same paths uv reuses the editables it built before (on the "
         "command line, `-e DIR` always rebuilds). The last row leaves the skills out: what "
         "the runtime alone costs uv offline. CPU: user + system seconds of the whole "
         "process tree, which neighbours' load moves far less than wall time."])]
    phases_table(ws, world, rounds, out, (ours_env, env),
                 lambda shim: uv_alone(True, uv=shim), uv_venv,
                 _code_env(env, before) if before else None)
    out.verdicts.append(Verdict("new venv, locked runtime + cached skills, vs uv alone online",
                                "<= 0.4x (bar 0.7x)",
                                f"{ours_s / online:.2f}x ({secs(ours_s)} vs {secs(online)} s)",
                                ours_s / online <= 0.7))
    out.verdicts.append(Verdict("the same vs uv alone --offline (the floor)", "<= 1.3x",
                                f"{ours_s / offline:.2f}x ({secs(ours_s)} vs {secs(offline)} s)",
                                ours_s / offline <= 1.3))


def phases_table(ws: Workspace, world: World, rounds: int, out: Results,
                 envs: tuple[dict[str, str], dict[str, str]],
                 uv_alone: Callable[[Path], list[str]], uv_venv: Path,
                 before_env: dict[str, str] | None = None) -> None:
    """Where the time goes: extra interleaved rounds of ours (``-v --log-format json``) and of
    uv alone ``--offline``, each uv call through a shim that stamps its start and end;
    ``before_env``: ours from another copy too."""
    shim, log = bench_phases.timing_shim(ws.root / "bin", ws.uv)
    ours_env, env = envs
    ours_env = {**ours_env, "KERNEL_BOOTSTRAP_UV": str(shim)}
    argv = [*ours_argv(world), "-v", "--log-format", "json"]

    def ours(code_env: dict[str, str] = ours_env) -> dict[str, float]:
        remove_venv(world.venv)
        os.sync()
        return bench_phases.ours_phases(*bench_phases.run_logged(argv, code_env, log))

    def uv() -> dict[str, float]:
        rmtree(uv_venv)
        os.sync()
        start, end, spans, _ = bench_phases.run_logged(uv_alone(shim), env, log)
        return bench_phases.uv_alone_phases(start, end, spans)

    variants: dict[str, Callable[[], dict[str, float]]] = {"ours": ours, "uv": uv}
    columns = ["phase", "ours, median ms", "uv alone --offline, median ms"]
    if before_env is not None:
        variants["before"] = functools.partial(ours, {**before_env,
                                                      "KERNEL_BOOTSTRAP_UV": str(shim)})
        columns.insert(1, "ours before, median ms")
    found = interleave(variants, rounds)
    names = list(found["ours"][0])
    order = ["before", "ours", "uv"] if before_env is not None else ["ours", "uv"]
    rows = [[name, *(ms(median(r[name] for r in found[v])) for v in order)]
            for name in names]
    out.tables["locked-new"].append(Table(
        "Where the time goes: the locked rebuild, phase by phase", columns, rows,
        [f"Median of {rounds} more interleaved rounds, not the timed ones: every uv call goes "
         "through a bash shim stamping its start and end, and ours runs with `-v --log-format "
         "json` (its `runtime ready` event ends the flip). Each phase's median is taken on "
         "its own, so the phases need not add up to the total. For uv alone, the rows "
         "between uv calls are bash."]))


def fig_backoff_warm(ws: Workspace, rounds: int, out: Results) -> None:
    broken = make_world(ws, "backoff-warm", 1)
    make_skill(broken.dir / "skills", "broken",
               package=Package(deps=("kb-bench-exists-on-no-index",)))
    healthy = make_world(ws, "backoff-healthy", 1)
    check(ours_argv(healthy))
    # Three failures in a row: the third waits 2 minutes, more than the rounds take.
    for _ in range(3):
        subprocess.run([*ours_argv(broken), "--retry"], capture_output=True, check=True)
    settle()
    for world in (broken, healthy):
        check(ours_argv(world))  # a full check with settled hashes saves the fingerprint
    variants: dict[str, Callable[[], float]] = {
        "`python -c pass`": functools.partial(timed, [sys.executable, "-c", "pass"]),
        "`kernel-bootstrap ensure`, warm, no failure": functools.partial(
            timed, ours_argv(healthy)),
        "`kernel-bootstrap ensure`, warm, one skill failing (backing off)": functools.partial(
            timed, ours_argv(broken)),
    }
    times = interleave(variants, rounds)
    names = list(variants)
    py, ours = median(times[names[0]]), median(times[names[2]])
    rows = [[name, ms(median(t)), "-".join(map(ms, quartiles(t))), ratio(median(t), py)]
            for name, t in times.items()]
    _require_no_uv(ws, broken)
    out.tables["backoff-warm"] = [Table(
        "Warm `ensure` with a failed skill backing off",
        ["command", "median ms", "IQR ms", "vs python -c pass"], rows,
        [f"Median of {rounds} interleaved rounds; wall time of the whole process. Before "
         "backoff, every start with a failed skill ran uv again (0.22 s instead of 0.014 s)."])]
    out.verdicts.append(Verdict("warm ensure, one backed-off skill, vs python -c pass",
                                "<= 1.1x", f"{ours / py:.2f}x ({ms(ours)} vs {ms(py)} ms)",
                                ours / py <= 1.1))


def _require_no_uv(ws: Workspace, world: World) -> None:
    """The figure means something only if the timed starts never ran uv."""
    before = ws.uv_log.stat().st_size if ws.uv_log.exists() else 0
    check(ours_argv(world))
    after = ws.uv_log.stat().st_size if ws.uv_log.exists() else 0
    if after != before:
        raise RuntimeError("a start inside the backoff window ran uv")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per figure (default: 9 cold, 31 warm)")
    parser.add_argument("--only", default=",".join(FIGURES))
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--code", type=Path, default=None,
                        help="locked-new: run ours from the bootstrap package in this directory "
                             "(PYTHONPATH), e.g. a copy of the code before a change")
    parser.add_argument("--before", type=Path, default=None,
                        help="locked-new: also run ours from the bootstrap package in this "
                             "directory, as one more variant of the same interleaved rounds")
    args = parser.parse_args()
    only = args.only.split(",")
    root = Path(tempfile.mkdtemp(prefix="kb-bench-hostile-"))
    try:
        ws = open_workspace(root, BIN / "uv")
        os.environ["KERNEL_BOOTSTRAP_UV"] = str(ws.shim)
        warm_uv_cache(ws)
        out = Results()
        if "offline-cold" in only:
            fig_offline_cold(ws, args.rounds or 9, out)
        if "locked-new" in only:
            fig_locked_new(ws, args.rounds or 9, out, args.code, args.before)
        if "backoff-warm" in only:
            fig_backoff_warm(ws, args.rounds or 31, out)
        print("\n".join(machine(ws.uv)))
        for tables in out.tables.values():
            for table in tables:
                print(table.render(args.markdown))
        print(out.summary().render(args.markdown))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

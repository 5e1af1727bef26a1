"""Target 5 of the benchmarks: how the warm and cold paths (and push) grow with their input."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

from bench_lib import (
    Settings,
    Timing,
    Workspace,
    check,
    cold_pair,
    interleave,
    make_world,
    median,
    ours_argv,
    per_call,
    rmtree,
    settle,
    timed,
)
from bench_report import Results, Table, Verdict, ms, ratio, secs


def _stamp_all(paths: list[str]) -> None:
    from bootstrap.warm import stamp

    for path in paths:
        stamp(path)


def fig_growth_warm(ws: Workspace, s: Settings, out: Results) -> None:
    from bootstrap import warm
    from bootstrap.config import load_config
    from bootstrap.engine.ensure import ensure

    sizes = (1, 10, 50, 100)
    worlds = {n: make_world(ws, f"growth-warm{n}", n) for n in sizes}
    for world in worlds.values():
        check(ours_argv(world))
        check(ours_argv(world))
    settle()
    # Two sets, each interleaved: processes of ~15 ms, whose medians need many rounds on a
    # shared machine (their IQR is a few ms), and in-process timings of ~50 ms each round.
    processes: dict[str, Callable[[], float]] = {
        "python": functools.partial(timed, [sys.executable, "-c", "pass"])}
    calls: dict[str, Callable[[], float]] = {}
    stat_paths: dict[int, list[str]] = {}
    for n, world in worlds.items():
        config = load_config(world.config)
        fingerprint = warm.fingerprint_path(str(world.config))
        assert fingerprint is not None
        stat_paths[n] = [ln.split("\t")[1] for ln in Path(fingerprint).read_text().splitlines()
                         if ln.startswith("stat\t")]
        processes[f"cli{n}"] = functools.partial(timed, ours_argv(world))
        calls[f"lib{n}"] = per_call(functools.partial(ensure, config))
        calls[f"check{n}"] = per_call(functools.partial(warm.check, str(world.config)))
        calls[f"stat{n}"] = per_call(functools.partial(_stamp_all, stat_paths[n]))
    cli_rounds = s.fast_rounds * 4
    t = {k: median(v) for k, v in interleave(processes, cli_rounds).items()}
    t.update({k: median(v) for k, v in interleave(calls, s.fast_rounds).items()})
    rows = [[str(n), ms(t[f"cli{n}"]), ratio(t[f"cli{n}"], t["python"]),
             f"{(t[f'cli{n}'] - t['cli1']) * 1e3:+.2f}", str(len(stat_paths[n])),
             f"{(t[f'stat{n}'] - t['stat1']) * 1e3:+.2f}",
             f"{(t[f'check{n}'] - t['check1']) * 1e3:+.2f}",
             f"{t[f'lib{n}'] * 1e6:.0f}", f"{(t[f'lib{n}'] - t['lib1']) * 1e6:+.0f}"]
            for n in sizes]
    out.tables["growth-warm"] = [Table(
        "Target 5: warm path vs number of skills",
        ["Python skills", "CLI median ms", "vs python -c pass", "CLI Δ vs 1 skill, ms",
         "paths stat'ed", "their stats Δ, ms", "fingerprint check Δ, ms", "in-process µs",
         "in-process Δ, µs"], rows,
        [f"Medians of {cli_rounds} interleaved rounds of the processes (CLI, python) and of "
         f"{s.fast_rounds} of the in-process calls; python -c pass = "
         f"{ms(t['python'])} ms. Every config also has 1 plain skill. The fingerprint check "
         "is the stats plus reading and comparing the fingerprint file; the in-process call "
         "also reads the marker and checks each skill's record."])]
    out.curves["warm"] = {
        "CLI (ms)": [(n, t[f"cli{n}"] * 1e3) for n in sizes],
        "in-process ensure() (ms)": [(n, t[f"lib{n}"] * 1e3) for n in sizes],
    }
    grow, check_grow = t["cli100"] - t["cli1"], t["check100"] - t["check1"]
    out.verdicts.append(Verdict(
        "5. warm CLI flat from 1 to 100 skills", "growth within the fingerprint check's own "
        "(+1 ms noise)", f"{grow * 1e3:+.2f} ms; the check itself {check_grow * 1e3:+.2f} ms",
        grow <= check_grow + 1e-3))
    for world in worlds.values():
        rmtree(world.dir)


def fig_growth_cold(ws: Workspace, s: Settings, out: Results) -> None:
    sizes = (1, 4, 8, 16)
    variants: dict[str, Callable[[], Timing]] = {}
    for n in sizes:
        for key, fn in zip(("ours", "base"), cold_pair(ws, n).values(), strict=True):
            variants[f"{key}{n}"] = fn
    runs = interleave(variants, s.growth_cold_rounds)
    wall = {k: median(t.wall for t in v) for k, v in runs.items()}
    cpu = {k: median(t.cpu for t in v) for k, v in runs.items()}
    rows = [[str(n), secs(wall[f"ours{n}"]), secs(wall[f"base{n}"]),
             ratio(wall[f"ours{n}"], wall[f"base{n}"]), secs(cpu[f"ours{n}"]),
             secs(cpu[f"base{n}"]), ratio(cpu[f"ours{n}"], cpu[f"base{n}"])] for n in sizes]
    out.tables["growth-cold"] = [Table(
        "Target 5: cold path vs number of skills",
        ["Python skills", "kernel-bootstrap wall s", "baseline wall s", "wall ratio",
         "kernel-bootstrap CPU s", "baseline CPU s", "CPU ratio"], rows,
        [f"Median of {s.growth_cold_rounds} interleaved rounds, fresh paths every round; "
         "the baseline is the one of target 3."])]
    out.curves["cold"] = {
        "kernel-bootstrap (s)": [(n, wall[f"ours{n}"]) for n in sizes],
        "baseline (s)": [(n, wall[f"base{n}"]) for n in sizes],
    }


def fig_push(ws: Workspace, s: Settings, out: Results) -> None:
    try:
        import bench_push
    except ImportError as e:
        out.tables["push"] = [Table("Target 5: push vs files", ["note"], [[f"skipped: {e}"]])]
        return
    results = bench_push.run(s.push_rounds, "env", ws.fresh("push"))
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in bench_push.table(results, markdown=True).splitlines()[2:]]
    out.tables["push"] = [Table(
        "Target 5: push vs number of files (scripts/bench_push.py)",
        ["files", "method", "exec calls", "median ms", "vs baseline"], rows,
        [f"Median of {s.push_rounds} interleaved rounds, exec prefix `env`."])]
    sizes = sorted({n for n, _ in results})
    out.curves["push"] = {label: [(n, results[n, label][0] * 1e3) for n in sizes]
                          for label in bench_push.METHODS}

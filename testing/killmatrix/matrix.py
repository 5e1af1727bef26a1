"""The kill matrix run: trace a normal run of each path, kill a run at each point, check what
is left (testing.killmatrix.checks); every point, or (the sweep) every traced call."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from testing.killmatrix.checks import Row, observe
from testing.killmatrix.points import POINTS, Event, Point, at, slow_uv, staged
from testing.killmatrix.worlds import WORLDS, path_env
from testing.processes import kill_group, spawn, wait_for
from testing.seams import Seam, read_trace, seam_argv, seam_env
from testing.world import World


def traced(path: str, root: Path) -> list[Event]:
    """The replace/rename/exchange calls of a normal run in a world of kind ``path``."""
    root.mkdir(parents=True)
    w = WORLDS[path](root)
    trace = root / "trace.jsonl"
    done = subprocess.run(seam_argv(w.command("ensure")[3:]),
                          env=seam_env({**w.env, **path_env(path)}, trace=trace),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return read_trace(trace)


def kill(point: Point, w: World, traces: Callable[[Point], list[Event]]) -> None:
    env = {**w.env, **path_env(point.path), **point.env}
    if point.seam is None:
        reached = point.reached
        assert reached is not None
        if "KB_HANG_AFTER_VENV" in point.env or "KB_HANG_AFTER_UNINSTALL" in point.env:
            env.update(KERNEL_BOOTSTRAP_UV=str(slow_uv(w)), KB_HANG_FLAG=str(w.root / "hung"))
        proc = spawn(w.command("ensure"), env)
        wait_for(lambda: reached(w), proc=proc)
        kill_group(proc)
        return
    # The same world, traced in a twin directory: the index of the call to die at.
    target = point.seam(traces(point), w)
    trace = w.root / "kill-trace.jsonl"
    rule = Seam(call=target["call"], action="kill", index=target["i"], when=point.when)
    proc = spawn(seam_argv(w.command("ensure")[3:]), seam_env(env, rule, trace=trace))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, f"not killed at {target}:\n{err}"
    hit = read_trace(trace)[-1]
    assert hit["event"] == "kill" and hit["call"] == target["call"], hit
    assert os.path.basename(hit["paths"][1]).split("-")[0] == \
        os.path.basename(target["paths"][1]).split("-")[0], (hit, target)


def run_point(point: Point, root: Path, traces: Callable[[Point], list[Event]]) -> Row:
    root.mkdir(parents=True)
    w = WORLDS[point.path](root)
    row = Row(point)
    kill(point, w, traces)
    observe(point, w, row)
    return row


# --- the matrix ------------------------------------------------------------------------------

def run_matrix(root: Path, points: list[Point] = POINTS, workers: int = 3,
               cache: dict[str, list[Event]] | None = None,
               ) -> tuple[list[Row], dict[str, BaseException]]:
    """Every row in its own world under ``root``; ``workers`` rows at a time (they only wait on
    children). Returns the rows in ``points`` order and the failure of each row that failed."""
    from concurrent.futures import ThreadPoolExecutor

    lock = threading.Lock()
    cache = {} if cache is None else cache

    def traces(point: Point) -> list[Event]:
        with lock:  # one trace per world kind, taken once
            if point.path not in cache:
                cache[point.path] = traced(point.path, root / f"trace-{len(cache)}")
            return cache[point.path]

    def one(n: int, point: Point) -> Row | BaseException:
        try:
            return run_point(point, root / f"row-{n:02}", traces)
        except Exception as e:  # reported with its row below
            return e

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(one, range(len(points)), points))
    rows = [r for r in results if isinstance(r, Row)]
    failed = {p.id: r for p, r in zip(points, results, strict=True)
              if isinstance(r, BaseException)}
    return rows, failed


# --- the sweep: every traced call, before and after -----------------------------------------

def label(e: Event) -> str:
    src, dst = (os.path.basename(p) for p in e["paths"])
    if dst == ".bootstrap-version":
        where = "staged" if staged(e["paths"][1]) else "live"
        return f"{e['call']} {where} marker"
    if "/kernel-bootstrap/warm/" in e["paths"][1]:
        return f"{e['call']} warm fingerprint"
    return f"{e['call']} {src.split('-')[0]} -> {dst.split('-')[0]}"


def sweep(root: Path, workers: int = 3) -> tuple[list[Row], dict[str, BaseException]]:
    """A kill just before and just after every replace/rename/exchange of every path's run."""
    cache = {path: traced(path, root / f"trace-{n}") for n, path in enumerate(WORLDS)}
    points = [Point(path, f"#{e['i']} {label(e)} ({when})", None, None, seam=at(e["i"]),
                    when=when, live="auto")
              for path, events in cache.items() for e in events
              for when in ("before", "after")]
    return run_matrix(root, points, workers, cache)

"""The kill matrix's engine (the tests in tests/test_kill_matrix.py and scripts/kill_matrix.py
run it): SIGKILL the whole ``ensure`` process group at every step boundary.

Each row starts ``kernel-bootstrap ensure`` as a child in its own process group and kills the
group at one step of the cold path, of a staged rebuild (runtime change; with RENAME_EXCHANGE
and with the rename-aside fallback) or of the skills-only path. Steps inside uv are reached by
making the fake uv hang; steps between two syscalls (the base marker, the swap, each marker
merge, the final write) by a seam in the child that SIGKILLs its group just before or just
after the Nth replace/rename/exchange of the run (N found from a trace of the same run).

After each kill, from outside: the marker is valid or absent (never torn); where there was a
venv, its interpreter still runs; the next ``ensure`` succeeds, reinstalls no skill that the
marker records for the current runtime, and builds no venv when the marker already had the
current runtime; afterwards the environment is ready and nothing is left beside the venv.
(One exception, asserted as such: a kill inside the final marker write leaves its temp file,
and the next ensure is warm, which takes no lock and writes nothing; the next locked run or
``gc`` removes it.) Run with ``-s`` (or ``scripts/kill_matrix.py``) to see the table;
``KB_STRESS=1`` adds a sweep that kills just before and just after every replace, rename and
exchange of each path's run (58 points, 45-85 s here).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootstrap.config import load_config
from bootstrap.engine.status import status
from bootstrap.env import generations
from bootstrap.env.marker import read_marker
from bootstrap.env.venv import leftovers
from testing.processes import kill_group, spawn, wait_for
from testing.seams import Seam, read_trace, seam_argv, seam_env
from testing.world import World

Event = dict[str, Any]
RUNTIME = ["requests>=2"]
NEW_RUNTIME = ["requests>=2", "six"]
NO_EXCHANGE = {"KERNEL_BOOTSTRAP_NO_EXCHANGE": "1"}
# The staged swap a venv without generations keeps (Windows): a plain directory throughout.
PLAIN = {"KERNEL_BOOTSTRAP_NO_GENERATIONS": "1"}


# --- the worlds ------------------------------------------------------------------------------

def cold(root: Path) -> World:
    w = World(root)
    w.write_config(requirements=RUNTIME)
    for name in ("alpha", "beta", "gamma"):
        w.skill(name)
    return w


def rebuild(root: Path) -> World:
    """A ready venv whose runtime then changes: the rebuild is staged beside it."""
    w = cold(root)
    w.ensure()
    w.write_config(requirements=NEW_RUNTIME)
    w.clear_log()
    return w


def skills_only(root: Path) -> World:
    """A ready venv, then three more skills."""
    w = World(root)
    w.write_config(requirements=RUNTIME)
    for name in ("alpha", "beta"):
        w.skill(name)
    w.ensure()
    for name in ("gamma", "delta", "epsilon"):
        w.skill(name)
    w.clear_log()
    return w


def one_skill_removed(root: Path) -> World:
    """A ready venv, then a skill is no longer configured: the sync uninstalls it."""
    w = World(root)
    w.write_config(requirements=RUNTIME)
    for name in ("alpha", "beta"):
        w.skill(name)
    w.ensure()
    shutil.rmtree(w.skills_dir / "beta")
    w.clear_log()
    return w


def plain_rebuild(root: Path) -> World:
    """:func:`rebuild` of a venv without generations: the staged swap, then rename-aside."""
    w = World(root)
    w.env.update(PLAIN)
    w.write_config(requirements=RUNTIME)
    for name in ("alpha", "beta", "gamma"):
        w.skill(name)
    w.ensure()
    w.write_config(requirements=NEW_RUNTIME)
    w.clear_log()
    return w


def conversion(root: Path) -> World:
    """A ready plain-directory venv of an earlier release: the next ensure makes it the first
    generation (an exchange of the directory and a link), without a rebuild."""
    w = cold(root)
    w.ensure(env=PLAIN)
    w.clear_log()
    return w


WORLDS: dict[str, Callable[[Path], World]] = {
    "cold": cold, "rebuild": rebuild, "rebuild, rename-aside": plain_rebuild,
    "conversion": conversion,
    "skills-only": skills_only, "skills-only, one removed": one_skill_removed,
}


def path_env(path: str) -> dict[str, str]:
    return dict(NO_EXCHANGE) if "rename-aside" in path else {}


# --- reaching a step -------------------------------------------------------------------------

def slow_uv(world: World) -> Path:
    """A uv that does the call, then (when asked) touches $KB_HANG_FLAG and never returns."""
    shim = world.root / "bin" / "uv-then-hang"
    shim.write_text(
        "#!/bin/sh\n"
        f'{world.uv} "$@" || exit $?\n'
        'case "$1 $2" in\n'
        '  "venv "*) hang=$KB_HANG_AFTER_VENV ;;\n'
        '  "pip uninstall") hang=$KB_HANG_AFTER_UNINSTALL ;;\n'
        "  *) hang= ;;\n"
        "esac\n"
        'if [ -n "$hang" ]; then : > "$KB_HANG_FLAG"; exec sleep 3600; fi\n')
    shim.chmod(0o755)
    return shim


def installing(name: str) -> Callable[[World], bool]:
    def check(w: World) -> bool:
        return any(name in c.requirements or name in c.editables for c in w.installs())

    return check


def isolating(name: str) -> Callable[[World], bool]:
    def check(w: World) -> bool:
        return any(c.editables == [name] for c in w.installs())

    return check


def hang_flag(w: World) -> bool:
    return (w.root / "hung").exists()


def live_marker_writes(events: list[Event], w: World) -> list[Event]:
    # The trace comes from a twin world in another directory: compare the tail of the path.
    return [e for e in events if e["call"] == "replace"
            and e["paths"][1].endswith(f"/{w.venv.name}/.bootstrap-version")]


def first(events: list[Event], test: Callable[[Event], bool]) -> Event:
    return next(e for e in events if test(e))


Pick = Callable[[list[Event], World], Event]


def staged(path: str) -> bool:
    """A path inside a tree being built: a new generation, or (without generations) staging."""
    return ".venv.gen-" in path or ".venv.stage-" in path


def base_marker(events: list[Event], w: World) -> Event:
    return first(events, lambda e: e["call"] == "replace" and staged(e["paths"][1])
                 and e["paths"][1].endswith("/.bootstrap-version"))


def swap(call: str, src: str = "/.venv.stage-", dst: str = "venv") -> Pick:
    """The first ``call`` from a path containing ``src`` to a name starting with ``dst``."""
    def pick(events: list[Event], w: World) -> Event:
        return first(events, lambda e: e["call"] == call and src in e["paths"][0]
                     and os.path.basename(e["paths"][1]).startswith(dst))

    return pick


def attempt_write(events: list[Event], w: World) -> Event:
    return first(live_marker_writes(events, w), lambda e: e["marker"]["attempt"])


def landing_merge(events: list[Event], w: World) -> Event:
    writes = live_marker_writes(events, w)
    return first(writes, lambda e: e["marker"]["skills"] != writes[0]["marker"]["skills"])


def final_write(events: list[Event], w: World) -> Event:
    return live_marker_writes(events, w)[-1]


def warm_fingerprint(events: list[Event], w: World) -> Event:
    return first(events, lambda e: "/kernel-bootstrap/warm/" in e["paths"][1])


def at(index: int) -> Pick:
    def pick(events: list[Event], w: World) -> Event:
        return events[index]

    return pick


@dataclass(frozen=True)
class Point:
    path: str  # a key of WORLDS
    step: str
    # What the marker must be after the kill ("ok" or "missing"), and how many `uv venv`
    # calls the next ensure makes; None: only the invariants are checked (the sweep).
    marker: str | None
    builds: int | None
    env: dict[str, str] = field(default_factory=dict)  # uv-driven: how the child hangs
    reached: Callable[[World], bool] | None = None
    seam: Pick | None = None  # seam-driven: which traced call
    when: str = "before"
    live: str = "runs"  # the venv at the stable path after the kill: runs | absent | aside

    @property
    def id(self) -> str:
        return f"{self.path}: {self.step}"


POINTS = [
    # cold: nothing at the venv path until the first swap
    Point("cold", "inside `uv venv` (created, not returned)", "missing", 1, live="absent",
          env={"KB_HANG_AFTER_VENV": "1"}, reached=hang_flag),
    Point("cold", "runtime install", "missing", 1, env={"FAKE_UV_HANG": "requests"},
          reached=installing("requests"), live="absent"),
    # a complete generation that never became current is adopted, not rebuilt
    Point("cold", "base marker written in the new generation", "missing", 0, seam=base_marker,
          when="after", live="absent"),
    Point("cold", "flip: link renamed into place", "ok", 0,
          seam=swap("rename", "/.venv.link-"), when="after"),
    Point("cold", "attempt recorded", "ok", 0, seam=attempt_write, when="after"),
    Point("cold", "first skill group", "ok", 0, env={"FAKE_UV_HANG": "alpha"},
          reached=installing("alpha")),
    Point("cold", "isolation (beta failed, gamma hangs)", "ok", 0,
          env={"FAKE_UV_FAIL": "beta", "FAKE_UV_HANG_ALONE": "gamma"},
          reached=isolating("gamma")),
    Point("cold", "merging the landed group", "ok", 0, seam=landing_merge),
    Point("cold", "final write (before replace)", "ok", 0, seam=final_write),
    Point("cold", "final write (after replace)", "ok", 0, seam=final_write, when="after"),
    Point("cold", "warm fingerprint", "ok", 0, seam=warm_fingerprint),
    # a staged rebuild: the old venv serves until the exchange
    # a rebuild into a new generation: the old one serves until the flip, and stays after it
    Point("rebuild", "inside `uv venv` (new generation)", "ok", 1,
          env={"KB_HANG_AFTER_VENV": "1"}, reached=hang_flag),
    Point("rebuild", "runtime install", "ok", 1, env={"FAKE_UV_HANG": "six"},
          reached=installing("six")),
    Point("rebuild", "pin written into the new generation", "ok", 1,
          seam=swap("replace", "/.venv.gen-", "000-kernel-bootstrap-pin.pth"), when="after"),
    Point("rebuild", "base marker written in the new generation", "ok", 0, seam=base_marker,
          when="after"),
    Point("rebuild", "flip: before the rename", "ok", 0, seam=swap("rename", "/.venv.link-")),
    Point("rebuild", "flip: renamed, old generation not yet removed", "ok", 0,
          seam=swap("rename", "/.venv.link-"), when="after"),
    Point("rebuild", "removal: old generation renamed to retired", "ok", 0,
          seam=swap("rename", "/.venv.gen-", ".venv.retired-"), when="after"),
    Point("rebuild", "first skill group", "ok", 0, env={"FAKE_UV_HANG": "alpha"},
          reached=installing("alpha")),
    Point("rebuild", "final write", "ok", 0, seam=final_write),
    # without generations (Windows): the staged swap, here its rename-aside fallback
    Point("rebuild, rename-aside", "swap journal written", "ok", 1,
          seam=swap("replace", ".venv.swap.tmp-", ".venv.swap"), when="after"),
    Point("rebuild, rename-aside", "between the two renames", "missing", 0,
          seam=swap("rename", "/venv", ".venv.retired-"), when="after", live="aside"),
    Point("rebuild, rename-aside", "renamed in, journal not yet removed", "ok", 0,
          seam=swap("rename"), when="after"),
    # conversion of a plain-directory venv: never a rebuild, never nothing at the venv path
    Point("conversion", "pin written into the plain directory", "ok", 0,
          seam=swap("replace", "/venv/", "000-kernel-bootstrap-pin.pth"), when="after"),
    Point("conversion", "before the exchange", "ok", 0,
          seam=swap("exchange", "/.venv.gen-", "venv")),
    Point("conversion", "after the exchange", "ok", 0,
          seam=swap("exchange", "/.venv.gen-", "venv"), when="after"),
    # skills only: the runtime is current throughout
    Point("skills-only", "attempt recorded", "ok", 0, seam=attempt_write, when="after"),
    Point("skills-only", "skill group", "ok", 0, env={"FAKE_UV_HANG": "gamma"},
          reached=installing("gamma")),
    Point("skills-only", "isolation (epsilon failed, gamma hangs)", "ok", 0,
          env={"FAKE_UV_FAIL": "epsilon", "FAKE_UV_HANG_ALONE": "gamma"},
          reached=isolating("gamma")),
    Point("skills-only", "merging the landed group", "ok", 0, seam=landing_merge),
    Point("skills-only", "final write (before replace)", "ok", 0, seam=final_write),
    Point("skills-only, one removed", "inside `uv pip uninstall`", "ok", 0,
          env={"KB_HANG_AFTER_UNINSTALL": "1"}, reached=hang_flag),
]


# --- one row ---------------------------------------------------------------------------------

@dataclass
class Row:
    point: Point
    marker: str = ""
    live: str = ""
    beside: str = ""
    action: str = ""
    builds: int = 0
    reinstalled: list[str] = field(default_factory=list)
    ready: bool = False
    left_after: str = ""


def runs(python: Path) -> bool:
    done = subprocess.run([str(python), "-c", "import sys"], capture_output=True, check=False)
    return done.returncode == 0


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
        assert point.reached is not None
        if "KB_HANG_AFTER_VENV" in point.env or "KB_HANG_AFTER_UNINSTALL" in point.env:
            env.update(KERNEL_BOOTSTRAP_UV=str(slow_uv(w)), KB_HANG_FLAG=str(w.root / "hung"))
        proc = spawn(w.command("ensure"), env)
        wait_for(lambda: point.reached(w), proc=proc)  # type: ignore[misc]
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


def observe(point: Point, w: World, row: Row) -> None:
    """What another process sees right after the kill, and what the next ensure does."""
    config = load_config(w.config)
    found = read_marker(w.venv)
    assert found.state in ("ok", "missing"), found.problem  # never torn
    row.marker = found.state
    before = status(config)
    if found.data:
        failures = f"; failed: {', '.join(sorted(found.data['failed']))}" \
            if found.data["failed"] else ""
        row.marker += f" ({', '.join(sorted(found.data['skills'])) or 'base'}{failures})"
    assert point.marker in (None, found.state), row.marker
    if w.venv.exists():
        assert runs(w.python), "the venv at the stable path must run"
        row.live = "runs"
    elif point.path != "cold":
        # rename-aside's window: nothing at the stable path, the old venv whole beside it.
        [aside] = [p for p in leftovers(w.venv) if ".venv.retired-" in p.name]
        assert runs(aside / "bin" / "python") and (w.root / ".venv.swap").is_file()
        row.live = "absent; old venv aside, journal"
    else:
        row.live = "absent (cold)"
    expected = {"runs": "runs", "aside": "absent; old", "absent": "absent (cold)"}
    assert point.live == "auto" or row.live.startswith(expected[point.live]), row.live
    names = {_kind(p) for p in leftovers(w.venv)}
    names |= {"swap journal"} if (w.root / ".venv.swap").exists() else set()
    row.beside = ", ".join(sorted(names)) or "-"

    recorded = set(found.data["skills"]) if found.data and before.base_current else set()
    w.clear_log()
    result = w.ensure("--json")
    row.action = json.loads(result.stdout)["action"]
    row.builds = len(w.venv_calls())
    installed = {e for c in w.installs() for e in w.editables(c)}
    row.reinstalled = sorted(installed & recorded)
    assert row.reinstalled == [], f"recorded skills installed again: {row.reinstalled}"
    if found.data and before.base_current:
        assert row.builds == 0, "rebuilt although the marker had the current runtime"
    assert point.builds in (None, row.builds), row.builds
    after = status(load_config(w.config))
    row.ready = after.ready
    assert after.ready, after.why or after.pending
    assert not (w.root / ".venv.swap").exists()
    # Leftovers are reaped under the lock. A kill inside the final write leaves its temp
    # marker, and the next ensure is a warm one, which takes no lock and writes nothing: that
    # temp file waits for the next locked run or `gc`.
    left = leftovers(w.venv)
    old = generations.others(w.venv)
    row.left_after = ", ".join(sorted({_kind(p) for p in left} |
                                      ({"old generation"} if old else set()))) or "-"
    assert point.path == "rebuild, rename-aside" or generations.current(w.venv), \
        "the venv is not a link to a generation"
    dangling = [n for n in os.listdir(w.root) if n.startswith(".venv.gen-")
                and os.path.islink(w.root / n)]
    assert dangling == [], f"a killed conversion's link is left: {dangling}"
    if left or old:
        # A kill after the flip leaves the old generation: if the next ensure finds the venv
        # ready without the lock, removing it is for the next locked run, or gc.
        assert all(p.parent == w.venv and ".bootstrap-version.tmp-" in p.name for p in left)
        assert row.action == "ready"
        gc = w.run("gc")
        assert gc.returncode == 0, gc.stderr
        assert leftovers(w.venv) == [] and generations.others(w.venv) == []
        row.left_after += " (until gc)"


def _kind(path: Path) -> str:
    if ".bootstrap-version.tmp-" in path.name:
        return "marker temp"
    if ".venv.swap.tmp-" in path.name:
        return "journal temp"
    return path.name.split("-")[0].lstrip(".").replace("venv.", "")


def run_point(point: Point, root: Path, traces: Callable[[Point], list[Event]]) -> Row:
    root.mkdir(parents=True)
    w = WORLDS[point.path](root)
    row = Row(point)
    kill(point, w, traces)
    observe(point, w, row)
    return row


def table(rows: list[Row]) -> str:
    head = ("path", "killed at", "marker after kill", "venv at the stable path", "left beside",
            "next ensure", "uv venv", "recorded reinstalled", "ready", "left after")
    body = [(r.point.path, r.point.step, r.marker, r.live, r.beside, r.action, str(r.builds),
             ", ".join(r.reinstalled) or "none", "yes" if r.ready else "NO", r.left_after)
            for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = [" | ".join(x.ljust(n) for x, n in zip(line, widths, strict=True))
             for line in (head, tuple("-" * n for n in widths), *body)]
    return "\n".join(lines)


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

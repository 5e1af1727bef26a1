"""The kill matrix's checks: what must hold after a kill, from outside (the marker is valid
or absent, the venv runs, the next ensure redoes nothing and ends ready, nothing is left), and
the row of the table that records it."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap.config import load_config
from bootstrap.engine.status import status
from bootstrap.env import generations
from bootstrap.env.marker import read_marker
from bootstrap.env.venv import leftovers
from testing.killmatrix.points import Point
from testing.world import World


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


def observe(point: Point, w: World, row: Row) -> None:
    """What another process sees right after the kill, and what the next ensure does."""
    recorded, base_current = _after_kill(point, w, row)
    _next_ensure(point, w, row, recorded, base_current)
    _left_after(point, w, row)


def _after_kill(point: Point, w: World, row: Row) -> tuple[set[str], bool]:
    """The marker, the venv at the stable path and what lies beside it; returns the skills the
    marker records for the current runtime and whether it has the current runtime."""
    found = read_marker(w.venv)
    assert found.state in ("ok", "missing"), found.problem  # never torn
    row.marker = found.state
    before = status(load_config(w.config))
    if found.data:
        failures = f"; failed: {', '.join(sorted(found.data['failed']))}" \
            if found.data["failed"] else ""
        row.marker += f" ({', '.join(sorted(found.data['skills'])) or 'base'}{failures})"
    assert point.marker in (None, found.state), row.marker
    row.live = _live(point, w)
    expected = {"runs": "runs", "aside": "absent; old", "absent": "absent (cold)"}
    assert point.live == "auto" or row.live.startswith(expected[point.live]), row.live
    names = {_kind(p) for p in leftovers(w.venv)}
    names |= {"swap journal"} if (w.root / ".venv.swap").exists() else set()
    row.beside = ", ".join(sorted(names)) or "-"
    base_current = bool(found.data) and before.base_current
    return (set(found.data["skills"]) if found.data and base_current else set()), base_current


def _live(point: Point, w: World) -> str:
    """What is at the stable path: a venv that runs, or (rename-aside's window) nothing, the
    old venv whole beside it; or nothing yet (cold)."""
    if w.venv.exists():
        assert runs(w.python), "the venv at the stable path must run"
        return "runs"
    if point.path != "cold":
        [aside] = [p for p in leftovers(w.venv) if ".venv.retired-" in p.name]
        assert runs(aside / "bin" / "python") and (w.root / ".venv.swap").is_file()
        return "absent; old venv aside, journal"
    return "absent (cold)"


def _next_ensure(point: Point, w: World, row: Row, recorded: set[str],
                 base_current: bool) -> None:
    """The next ensure reinstalls nothing recorded, builds no venv it had, ends ready."""
    w.clear_log()
    result = w.ensure("--json")
    row.action = json.loads(result.stdout)["action"]
    row.builds = len(w.venv_calls())
    installed = {e for c in w.installs() for e in w.editables(c)}
    row.reinstalled = sorted(installed & recorded)
    assert row.reinstalled == [], f"recorded skills installed again: {row.reinstalled}"
    if base_current:
        assert row.builds == 0, "rebuilt although the marker had the current runtime"
    assert point.builds in (None, row.builds), row.builds
    after = status(load_config(w.config))
    row.ready = after.ready
    assert after.ready, after.why or after.pending


def _left_after(point: Point, w: World, row: Row) -> None:
    """What is left beside the venv after the next ensure (and then gc)."""
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

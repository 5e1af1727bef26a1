"""The kill matrix's points: each step of each path, and how a run is brought to it (a uv
that hangs, or a seam that kills at the Nth traced replace/rename/exchange)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testing.world import World

Event = dict[str, Any]  # one traced call (testing.seams.read_trace)


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

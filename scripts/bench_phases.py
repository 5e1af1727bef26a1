"""Where the time of one run goes: its uv calls (through a shim that stamps each call's start and
end) and ``ensure``'s own JSON log events (``-v --log-format json``: each carries a timestamp),
against the wall clock of the whole process.

Used by ``bench_hostile.py``'s ``locked-new`` figure to show, phase by phase, what ``ensure``
pays beyond the uv calls uv alone makes too. The shim costs a bash start per uv call, and the
verbose JSON log a little more of ours, so these runs are not the timed ones.
"""

from __future__ import annotations

import datetime
import json
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Every uv call: START and END lines stamped with bash's $EPOCHREALTIME, paired by the shim's
# pid; the first two arguments name the call (`venv --quiet`, `pip install`).
SHIM = """\
#!/usr/bin/env bash
printf 'START\\t%s\\t%s\\t%s %s\\n' "$$" "$EPOCHREALTIME" "$1" "$2" >> {log}
{uv} "$@"
rc=$?
printf 'END\\t%s\\t%s\\n' "$$" "$EPOCHREALTIME" >> {log}
exit $rc
"""


@dataclass(frozen=True)
class Span:
    name: str
    start: float
    end: float


def timing_shim(directory: Path, uv: Path) -> tuple[Path, Path]:
    """A uv that logs each call's start and end; returns (the shim, its log)."""
    log = directory / "uv-spans.log"
    shim = directory / "uv-timed"
    shim.write_text(SHIM.format(log=shlex.quote(str(log)), uv=shlex.quote(str(uv))), "utf-8")
    shim.chmod(0o755)
    return shim, log


def uv_spans(log: Path) -> list[Span]:
    """The calls logged since the log was last emptied, in the order they started."""
    starts: dict[str, tuple[float, str]] = {}
    spans: list[Span] = []
    for line in log.read_text(encoding="utf-8").splitlines():
        kind, pid, stamp, *rest = line.split("\t")
        if kind == "START":
            starts[pid] = (float(stamp), rest[0] if rest else "")
        elif kind == "END" and pid in starts:
            begun, name = starts.pop(pid)
            spans.append(Span(name, begun, float(stamp)))
    return sorted(spans, key=lambda s: s.start)


def run_logged(argv: Sequence[str | Path], env: Mapping[str, str],
               log: Path) -> tuple[float, float, list[Span], dict[str, float]]:
    """One run of ``argv`` with its uv calls logged to ``log`` (emptied first): its start and
    end (epoch seconds), the uv spans, and the first timestamp of each JSON log event on its
    stderr."""
    log.write_text("", encoding="utf-8")
    start = time.time()
    proc = subprocess.run([str(a) for a in argv], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=dict(env), check=False, text=True)
    end = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(map(str, argv))}: exit {proc.returncode}\n"
                           f"{proc.stderr[-2000:]}")
    return start, end, uv_spans(log), _events(proc.stderr)


def _events(stderr: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in stderr.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "timestamp" in event:
            stamp = datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
            found.setdefault(str(event.get("event")), stamp.timestamp())
    return found


def ours_phases(start: float, end: float, spans: list[Span],
                events: Mapping[str, float]) -> dict[str, float]:
    """A locked rebuild's phases: the three uv calls it shares with uv alone (the venv, the
    pins, the skills) and what ``ensure`` does around them."""
    venv, pins, skills = _three(spans)
    ready = events.get("runtime ready", skills.start)
    return {
        "start: interpreter, imports, config, status, lock checks, the lock": venv.start - start,
        "uv venv": venv.end - venv.start,
        "between uv venv and the pins": pins.start - venv.end,
        "uv pip install: the pins (pylock.toml)": pins.end - pins.start,
        "the pin, validation, base marker, flip": ready - pins.end,
        "skills: build cache lookup, marker attempt, requirements file": skills.start - ready,
        "uv pip install: the skills": skills.end - skills.start,
        "after: editable records, marker, scratch removal, fingerprint, exit": end - skills.end,
        "total": end - start,
    }


def uv_alone_phases(start: float, end: float, spans: list[Span]) -> dict[str, float]:
    venv, pins, skills = _three(spans)
    return {
        "start: interpreter, imports, config, status, lock checks, the lock": venv.start - start,
        "uv venv": venv.end - venv.start,
        "between uv venv and the pins": pins.start - venv.end,
        "uv pip install: the pins (pylock.toml)": pins.end - pins.start,
        "the pin, validation, base marker, flip": 0.0,
        "skills: build cache lookup, marker attempt, requirements file": skills.start - pins.end,
        "uv pip install: the skills": skills.end - skills.start,
        "after: editable records, marker, scratch removal, fingerprint, exit": end - skills.end,
        "total": end - start,
    }


def _three(spans: list[Span]) -> tuple[Span, Span, Span]:
    if len(spans) != 3 or not spans[0].name.startswith("venv"):
        raise RuntimeError(f"expected uv venv and two installs, got {[s.name for s in spans]}")
    return spans[0], spans[1], spans[2]

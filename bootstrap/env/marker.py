"""The readiness marker ``<venv>/.bootstrap-version``: tolerant read, merge, atomic write.

The marker is what makes a SIGKILLed session's work count: the base record lands right after the
runtime install and each skill group's record as soon as it lands, so the next session installs
only what is left. Reading never raises: anything unreadable is "missing" (with a warning naming
the file) or "legacy" (another schema), and both mean rebuild.
"""

from __future__ import annotations

import json
import os
import reprlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, NotRequired, TypedDict, TypeGuard

from bootstrap.env.identity import SCHEMA
from bootstrap.primitives.atomic import DiskError, write_atomic
from bootstrap.primitives.fs import read_state_file

MARKER_NAME: Final = ".bootstrap-version"
# Our markers nest four levels (marker > runtime > inputs > list > str). Anything much deeper is
# not ours, and letting it through would hand a RecursionError to whoever compares or prints it
# (fuzzing found one in the "runtime changed" reasons).
MAX_DEPTH: Final = 32
MarkerState = Literal["ok", "missing", "corrupt", "legacy"]


class SkillRecord(TypedDict):
    path: str
    pyproject: str
    project: str


class FailedRecord(TypedDict):
    path: str
    pyproject: str
    error: str
    # How many times in a row it failed with this path and pyproject, and when it may be tried
    # again (bootstrap.skills.backoff). Optional, so the markers written before them stay readable
    # (such a failure counts once and is due), and older readers ignore them.
    failures: NotRequired[int]
    retry_at: NotRequired[float]
    # True if uv was offline (bootstrap.skills.backoff.tried_as); absent: online.
    offline: NotRequired[bool]


class RuntimeRecord(TypedDict):
    identity: str
    inputs: dict[str, Any]
    python: str


class AttemptRecord(TypedDict):
    """The skill group a session handed to uv and has not finished with (skills/sync.py)."""

    skills: list[str]
    first: bool  # the session's first uv call: it had the session's whole time to itself
    pid: int
    started: float


class MarkerData(TypedDict):
    schema: int
    runtime: RuntimeRecord
    skills: dict[str, SkillRecord]
    failed: dict[str, FailedRecord]
    updated: float
    # Present only while a session is inside a uv call: a marker that still has it was left by
    # a session that died. Older readers ignore it.
    attempt: NotRequired[AttemptRecord]
    # True: what is installed was compiled to bytecode, and later installs compile theirs
    # (`compile-bytecode`, bootstrap.env.bytecode). Absent (older markers): not compiled.
    bytecode: NotRequired[bool]


@dataclass(frozen=True)
class MarkerRead:
    state: MarkerState
    data: MarkerData | None = None
    problem: str = ""


@dataclass
class SkillChanges:
    """What a sync step learned, to overlay on the on-disk marker."""

    installed: dict[str, SkillRecord] = field(default_factory=dict)
    failed: dict[str, FailedRecord] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)


def marker_path(venv: Path) -> Path:
    return venv / MARKER_NAME


def read_marker(venv: Path) -> MarkerRead:
    """Read without ever raising; see :class:`MarkerRead` for the states."""
    path = marker_path(venv)
    try:
        # Not read_bytes(): a marker planted as a symlink to /dev/zero was read whole (10.9 GB,
        # then MemoryError), and one planted as a FIFO blocked every later session.
        raw = read_state_file(path)
    except FileNotFoundError:
        return MarkerRead("missing")
    except OSError as e:
        return MarkerRead("corrupt",
                          problem=f"marker {path} unreadable: {e.strerror or e}")
    except ValueError:  # a venv path holding NUL or an unencodable character
        return MarkerRead("missing")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # also non-UTF-8 bytes and ints over 4300 digits
        return MarkerRead("corrupt", problem=f"marker {path} is not valid JSON (truncated?)")
    if not isinstance(obj, dict):
        return MarkerRead("corrupt", problem=f"marker {path} is not a JSON object")
    schema = obj.get("schema")
    # type(), not isinstance: true == 1 and 1.0 == 1 in Python, but neither is a schema we wrote.
    if type(schema) is not int or schema != SCHEMA:
        return MarkerRead("legacy",
                          problem=f"marker {path} has schema {_short(schema)}, not {SCHEMA}")
    problem = _depth_problem(obj) or _shape_problem(obj)
    if problem:
        return MarkerRead("corrupt", problem=f"marker {path} is malformed: {problem}")
    return MarkerRead("ok", obj)  # type: ignore[arg-type]  # shape checked just above


def _shape_problem(obj: dict[str, Any]) -> str | None:
    runtime = obj.get("runtime")
    if not isinstance(runtime, dict) or not _all_str(runtime, ("identity", "python")):
        return "runtime record missing or wrongly typed"
    if not isinstance(runtime.get("inputs"), dict):
        return "runtime inputs missing"
    for key, fields in (("skills", ("path", "pyproject", "project")),
                        ("failed", ("path", "pyproject", "error"))):
        table = obj.get(key)
        if not isinstance(table, dict):
            return f"{key!r} is not an object"
        for name, record in table.items():
            if not isinstance(record, dict) or not _all_str(record, fields):
                return f"{key}[{_short(name)}] is wrongly shaped"
    if type(obj.get("updated")) not in (int, float):
        return "'updated' is not a number"
    return None


def _depth_problem(obj: object) -> str | None:
    # Iterative: the point is to never recurse on input we did not write.
    todo: list[tuple[object, int]] = [(obj, 0)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, dict):
            todo += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            todo += [(v, depth + 1) for v in value]
    return None


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


def _short(value: object) -> str:
    """A bounded repr for messages: a marker may hold anything, and a warning is one line."""
    text = _repr.repr(value)  # bounded depth and item counts, yet nested items add up
    return text if len(text) <= 120 else text[:117] + "..."


def _all_str(obj: dict[str, Any], keys: tuple[str, ...]) -> bool:
    return all(is_text(obj.get(k)) for k in keys)


def is_text(value: object) -> TypeGuard[str]:
    """A string ``status`` can print (every text field of our state files must be one)."""
    # Our strings are paths (a non-UTF-8 name holds surrogate escapes, which encode) and uv's
    # output decoded with errors="replace". A lone surrogate of any other kind is not ours, and
    # `status` printing it would crash (found by fuzzing).
    if not isinstance(value, str):
        return False
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        return False
    return True


def base_marker(runtime: RuntimeRecord, skills: dict[str, SkillRecord] | None = None, *,
                bytecode: bool = False) -> MarkerData:
    """A marker for a freshly built runtime, with the skills installed by the same uv call;
    ``bytecode``: that call compiled what it installed."""
    data: MarkerData = {"schema": SCHEMA, "runtime": runtime, "skills": dict(skills or {}),
                        "failed": {}, "updated": time.time()}
    if bytecode:
        data["bytecode"] = True
    return data


def compiled(data: MarkerData | None) -> bool:
    """Whether the marker says the venv's packages are compiled (see MarkerData)."""
    return data is not None and data.get("bytecode") is True


def write_marker(venv: Path, data: MarkerData, *, sync_dir: bool = True) -> None:
    """Replace the marker atomically; a failure is a DiskError that says what to do.

    Whatever fails (a full disk, EIO, a denied replace), the marker on disk is the previous
    one, whole, or the new one: what was recorded before is never lost. ``sync_dir=False``:
    a power loss may undo this write (never an earlier one), as for ``atomic.write_atomic``.
    """
    data["updated"] = time.time()
    blob = json.dumps(data, indent=1, sort_keys=True).encode() + b"\n"
    path = marker_path(venv)
    try:
        write_atomic(path, blob, sync_dir=sync_dir)
    except OSError as e:
        raise DiskError(
            f"could not write the marker {path}: {e.strerror or e}. Nothing it recorded "
            "before is lost; free some space (or fix the permissions), then run "
            "`kernel-bootstrap ensure` again", e
        ) from e


def attempt_of(data: MarkerData | None) -> AttemptRecord | None:
    """The marker's attempt, if it has a usable one (anything else counts as none)."""
    attempt: object = data.get("attempt") if data is not None else None
    if not isinstance(attempt, dict) or not isinstance(attempt.get("skills"), list):
        return None
    skills = [n for n in attempt["skills"] if isinstance(n, str)]
    if not skills:
        return None
    pid: object = attempt.get("pid")
    started: object = attempt.get("started")
    return {"skills": skills, "first": attempt.get("first") is not False,
            "pid": pid if isinstance(pid, int) else 0,
            "started": float(started) if isinstance(started, (int, float)) else 0.0}


def note_attempt(venv: Path, identity: str, skills: list[str], first: bool) -> None:
    """Record in the on-disk marker that ``skills`` are about to go to uv."""
    data = _current(venv, identity)
    if data is not None:  # no marker of this runtime: the next write is a base marker anyway
        data["attempt"] = {"skills": skills, "first": first, "pid": os.getpid(),
                           "started": time.time()}
        # Its rename is left unsynced: the attempt is for a session killed inside uv, whose
        # written pages the kernel keeps. A power loss may undo the note only (the marker
        # before it was synced, bytes and rename), as if the power had failed just before it;
        # the next write of the marker syncs the directory, and with it this rename.
        write_marker(venv, data, sync_dir=False)


def clear_attempt(venv: Path, identity: str) -> None:
    """Drop the attempt: the session is no longer inside a uv call (it did not die there)."""
    data = _current(venv, identity)
    if data is not None and data.pop("attempt", None) is not None:
        write_marker(venv, data)


def _current(venv: Path, identity: str) -> MarkerData | None:
    data = read_marker(venv).data
    return data if data is not None and data["runtime"]["identity"] == identity else None


def merge_skills(venv: Path, runtime: RuntimeRecord, changes: SkillChanges) -> MarkerData:
    """Overlay ``changes`` on the on-disk marker and write it atomically.

    Starting from what is on disk (not from memory) keeps every entry recorded earlier in this
    run, or by an earlier killed run, even if our in-memory view is stale.
    """
    current = read_marker(venv)
    if current.data is not None and current.data["runtime"]["identity"] == runtime["identity"]:
        data = current.data
    else:
        data = base_marker(runtime)
    for name in changes.removed:
        data["skills"].pop(name, None)
        data["failed"].pop(name, None)
    for name, record in changes.installed.items():
        data["skills"][name] = record
        data["failed"].pop(name, None)
    for name, failure in changes.failed.items():
        data["failed"][name] = failure
        data["skills"].pop(name, None)
    write_marker(venv, data)
    return data

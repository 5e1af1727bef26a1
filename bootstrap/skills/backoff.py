"""Failures that repeat with unchanged inputs back off: retried after 1 min, then 2, 4, ... 60.

A skill that cannot be installed (a dependency no index has) used to make every later start
run uv again: 15x the warm start, on every kernel start, until someone fixed the skill. A
failure is therefore recorded with how many times in a row it happened and when it may be tried
again. A first failure is retried at the next start (it may have been a passing fault); once it
repeats, it waits 1 min, then 2, 4, ... up to 60, and until then the start is warm. Anything
that changes what was tried retries at once: a skill's record is matched on its path and
pyproject hash (and lives in the marker of one runtime identity, which covers ``uv-args`` and
the runtime), a rebuild's on the runtime it asked for.

The rebuild's record cannot live in the marker: a failed rebuild leaves the old venv and its
marker as they were. It lies beside the venv, ``<venv>.rebuild-failed``, written atomically and
read as every state file is (see docs/architecture.md, "On disk").
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bootstrap import fingerprint, warm, warm_failures
from bootstrap.config import Config
from bootstrap.env.identity import identity_of, runtime_inputs
from bootstrap.env.marker import FailedRecord, is_text
from bootstrap.env.venv import interpreter, rebuild_record
from bootstrap.errors import BootstrapError
from bootstrap.primitives import log
from bootstrap.primitives.atomic import write_atomic
from bootstrap.primitives.fs import read_state_file
from bootstrap.skills.python_skill import PythonSkill, with_dependencies
from bootstrap.warm import believed, now

FIRST_DELAY: Final = 60.0
LONGEST_DELAY: Final = warm.LONGEST_DELAY
# More than any real count (the delay stops growing at 8); keeps a forged one printable.
MAX_FAILURES: Final = 1_000_000
RETRY_HINT: Final = warm_failures.RETRY_HINT


@dataclass(frozen=True)
class Failure:
    """A recorded failure: its error, how many times in a row, and when it may be retried."""

    error: str
    failures: int
    retry_at: float

    @property
    def backing_off(self) -> bool:
        return now() < self.retry_at

    def as_json(self) -> dict[str, object]:
        return {"error": self.error, "failures": self.failures, "retry_at": iso(self.retry_at)}


def delay(failures: int) -> float:
    """How long the ``failures``-th failure in a row waits: none after the first, then 1 min,
    doubling, at most 60 min."""
    if failures <= 1:
        return 0.0
    return min(FIRST_DELAY * 2.0 ** min(failures - 2, 16), LONGEST_DELAY)


def after(previous: Failure | None, error: str) -> Failure:
    """The record of one more failure, ``previous`` being the last one with the same inputs."""
    failures = (previous.failures if previous else 0) + 1
    return Failure(error, failures, now() + delay(failures))


def iso(timestamp: float) -> str:
    """ISO 8601 in UTC to the second, as ``2026-12-02T05:44:33Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def from_record(record: Mapping[str, object]) -> Failure | None:
    """A failure read back from a record we wrote; None when it is not one.

    A record written before failures backed off has no count and no retry time: it counts once
    and is due now, which is what its writer meant (retried at the next start).

    Every field is untrusted: a ``retry_at`` of ``1e308``, ``Infinity`` or ``NaN`` (valid JSON)
    once made ``status``, ``ensure`` and ``run`` die with an OverflowError, and one recorded
    by a clock 30 days ahead (a restored VM, an NTP step back) blocked retries for 30 days.
    See :func:`_retry_time`; a count is a positive int, at most :data:`MAX_FAILURES`.
    """
    error = record.get("error")
    if not is_text(error):
        return None
    failures = record.get("failures")
    if isinstance(failures, bool) or not isinstance(failures, int) or failures < 1:
        failures = 1
    return Failure(error, min(failures, MAX_FAILURES), _retry_time(record.get("retry_at")))


def _retry_time(value: object) -> float:
    """A recorded retry time if it is one this clock could have written, else 0 (due).

    Further ahead than the longest delay: due, by ``warm.believed``, the rule the warm path
    applies to a fingerprint's ``until`` too (one rule: the warm path once held such a refusal
    for 30 days while this path retried it). Retried, a failure is recorded again by this
    clock. Not a number, NaN or negative: due as well."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    try:
        when = float(value)
    except OverflowError:  # an int beyond any float
        return 0.0
    if math.isnan(when) or when < 0:
        return 0.0
    return believed(when)


# -- skills ------------------------------------------------------------------------------------

def failure_of(skill: PythonSkill, failed: Mapping[str, FailedRecord],
               offline: bool) -> Failure | None:
    """The skill's recorded failure, if it was recorded for the skill as it is now, and
    ``offline`` as it is now (see :func:`tried_as`)."""
    record = failed.get(skill.name)
    if record is None or not tried_as(record, str(skill.skill.path), skill.hash, offline):
        return None
    return from_record(record)


def tried_as(record: Mapping[str, object], path: str, pyproject: str, offline: bool) -> bool:
    """Whether a skill's failure ``record`` was of these inputs: its path, its pyproject's hash
    and whether uv was offline (a package no cache held is had online: a failure offline used
    to back off after ``offline = false``)."""
    return (record.get("path"), record.get("pyproject"), tried_offline(record)) == (
        path, pyproject, offline)


def tried_offline(record: Mapping[str, object]) -> bool:
    return record.get("offline") is True  # absent (older records, online ones): online


def failed_record(skill: PythonSkill, failure: Failure, offline: bool) -> FailedRecord:
    """The marker's record of the skill's ``failure``: what was tried (see :func:`tried_as`)
    and when to retry it."""
    record: FailedRecord = {"path": str(skill.skill.path), "pyproject": skill.hash,
                            "error": failure.error, "failures": failure.failures,
                            "retry_at": failure.retry_at}
    if offline:  # only then: an online failure's record stays as older readers know it
        record["offline"] = True
    return record


def held_back(pending: Sequence[PythonSkill], failed: Mapping[str, FailedRecord],
              reinstall: frozenset[str], by_project: Mapping[str, PythonSkill],
              offline: bool) -> dict[str, Failure]:
    """The skills of ``pending`` not to try now (their failures are backing off), with those
    failures.

    A skill one of whose configured dependencies is going to be tried is tried with it: its
    failure may have been that dependency's ("depends on skill ..., which failed")."""
    by_name = {s.name: s for s in pending}
    held = {s.name: f for s in pending if s.name not in reinstall
            and (f := failure_of(s, failed, offline)) is not None and f.backing_off}
    tried = set(by_name) - set(held)
    while released := [n for n in held if any(
            d.name in tried for d in with_dependencies(by_name[n], by_project)[:-1])]:
        for name in released:
            del held[name]
            tried.add(name)
    return held


def warn_backed_off(name: str, failure: Failure) -> None:
    """The warning for a skill not tried because its failure is backing off (the warm path
    prints the same event, without the error)."""
    log.warning(warm_failures.BACKED_OFF, skill=name, failures=failure.failures,
                retry_at=iso(failure.retry_at), error=failure.error, hint=RETRY_HINT)


# -- the runtime's rebuild ---------------------------------------------------------------------

def rebuild_key(config: Config) -> str:
    """What a rebuild asked for: the runtime identity before uv picked the interpreter's
    version (the venv that would tell it may be the old one, or none), and whether it was
    offline: a rebuild that failed offline (a package no cache held) used to back off even
    after ``offline = false``. Online, the key is the identity alone, as before."""
    key = identity_of(runtime_inputs(config, ""))
    return f"{key} offline" if config.offline else key


def rebuild_failure(config: Config) -> Failure | None:
    """The recorded failure of a rebuild of this very runtime, if there is one."""
    try:
        obj = json.loads(read_state_file(rebuild_record(config.venv)))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        log.warning("the record of a failed rebuild is unreadable; ignoring it",
                    path=str(rebuild_record(config.venv)), error=str(e))
        return None
    try:
        key = rebuild_key(config)
    except OSError:  # the constraints file went away: the rebuild's own check says so
        return None
    if not isinstance(obj, dict) or obj.get("key") != key:
        return None  # another runtime's failure: this one has not been tried
    return from_record(obj)


def note_rebuild_failure(config: Config, error: str) -> Failure | None:
    """Record that this runtime's rebuild failed (under the bootstrap lock); None when the
    record could not be written (a full or read-only disk): the next start then tries again."""
    failure = after(rebuild_failure(config), error)
    blob = json.dumps({"key": rebuild_key(config), **failure.as_json(),
                       "retry_at": failure.retry_at}, indent=1, sort_keys=True)
    try:
        write_atomic(rebuild_record(config.venv), blob.encode() + b"\n")
    except OSError as e:
        log.warning("could not record the failed rebuild; the next start retries it",
                    path=str(rebuild_record(config.venv)), error=e.strerror or str(e))
        return None
    return failure


def refuse_rebuild(config: Config, failure: Failure | None, stamped: list[tuple[str, str]],
                   *, retry: bool) -> None:
    """Inside a failed rebuild's backoff window (and no ``retry``): raise its recorded error.

    With ``stamped`` (taken before ``failure`` was read) the warm path is told to answer the
    same until the window ends: the full path alone costs more than the 0.1 s allowed."""
    if failure is None or not failure.backing_off or retry:
        return
    remember_refusal(config, failure, stamped)
    raise BootstrapError(backed_off_message(failure))


def remember_refusal(config: Config, failure: Failure, stamped: list[tuple[str, str]]) -> None:
    if stamped and config.path is not None:
        fingerprint.save(str(config.path), str(config.venv), str(interpreter(config.venv)), stamped,
                  until=failure.retry_at, refused=backed_off_message(failure),
                  kernel_server=config.kernel_server)


def clear_rebuild_failure(venv: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        rebuild_record(venv).unlink()


def backed_off_message(failure: Failure) -> str:
    times = "once" if failure.failures == 1 else f"{failure.failures} times in a row"
    return (f"the rebuild of this runtime failed {times}; not retrying before "
            f"{iso(failure.retry_at)} ({RETRY_HINT}, as does `kernel-bootstrap repair`). "
            f"The old venv, if any, is unchanged. The last error:\n{failure.error}")

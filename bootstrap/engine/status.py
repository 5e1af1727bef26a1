"""The environment's status, read-only: the ready gate of ``ensure`` and of ``status``.

One function, :func:`status`, answers both "may the warm path return?" and "what is wrong and
why?". It stats, reads the marker and hashes each pyproject; it never runs a child process,
never takes the lock and never writes, so the warm ``ensure`` costs about one interpreter start.

The module is not called ``status``: ``bootstrap.status`` is the public function, and a
submodule of that name would replace it as the package's attribute once imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from bootstrap.config import Config, Skill
from bootstrap.env.identity import describe_change, identity_of, runtime_inputs
from bootstrap.env.marker import MarkerRead, compiled, read_marker
from bootstrap.env.venv import Venv
from bootstrap.skills.backoff import Failure, from_record, rebuild_failure, tried_offline
from bootstrap.skills.python_skill import pyproject_state
from bootstrap.trees.skillmd import SKILL_FILE, Checked

_CLEAN = Checked()

# "failed": not current, and the last rebuild of the runtime the config asks for failed.
RuntimeState = Literal["current", "stale", "missing", "failed"]
SkillState = Literal["installed", "pending", "stale", "failed"]


@dataclass(frozen=True)
class SkillStatus:
    name: str
    python: bool
    state: SkillState
    error: str | None = None
    failure: Failure | None = None  # state "failed": its count and when it may be retried

    @property
    def backing_off(self) -> bool:
        """Failed with the inputs it has now, and not due for a retry yet."""
        return self.failure is not None and self.failure.backing_off
    # Advisory rules of the Agent Skills spec its SKILL.md breaks (it still loads).
    warnings: tuple[str, ...] = ()
    # Failed because no agent can load its SKILL.md: nothing to retry while that is unchanged.
    invalid: bool = False
    # Invalid, yet the marker still records it installed (its SKILL.md broke after it was):
    # the next full `ensure` uninstalls it, as a failed skill is not installed.
    still_installed: bool = False


@dataclass(frozen=True)
class Status:
    venv: Path
    python: Path
    marker: MarkerRead
    runtime: RuntimeState
    why: list[str] = field(default_factory=list)
    skills: tuple[SkillStatus, ...] = ()
    stray: tuple[str, ...] = ()  # recorded in the marker, no longer configured
    rebuild: Failure | None = None  # runtime "failed": the recorded failure
    # The marker's bytecode record is not what `compile-bytecode` asks for (env/bytecode.py).
    bytecode_due: bool = False

    @property
    def settled(self) -> bool:
        """Nothing to do now: ready, but for skills whose failures are backing off and skills
        whose SKILL.md is invalid (one such skill once made every start cold, taking the lock:
        no uv call can fix a SKILL.md)."""
        return (self.base_current and not self.stray and not self.bytecode_due
                and all(s.state == "installed" or s.backing_off
                        or (s.invalid and not s.still_installed) for s in self.skills))

    @property
    def backed_off(self) -> list[SkillStatus]:
        return [s for s in self.skills if s.backing_off]

    @property
    def invalid(self) -> list[SkillStatus]:
        return [s for s in self.skills if s.invalid]

    @property
    def base_current(self) -> bool:
        return self.runtime == "current"

    @property
    def ready(self) -> bool:
        """What ``ensure`` answers 0 for: the runtime current and every skill installed or
        failed. A failed skill is reported (``failed``), never "not ready": the kernel starts
        without it, and only a fix of the skill changes that (``ensure --strict`` and
        ``status`` say so with exit 3). ``status`` once said "not ready" where ``ensure``
        said ready."""
        return (self.base_current and not self.stray
                and all(s.state in ("installed", "failed") and not s.still_installed
                        for s in self.skills))

    @property
    def failed(self) -> list[SkillStatus]:
        return [s for s in self.skills if s.state == "failed"]

    @property
    def pending(self) -> list[str]:
        return [s.name for s in self.skills if s.state != "installed"]


def status(config: Config, *, vouched: frozenset[str] = frozenset()) -> Status:
    """``vouched``: the SKILL.md files known to break no rule of the spec (see
    ``ensure._vouched``): those are not parsed, and have no warnings."""
    venv = Venv.at(config.venv)
    marker = read_marker(venv.path)
    runtime, why = _runtime_state(config, marker, venv)
    rebuild = rebuild_failure(config) if runtime != "current" else None
    if rebuild is not None:
        runtime = "failed"
    recorded: dict[str, Any] = marker.data["skills"] if marker.data else {}
    # A failure recorded offline is not this config's if it is online, nor the reverse.
    failed: dict[str, Any] = {n: r for n, r in (marker.data["failed"] if marker.data else {})
                              .items() if tried_offline(r) == config.offline}
    # One stat per skill says whether it is a Python skill and, usually, its hash too.
    found = [(s, *_pyproject_state(s)) for s in config.skills]
    skills = tuple(_skill_status(s, is_python, digest, recorded, failed, vouched)
                   for s, is_python, digest in found)
    python_names = {s.name for s, is_python, _ in found if is_python}
    stray = tuple(sorted(n for n in recorded if n not in python_names))
    bytecode_due = runtime == "current" and compiled(marker.data) != config.compile_bytecode
    return Status(venv.path, venv.python, marker, runtime, why, skills, stray, rebuild,
                  bytecode_due)


def _pyproject_state(skill: Skill) -> tuple[bool, str]:
    # A pyproject we cannot even stat (EACCES, EIO) is a Python skill that is not installed as
    # it is now: `status` still prints its report, and `ensure` syncs it and reports the error.
    try:
        return pyproject_state(skill)
    except OSError:
        return True, ""


def _runtime_state(config: Config, marker: MarkerRead,
                   venv: Venv) -> tuple[RuntimeState, list[str]]:
    if marker.data is None:
        reason = marker.problem or f"no marker in {venv.path}"
        return "missing", [reason]
    if not venv.python.exists():
        return "missing", [f"interpreter {venv.python} does not exist"]
    version = venv.version()
    if version is None:
        return "missing", [f"{venv.cfg} is missing or unreadable"]
    inputs = runtime_inputs(config, version)
    recorded = marker.data["runtime"]
    if identity_of(inputs) != recorded["identity"]:
        return "stale", describe_change(recorded["inputs"], inputs) or ["runtime identity changed"]
    return "current", []


def _skill_status(skill: Skill, is_python: bool, digest: str, recorded: dict[str, Any],
                  failed: dict[str, Any], vouched: frozenset[str]) -> SkillStatus:
    vouch = vouched and os.path.join(skill.path, SKILL_FILE) in vouched
    spec = _CLEAN if vouch else skill.spec
    if spec.errors:  # no agent can load it: failed, and uninstalled by the next ensure
        return SkillStatus(skill.name, is_python, "failed", spec.problem,
                           warnings=_warnings(spec), invalid=True,
                           still_installed=is_python and skill.name in recorded)
    state = _install_state(skill, is_python, digest, recorded, failed)
    return replace(state, warnings=_warnings(spec)) if spec.warnings else state


def _warnings(spec: Checked) -> tuple[str, ...]:
    return tuple(map(str, spec.warnings))


def _install_state(skill: Skill, is_python: bool, digest: str, recorded: dict[str, Any],
                   failed: dict[str, Any]) -> SkillStatus:
    name, path = skill.name, str(skill.path)
    if not is_python:
        return SkillStatus(name, False, "installed")
    record = recorded.get(name)
    if record and record["path"] == path and record["pyproject"] == digest:
        return SkillStatus(name, True, "installed")
    failure = failed.get(name)
    if failure and failure["path"] == path and failure["pyproject"] == digest:
        return SkillStatus(name, True, "failed", failure["error"], from_record(failure))
    if record:
        return SkillStatus(name, True, "stale")
    return SkillStatus(name, True, "pending")

"""Skill sync: install what is pending in one uv call, isolate failures, record every landing.

Each success is merged into the marker as soon as it lands, so a session killed at any point
leaves a marker that tells the next session exactly what is left. The system we replace wrote
its marker once, after the last install: every killed session left nothing behind, and the next
one started over, forever.

One uv call for everything is the fastest way when the session lives long enough, but uv
installs nothing until the whole call has resolved and built, so a session that is always
killed sooner lands nothing. Measured on 12 skills with sessions killed every 1.5 s: when uv's
cache does not outlive the session, one call never landed in 25 sessions; with a shared cache
it landed after 4-9 sessions, only as the builds of killed calls piled up in it (see
BENCHMARKS.md). So before each call we record the group we attempt in the marker (its
``attempt`` record, see bootstrap.env.marker). A session that finds
an attempt knows that its predecessor died (the final authoritative write drops it). If the
attempt's skills are still not installed, that session died inside that call, and the next
installs in groups half that size; the same size if the attempt was not its session's first call
(that session ran out of time; the size was not the problem) or had landed. Every landed group
is merged into the marker at once.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from bootstrap.config import Config
from bootstrap.env.marker import (
    FailedRecord,
    MarkerData,
    RuntimeRecord,
    SkillChanges,
    SkillRecord,
    attempt_of,
    clear_attempt,
    merge_skills,
    note_attempt,
    read_marker,
    write_marker,
)
from bootstrap.env.uv import Uv
from bootstrap.env.venv import Venv, work_path
from bootstrap.errors import BootstrapError, UvError
from bootstrap.primitives import log, progress
from bootstrap.primitives.atomic import DiskError
from bootstrap.primitives.fs import removed_on_exit
from bootstrap.skills import backoff, builds, workdirs
from bootstrap.skills.python_skill import (
    PythonSkill,
    dependency_order,
    load_python_skill,
    requirements_file,
    unusable_path_problem,
    with_dependencies,
)


@dataclass
class SyncOutcome:
    installed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)


@dataclass
class _Sync:
    config: Config
    uv: Uv
    runtime: RuntimeRecord
    skills: dict[str, PythonSkill]
    reinstall: frozenset[str] = frozenset()
    outcome: SyncOutcome = field(default_factory=SyncOutcome)
    # The failures recorded when the sync began: a skill failing again with the same inputs
    # backs off longer (bootstrap.skills.backoff).
    earlier: dict[str, FailedRecord] = field(default_factory=dict)

    @cached_property
    def python(self) -> Path:
        return Venv.at(self.config.venv).python

    @property
    def by_project(self) -> dict[str, PythonSkill]:
        return {s.project: s for s in self.skills.values() if s.project}

    def record(self, changes: SkillChanges) -> None:
        merge_skills(self.config.venv, self.runtime, changes)

    def land(self, group: Sequence[PythonSkill]) -> None:
        self.record(SkillChanges(installed={s.name: _record_of(s) for s in group}))
        self.outcome.installed += [s.name for s in group if s.name not in self.outcome.installed]

    def fail(self, skill: PythonSkill, error: str) -> None:
        previous = backoff.failure_of(skill, self.earlier, self.config.offline)
        failure = backoff.after(previous, error)
        log.warning("skill failed to install", skill=skill.name, path=str(skill.skill.path),
                    error=error, failures=failure.failures,
                    retry_at=backoff.iso(failure.retry_at),
                    hint="fix the skill and run `kernel-bootstrap ensure` again (a change to "
                         "its pyproject.toml retries it at once; a repeated failure waits until "
                         "retry_at, unless `kernel-bootstrap ensure --retry` or "
                         "`kernel-bootstrap repair`)")
        record = backoff.failed_record(skill, failure, self.config.offline)
        self.record(SkillChanges(failed={skill.name: record}))
        self.outcome.failed[skill.name] = error

    def install(self, group: Sequence[PythonSkill], what: str) -> None:
        """One uv call for ``group``, recorded as the marker's attempt while it runs."""
        with _disk_errors(self.config.venv), removed_on_exit(_scratch(self.config.venv)) as work:
            wheels = builds.build(group, self.uv, self.python, work)
            for index, (cwd, skills) in enumerate(workdirs.calls(group, wheels)):
                scratch = work / f"call-{index}"
                scratch.mkdir()
                reqs = requirements_file(skills, scratch, wheels, cwd)
                forced = [a for s in skills if s.name in self.reinstall
                          for a in ("--reinstall-package", s.project)]
                self.uv.install(self.python, ["-r", str(reqs), *forced], what=what, cwd=cwd,
                                env=builds.out_of_tree(scratch))
            builds.record_editables(self.config.venv, {s: wheels[s.name] for s in group
                                               if s.name in wheels})


@contextlib.contextmanager
def _disk_errors(venv: Path) -> Iterator[None]:
    """A failed write while preparing a uv call says which file, and what to do about it.

    A full disk used to end the session with a bare "[Errno 28] No space left on device".
    """
    try:
        yield
    except DiskError:
        raise
    except OSError as e:
        where = e.filename or f"the scratch space of {venv}"
        raise DiskError(
            f"could not write {where} while installing skills: {e.strerror or e}. The skills "
            "installed before are kept; free some space (or fix the permissions), then run "
            "`kernel-bootstrap ensure` again", e
        ) from e


def _scratch(venv: Path) -> Path:
    """A scratch directory beside the venv (reaped by recover() after a kill), or in the temp
    directory when the venv's parent is not ours to write (a venv provisioned under /opt) or
    its path is one uv cannot take (the built wheels are handed to uv by their paths)."""
    work = work_path(venv)
    try:
        if unusable_path_problem(work):
            raise NotADirectoryError(work)
        work.mkdir()
    except OSError:
        return Path(tempfile.mkdtemp(prefix="kernel-bootstrap-"))
    return work


@dataclass(frozen=True)
class Riders:
    """Skills whose editable wheels the build cache holds, installed by the runtime's own uv
    call in a rebuild (see :func:`cached_riders`)."""

    skills: tuple[PythonSkill, ...] = ()
    wheels: dict[str, Path] = field(default_factory=dict)
    requirements: Path | None = None
    # The other installable skills: for the sync, after the runtime.
    rest: tuple[PythonSkill, ...] = ()

    def args(self) -> list[str]:
        """What the runtime's ``uv pip install`` adds to install them."""
        return ["-r", str(self.requirements)] if self.requirements else []

    def landed(self, venv: Path) -> dict[str, SkillRecord]:
        """After uv installed them into ``venv``: record them as uv records editables; their
        marker records."""
        builds.record_editables(venv, {s: self.wheels[s.name] for s in self.skills})
        return {s.name: _record_of(s) for s in self.skills}


@contextlib.contextmanager
def cached_riders(config: Config, uv: Uv, python: Path) -> Iterator[Riders]:
    """The configured skills that can ride along with a rebuild's runtime install: every
    one whose wheel (and whose configured dependencies' wheels) the build cache holds.

    A new venv for skills built before then costs one uv install, not two: uv resolves and
    links them with the runtime (measured on 6 cached skills: a second call cost 60-100 ms
    with its start, 10-25% of uv's whole run here). The venv is still staged, so a session
    killed in that call loses only what a kill during the runtime install loses.
    """
    skills = [load_python_skill(s) for s in config.python_skills]
    usable = [s for s in skills if not s.problem]
    with _disk_errors(config.venv), removed_on_exit(_scratch(config.venv)) as work:
        wheels = builds.cached(usable, uv, python, work)
        by_project = {s.project: s for s in skills if s.project}
        riders = [s for s in usable
                  if all(d.name in wheels for d in with_dependencies(s, by_project))]
        rest = tuple(s for s in usable if s not in riders)
        if not riders:
            yield Riders(rest=rest)
            return
        ordered = tuple(dependency_order(riders, by_project))
        yield Riders(ordered, wheels, requirements_file(ordered, work, wheels), rest)


def build_ahead(config: Config, uv: Uv, python: Path, skills: Sequence[PythonSkill]) -> None:
    """Build ``skills`` into the build cache while uv installs a rebuild's runtime.

    A build needs the interpreter, not the runtime, so its time (~0.5 s for a few hatchling
    skills) can overlap uv's linking instead of following it; the sync then takes the wheels
    from the cache. Without a usable cache there is nothing to keep, so nothing is built here.
    Best effort: whatever goes wrong is left to the sync to meet and report.
    """
    if not skills:
        return
    try:
        with removed_on_exit(_scratch(config.venv)) as work:
            builds.prebuild(skills, uv, python, work)
    except (BootstrapError, OSError) as e:
        log.info("could not build the skills ahead of their install; the sync builds them",
                 error=str(e))


def _record_of(skill: PythonSkill) -> SkillRecord:
    return {"path": str(skill.skill.path), "pyproject": skill.hash, "project": skill.project}


def sync_skills(config: Config, uv: Uv, runtime: RuntimeRecord,
                reinstall: frozenset[str] = frozenset(), *, retry: bool = False) -> SyncOutcome:
    """Bring the venv's skills in line with the config; end with an authoritative marker.

    ``reinstall`` names skills to install again even though they are recorded. A skill whose
    failure is backing off is left alone (and reported as failed) unless ``retry``.
    """
    marker = read_marker(config.venv).data
    sync = _Sync(config, uv, runtime,
                 {s.name: load_python_skill(s) for s in config.python_skills}, reinstall,
                 earlier=dict(marker["failed"]) if marker else {})
    recorded = marker["skills"] if marker else {}
    # SKILL.md no agent can load (ensure has logged why): failed, not installed, stops nothing.
    sync.outcome.failed.update({s.name: s.spec.problem for s in config.skills if s.spec.errors})
    _remove_unconfigured(sync, recorded)
    pending = [s for s in sync.skills.values() if s.name not in sync.outcome.failed
               and (s.name in reinstall or not _is_recorded(s, recorded))]
    if not retry:
        held = backoff.held_back(pending, sync.earlier, reinstall, sync.by_project, config.offline)
        for name, failure in held.items():
            backoff.warn_backed_off(name, failure)
            sync.outcome.failed[name] = failure.error
        pending = [s for s in pending if s.name not in held]
    for skill in [s for s in pending if s.problem]:
        sync.fail(skill, skill.problem)
    pending = [s for s in pending if not s.problem]
    _uninstall_renamed(sync, recorded, pending)
    if pending:
        _install_pending(sync, pending, _group_size(marker, pending))
    _finish(sync)
    return sync.outcome


def _group_size(marker: MarkerData | None, pending: list[PythonSkill]) -> int:
    """All of ``pending`` at once, unless an earlier session died inside a uv call (see the
    module docstring)."""
    attempt = attempt_of(marker)
    if attempt is None:
        return len(pending)
    tried = attempt["skills"]
    # Only a session that ends normally drops its attempt, so the one that wrote this died.
    # If it died inside that call, and that call had the whole session to itself, the group
    # was too big for the time sessions get: halve it (rounding up: 3 -> 2 -> 1). Otherwise
    # it died between calls, or after spending part of its time on earlier ones: the size
    # itself was fine.
    inside = not {s.name for s in pending}.isdisjoint(tried)
    size = (len(tried) + 1) // 2 if inside and attempt["first"] else len(tried)
    log.info("an earlier session was stopped while installing skills; installing them in "
             "smaller groups", skills=tried, pid=attempt["pid"], inside_uv=inside,
             group_size=size)
    return size


def _is_recorded(skill: PythonSkill, recorded: dict[str, SkillRecord]) -> bool:
    record = recorded.get(skill.name)
    return bool(record and record["path"] == str(skill.skill.path)
                and record["pyproject"] == skill.hash)


def _remove_unconfigured(sync: _Sync, recorded: dict[str, SkillRecord]) -> None:
    """Uninstall the recorded skills no longer configured or valid (a failed skill is not
    installed: one whose SKILL.md broke stayed importable), but what valid ones have or need."""
    leaving = sorted(n for n in recorded if n not in sync.skills or n in sync.outcome.failed)
    if not leaving:
        return
    kept = {p for s in sync.skills.values() if s.name not in sync.outcome.failed
            for p in (s.project, *s.requires)}
    if projects := sorted({recorded[n]["project"] for n in leaving} - kept - {""}):
        log.info("uninstalling skills no longer configured or valid", skills=leaving)
        sync.uv.uninstall(sync.python, projects)
    sync.record(SkillChanges(removed=set(leaving)))
    sync.outcome.removed = [n for n in leaving if n not in sync.skills]


def _uninstall_renamed(sync: _Sync, recorded: dict[str, SkillRecord],
                       pending: list[PythonSkill]) -> None:
    """A skill whose ``project.name`` changed: uninstall the distribution of its old name
    (both used to stay installed, each with its ``.pth`` and dist-info).

    Before the new one is installed, not after: the two distributions of one tree can share
    file names (a ``.pth`` named after the module), which uninstalling the old one afterwards
    would take from the new one. The marker still names the old project until the new one
    lands, so a session killed in between leaves the next one the same work to finish.
    """
    renamed = {s.name: recorded[s.name]["project"] for s in pending if s.name in recorded
               and recorded[s.name]["project"] not in ("", s.project)}
    # A project another configured skill now has (two skills that swapped names) stays.
    old = sorted(set(renamed.values()) - set(sync.by_project))
    if old:
        log.info("uninstalling the old distributions of renamed skills", skills=sorted(renamed),
                 projects=old)
        sync.uv.uninstall(sync.python, old)


def _install_pending(sync: _Sync, pending: list[PythonSkill], size: int) -> None:
    names = [s.name for s in pending]
    log.info("installing skills", count=len(pending), skills=names)
    progress.step(f"installing {len(pending)} skill{'s' if len(pending) != 1 else ''}")
    remaining = dependency_order(pending, sync.by_project)
    first = True
    while remaining:
        batch = remaining[:size]
        # The configured skills they depend on go into the same call (already-installed ones
        # are a no-op for uv's freshness check), otherwise uv looks for them on the index and
        # fails.
        group = dependency_order(
            {d.name: d for s in batch for d in with_dependencies(s, sync.by_project)}.values(),
            sync.by_project,
        )
        landing = [s for s in group if s in remaining]
        landing_names = ", ".join(s.name for s in landing)
        identity = sync.runtime["identity"]
        note_attempt(sync.config.venv, identity, [s.name for s in landing], first)
        first = False
        try:
            sync.install(group, what=f"uv could not install skills {landing_names}")
        except DiskError:
            # The session ends here, but not inside uv: the next must not halve its groups
            # (if the disk is still full, this write fails too and changes nothing).
            with contextlib.suppress(DiskError):
                clear_attempt(sync.config.venv, identity)
            raise
        except UvError as e:
            clear_attempt(sync.config.venv, identity)
            if len(group) == 1:
                # That call was the skill alone: isolating it would only repeat it.
                sync.fail(landing[0], e.tail or str(e))
            else:
                # No error here: each bad skill's own warning shows it, once.
                log.warning("skill group failed; installing one by one to find the bad ones",
                            skills=[s.name for s in landing])
                log.debug("the group's error", error=e.tail)
                progress.note("isolating a failed group")
                _isolate(sync, landing)
        else:
            sync.land(landing)
        remaining = [s for s in remaining if s not in landing]


def _isolate(sync: _Sync, pending: list[PythonSkill]) -> None:
    """Install each pending skill with its configured dependencies; record each result."""
    for skill in dependency_order(pending, sync.by_project):
        unit = with_dependencies(skill, sync.by_project)
        broken = [d.name for d in unit[:-1] if d.name in sync.outcome.failed]
        if broken:
            sync.fail(skill, f"depends on skill {broken[0]!r}, which failed to install")
            continue
        try:
            sync.install(unit, what=f"uv could not install skill {skill.name}")
        except UvError as e:
            sync.fail(skill, e.tail or str(e))
            continue
        sync.land([s for s in unit if s in pending])


def _finish(sync: _Sync) -> None:
    """The authoritative write: exactly the configured skills as they are now, nothing else."""
    current = read_marker(sync.config.venv).data
    if current is None or current["runtime"]["identity"] != sync.runtime["identity"]:
        raise AssertionError("BUG: the marker changed under the bootstrap lock")
    # The sync's own records are rewritten and its attempt is over; the rest (the runtime,
    # bootstrap.env.bytecode's record, ...) is not the sync's to decide and stays as it is.
    truth: MarkerData = {**current,
                         "skills": {n: r for n, r in current["skills"].items()
                                    if n in sync.skills and _is_recorded(sync.skills[n], {n: r})},
                         "failed": {n: r for n, r in current["failed"].items()
                                    if n in sync.skills and n not in current["skills"]}}
    truth.pop("attempt", None)
    if truth == current:
        return  # already exactly this (a rebuild's marker recorded every skill): no write
    write_marker(sync.config.venv, truth)

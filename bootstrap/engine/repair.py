"""``repair``: look deeper than the marker, then fix what is broken.

The marker says what we installed; repair checks that it is still true: the interpreter runs,
the requirements are satisfied, every installed file is what its distribution's RECORD says
(``env/record.py``), the ready-check passes, and each Python skill is installed as an editable
of its configured path and imports. A broken runtime (a damaged runtime package included) is
rebuilt (staged, so a failure keeps what there was); a damaged skill is reinstalled. Afterwards
the marker is true again, so the next ``ensure`` is warm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bootstrap.config import Config
from bootstrap.engine import exact
from bootstrap.engine.ensure import ensure
from bootstrap.engine.rebuild import CHECK_TIMEOUT
from bootstrap.engine.results import EnsureResult
from bootstrap.engine.status import Status, status
from bootstrap.env import record
from bootstrap.env.probe import Dist, ProbeResult, probe, requirement_names, unmet_requirements
from bootstrap.env.requirements import canonical, validate_requirements
from bootstrap.env.venv import Venv
from bootstrap.errors import ProcessError
from bootstrap.primitives import process
from bootstrap.skills.python_skill import PythonSkill, import_names, load_python_skill


@dataclass
class Findings:
    runtime: list[str] = field(default_factory=list)  # problems that need a rebuild
    skills: dict[str, str] = field(default_factory=dict)  # damaged skill -> what is wrong
    # The venv is fine but the marker disagrees with the config (a skill not recorded yet, one
    # recorded but no longer configured): an ordinary sync fixes these.
    records: list[str] = field(default_factory=list)
    # With a lock: packages neither pinned nor needed by a skill, pins whose version drifted.
    inexact: list[str] = field(default_factory=list)

    @property
    def needs_sync(self) -> bool:
        return bool(self.runtime or self.skills or self.records)

    @property
    def healthy(self) -> bool:
        return not self.needs_sync and not self.inexact

    def lines(self) -> list[str]:
        return [*self.runtime, *(f"skill {n}: {why}" for n, why in self.skills.items()),
                *self.records, *self.inexact]


@dataclass(frozen=True)
class RepairReport:
    python: Path
    found: list[str]
    done: list[str]
    healthy: bool
    remaining: list[str]


def inspect(config: Config) -> Findings:
    """Everything wrong with the environment, found without changing anything."""
    findings = Findings()
    state = status(config)
    if not state.base_current:
        findings.runtime += [f"runtime {state.runtime}: {why}" for why in state.why]
        return findings
    skills = [load_python_skill(s) for s in config.python_skills]
    try:
        result = probe(state.python, [*requirement_names(config.requirements),
                                      *(s.project for s in skills if s.project)],
                       {s.name: import_names(s) for s in skills})
    except ProcessError as e:
        findings.runtime.append(f"the interpreter does not run: {e.tail or e}")
        return findings
    findings.runtime += [f"requirement {u}"
                         for u in unmet_requirements(config.requirements, result)]
    damaged = _damaged_files(config, skills, findings)
    if config.ready_check and not findings.runtime:
        findings.runtime += _ready_check_problem(state.python, config.ready_check)
    for skill in skills:
        problem = _skill_problem(skill, result) or damaged.get(skill.name)
        if problem:
            findings.skills[skill.name] = problem
    findings.records = _record_problems(state, findings.skills)
    if config.lock is not None and not findings.runtime:
        findings.inexact = exact.inspect(config, state.python, _projects(config)).lines()
    return findings


def _damaged_files(config: Config, skills: list[PythonSkill],
                   findings: Findings) -> dict[str, str]:
    """Distributions whose files are not what their RECORD says (``rm site-packages/six.py``
    left the metadata saying "installed"): a runtime package's damage goes to
    ``findings.runtime`` (a rebuild reinstalls it, staged); a skill's is returned by name."""
    by_project = {canonical(s.project): s.name for s in skills if s.project}
    damaged: dict[str, str] = {}
    for damage in record.damaged(config.venv, hashes=True):
        skill = by_project.get(damage.name)
        if skill is None:
            findings.runtime.append(f"package {damage.describe()}")
        else:
            damaged[skill] = f"files damaged: {damage.describe()}"
    return damaged


def _projects(config: Config) -> list[str]:
    return [s.project for s in map(load_python_skill, config.python_skills) if s.project]


def _ready_check_problem(python: Path, code: str) -> list[str]:
    try:
        check = process.run(python, "-c", code, check=False, timeout=CHECK_TIMEOUT)
    except ProcessError as e:
        return [f"the ready-check does not finish: {e.tail}"]
    if check.returncode == 0:
        return []
    last = check.stderr.strip().splitlines()[-1:] or [f"exit code {check.returncode}"]
    return [f"the ready-check fails: {last[0]}"]


def _skill_problem(skill: PythonSkill, found: ProbeResult) -> str | None:
    if skill.problem:
        return skill.problem
    dist: Dist | None = found.dists.get(skill.project)
    if dist is None:
        return f"distribution {skill.project} is not installed"
    path = dist.editable_path
    if path is None or path.resolve() != skill.skill.path.resolve():
        return f"{skill.project} is not installed as an editable of {skill.skill.path}"
    return found.import_errors.get(skill.name)


_RECORD_STATES = {"pending": "not recorded in the marker yet",
                  "stale": "recorded in the marker with an older pyproject.toml",
                  "failed": "recorded in the marker as failed"}


def _record_problems(state: Status, damaged: dict[str, str]) -> list[str]:
    problems = [f"skill {s.name}: {_RECORD_STATES[s.state]}" for s in state.skills
                if s.python and s.state != "installed" and s.name not in damaged]
    problems += [f"skill {n}: recorded in the marker but no longer configured"
                 for n in state.stray]
    return problems


def repair(config: Config, *, force: bool = False, lock_timeout: float = 300.0) -> RepairReport:
    """Inspect, fix what is broken (``force``: rebuild from scratch), inspect again."""
    validate_requirements(config)
    if config.override_python is not None:
        return _repair_override(config)
    before = inspect(config)
    done: list[str] = []
    if force or before.needs_sync:
        # The log says why it rebuilds: "rebuild from scratch requested" once stood for a
        # ready-check that failed too.
        why = (*before.runtime, *(["rebuild from scratch requested"] if force else []))
        done = _fix(config, before, force=force or bool(before.runtime), why=why,
                    lock_timeout=lock_timeout)
    # Only a current runtime: a rebuild that failed left the old venv, built from other pins.
    if config.lock is not None and status(config).base_current:
        done += exact.repair(config, _projects(config), lock_timeout)
    after = inspect(config)
    return RepairReport(Venv.at(config.venv).python, before.lines(), done, after.healthy,
                        after.lines())


def _repair_override(config: Config) -> RepairReport:
    # An interpreter we do not manage is checked, never changed.
    result = ensure(config)
    problems = [f"skill {n}: {e}" for n, e in result.failed.items()]
    return RepairReport(result.python, problems, [], not problems, problems)


def _fix(config: Config, found: Findings, *, force: bool, why: tuple[str, ...],
         lock_timeout: float) -> list[str]:
    try:
        # A repair retries every failure now, whether or not it is backing off.
        result = ensure(config, lock_timeout=lock_timeout, force=force,
                        reinstall=frozenset(found.skills), why=why, retry=True)
    except (ProcessError, record.Incomplete) as e:
        # A failed rebuild kept the old venv (it is staged); say what failed and let the
        # second inspection report what is still wrong.
        what = "rebuild" if force else "fix"
        return [f"the {what} failed, nothing was changed: {e}"]
    return _describe(result, found)


def _describe(result: EnsureResult, found: Findings) -> list[str]:
    done = []
    if result.action == "rebuild":
        done.append(f"rebuilt the runtime at {result.venv} (staged, then swapped into place)")
    done += [f"{'reinstalled' if n in found.skills else 'installed'} skill {n}"
             for n in result.installed]
    done += [f"skill {n} still fails: {_last_line(e)}" for n, e in result.failed.items()]
    done += [f"uninstalled skill {n} (no longer configured)" for n in result.removed]
    if not done and found.records:
        done.append("recorded the installed skills in the marker")
    return done


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else text

"""``repair``: look deeper than the marker, then fix what is broken.

The marker says what we installed; repair checks that it is still true: the interpreter runs,
the requirements are satisfied, the ready-check passes, and each Python skill is installed as
an editable of its configured path and imports. A broken runtime is rebuilt (staged, so a
failure keeps what there was); a damaged skill is reinstalled. Afterwards the marker is true
again, so the next ``ensure`` is warm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bootstrap import process
from bootstrap.config import Config, validate_requirements
from bootstrap.engine import EnsureResult, ensure
from bootstrap.errors import ProcessError
from bootstrap.probe import probe, requirement_names, unmet_requirements
from bootstrap.skills import PythonSkill, import_names, load_python_skill
from bootstrap.state import assess
from bootstrap.venv import interpreter


@dataclass
class Findings:
    runtime: list[str] = field(default_factory=list)  # problems that need a rebuild
    skills: dict[str, str] = field(default_factory=dict)  # damaged skill -> what is wrong

    @property
    def healthy(self) -> bool:
        return not self.runtime and not self.skills

    def lines(self) -> list[str]:
        return self.runtime + [f"skill {n}: {why}" for n, why in self.skills.items()]


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
    state = assess(config)
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
    findings.runtime += [f"requirement {u}" for u in unmet_requirements(config.requirements,
                                                                        result)]
    if config.ready_check and not findings.runtime:
        check = process.run(state.python, "-c", config.ready_check, check=False)
        if check.returncode != 0:
            findings.runtime.append(f"the ready-check fails: {check.stderr.strip()[-300:]}")
    for skill in skills:
        problem = _skill_problem(skill, result.dists.get(skill.project),
                                 result.import_errors.get(skill.name))
        if problem:
            findings.skills[skill.name] = problem
    return findings


def _skill_problem(skill: PythonSkill, dist: object, import_error: str | None) -> str | None:
    if skill.problem:
        return skill.problem
    if dist is None:
        return f"distribution {skill.project} is not installed"
    path = getattr(dist, "editable_path", None)
    if path is None or Path(path).resolve() != skill.skill.path.resolve():
        return f"{skill.project} is not installed as an editable of {skill.skill.path}"
    if import_error:
        return import_error
    return None


def repair(config: Config, *, force: bool = False, lock_timeout: float = 300.0) -> RepairReport:
    validate_requirements(config)
    if config.override_python is not None:
        result = ensure(config)
        problems = [f"skill {n}: {e}" for n, e in result.failed.items()]
        return RepairReport(result.python, problems, [], not problems, problems)
    before = Findings(runtime=["--force: rebuild from scratch"]) if force else inspect(config)
    done: list[str] = []
    if not before.healthy:
        rebuild = force or bool(before.runtime)
        result = ensure(config, lock_timeout=lock_timeout, force=rebuild,
                        reinstall=frozenset(before.skills))
        done = _describe(result, rebuild)
    after = inspect(config)
    return RepairReport(interpreter(config.venv), before.lines(), done, after.healthy,
                        after.lines())


def _describe(result: EnsureResult, rebuilt: bool) -> list[str]:
    done = [f"rebuilt the runtime at {result.venv} (staged, swapped into place)"] if rebuilt \
        else []
    done += [f"installed skill {n}" for n in result.installed]
    done += [f"skill {n} still fails: {e.splitlines()[-1] if e else e}"
             for n, e in result.failed.items()]
    done += [f"uninstalled skill {n} (no longer configured)" for n in result.removed]
    return done

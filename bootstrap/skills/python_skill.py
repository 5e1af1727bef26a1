"""Python skills as uv sees them: pyproject hash, project name, dependencies on each other.

The hash is what the marker records; the project names let us keep a skill and the configured
skills it depends on in one uv call (installed alone, uv would look for the sibling on the
index and fail).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bootstrap.config import Skill
from bootstrap.config_file import PYPROJECT
from bootstrap.env.requirements import canonical, requirement_name
from bootstrap.primitives.fs import write_file

# Characters uv cannot take in a local project's path (see unusable_path_problem).
_UV_UNUSABLE: Final = frozenset("#\n\r")
# What pathlib's is_file() treats as "no such file" rather than raising.
_ABSENT: Final = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})
# A process that calls ensure() at every kernel start re-hashes only the pyproject files whose
# stat changed (measured: 100 skills, in-process warm ensure 4.6 -> 2.7 ms). A file rewritten
# within the filesystem's timestamp granularity of our stat could keep its key with other
# bytes (git's "racily clean" case), so only files unchanged for a while are cached.
_DIGESTS: dict[str, tuple[tuple[int, int, int, int, int], str]] = {}
_SETTLED_NS: Final = 2_000_000_000


def pyproject_state(skill: Skill) -> tuple[bool, str]:
    """(whether ``skill`` has a pyproject.toml file, the sha256 of it or "" if unreadable).

    One ``stat`` answers both when nothing changed since the last call in this process.
    """
    path = os.path.join(skill.path, PYPROJECT)  # not skill.pyproject: pathlib joins cost 3x
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno in _ABSENT:
            return False, ""
        raise
    except ValueError:  # an embedded NUL: no such file, as for is_file()
        return False, ""
    if not stat.S_ISREG(st.st_mode):
        return False, ""
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    cached = _DIGESTS.get(path)
    if cached is not None and cached[0] == key:
        return True, cached[1]
    try:
        with open(path, "rb") as f:
            digest = "sha256:" + hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return True, ""
    if time.time_ns() - st.st_ctime_ns > _SETTLED_NS:
        _DIGESTS[path] = (key, digest)
    return True, digest


def pyproject_hash(skill: Skill) -> str:
    """sha256 of the skill's pyproject.toml; "" when it cannot be read."""
    return pyproject_state(skill)[1]


@dataclass(frozen=True)
class PythonSkill:
    skill: Skill
    hash: str
    project: str  # canonical project name ("" when the pyproject is unusable)
    requires: frozenset[str]  # canonical names of its dependencies
    problem: str = ""  # why it cannot be installed at all (invalid pyproject or SKILL.md)
    # (build-backend, build requirements) when declared and not in-tree (no backend-path)
    build_system: tuple[str, tuple[str, ...]] | None = None

    @property
    def name(self) -> str:
        return self.skill.name


def load_python_skill(skill: Skill) -> PythonSkill:
    import tomllib

    digest = pyproject_hash(skill)
    # A "#" is reached from a working directory beside the skill (bootstrap.skills.workdirs);
    # a skill no agent can load is not installed either (the sync reports it as failed).
    unusable = skill.spec.problem or unusable_path_problem(skill.path, allow_hash=True)
    if unusable:
        return PythonSkill(skill, digest, "", frozenset(), unusable)
    try:
        data = tomllib.loads(skill.pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        return PythonSkill(skill, digest, "", frozenset(), f"{skill.pyproject}: invalid: {e}")
    project = data.get("project")
    if not isinstance(project, dict) or not isinstance(project.get("name"), str):
        return PythonSkill(skill, digest, "", frozenset(),
                           f"{skill.pyproject}: no [project] name: not an installable package")
    deps = project.get("dependencies", [])
    names = {n for d in deps if isinstance(d, str) if (n := requirement_name(d))}
    return PythonSkill(skill, digest, canonical(project["name"]), frozenset(names),
                       build_system=_build_system(data.get("build-system")))


def _build_system(table: object) -> tuple[str, tuple[str, ...]] | None:
    if not isinstance(table, dict) or "backend-path" in table:
        return None
    backend, requires = table.get("build-backend"), table.get("requires")
    if not isinstance(backend, str) or not isinstance(requires, list) \
            or not all(isinstance(r, str) for r in requires):
        return None
    return backend, tuple(requires)


def with_dependencies(
    skill: PythonSkill, by_project: Mapping[str, PythonSkill]
) -> list[PythonSkill]:
    """``skill`` and every configured skill it depends on, transitively, dependencies first."""
    order: list[PythonSkill] = []
    seen: set[str] = set()

    def visit(s: PythonSkill) -> None:
        if s.name in seen:
            return
        seen.add(s.name)
        for dep in sorted(s.requires):
            target = by_project.get(dep)
            if target is not None:
                visit(target)
        order.append(s)

    visit(skill)
    return order


def dependency_order(skills: Iterable[PythonSkill],
                     by_project: Mapping[str, PythonSkill]) -> list[PythonSkill]:
    """All of ``skills``, each after the configured skills it depends on."""
    order: list[PythonSkill] = []
    seen: set[str] = set()
    for s in sorted(skills, key=lambda s: s.name):
        for item in with_dependencies(s, by_project):
            if item.name not in seen:
                seen.add(item.name)
                order.append(item)
    wanted = {s.name for s in skills}
    return [s for s in order if s.name in wanted]


def requirements_file(skills: Iterable[PythonSkill], directory: Path,
                      wheels: Mapping[str, Path] | None = None, cwd: Path | None = None) -> Path:
    """A requirements file of ``-e`` lines: uv resolves them together and, unlike ``-e`` on the
    command line, applies its freshness check to editables (a no-op costs ~17 ms, not a rebuild).

    A skill in ``wheels`` is listed as its editable wheel, built already (bootstrap.skills.builds).
    Every path goes as a percent-encoded ``file://`` URL: a bare path in this file is cut at
    `` #`` (uv read ``-e /x/proj #2/sk1`` as ``-e /x/proj`` and installed that project instead).
    A skill whose path holds ``#`` goes relative to ``cwd``, uv's working directory
    (``bootstrap.skills.workdirs``).
    """
    path = directory / "skills.txt"
    wheels = wheels or {}
    lines = [f"{s.project} @ {wheels[s.name].as_uri()}" if s.name in wheels
             else editable_line(s, cwd) for s in skills]
    write_file(path, ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"), exclusive=True)
    return path


def working_dir(skill: PythonSkill) -> Path | None:
    """Where uv must run to install ``skill`` from a requirements file; None: anywhere.

    uv 0.13.9 cuts a requirement line at `` #`` and decodes ``%23`` in a ``file://`` URL back
    to ``#``, reading the rest as a fragment: no spelling of ``/p/proj #2/sk`` in a requirements
    file reaches it. A relative ``-e`` line resolves against uv's working directory, though:
    ``-e ./sk`` read by a uv running in ``/p/proj #2`` installs it (and is a no-op next time, as
    any editable). The skill's parent is that directory, and ``./<name>`` is plain: a skill's
    name holds only letters, digits and hyphens.
    """
    path = skill.skill.path
    return path.parent if "#" in str(path) else None


def editable_line(skill: PythonSkill, cwd: Path | None) -> str:
    """The ``-e`` line of ``skill`` for a uv running in ``cwd``."""
    if cwd is not None and working_dir(skill) == cwd:
        return f"-e ./{skill.skill.path.name}"
    return f"-e {skill.skill.path.as_uri()}"


def unusable_path_problem(path: Path, *, allow_hash: bool = False) -> str | None:
    """Why uv cannot be pointed at ``path`` at all, if it cannot; None when it can.

    Checked against uv 0.13.9: it decodes ``%23`` in a file URL to ``#`` and then reads the rest
    as a fragment (a bare path fails the same way), and a newline in a path does not survive its
    URL either. Everything else reaches it intact as a percent-encoded URL.
    """
    bad = sorted({c for c in str(path) if c in _UV_UNUSABLE and not (allow_hash and c == "#")})
    if not bad:
        return None
    shown = " or ".join(repr(c) for c in bad)
    return (f"the path {str(path)!r} contains {shown}, which uv cannot install from; "
            "rename the directory (or move the skill) and run `kernel-bootstrap ensure` again")


def import_names(skill: PythonSkill) -> list[str]:
    """Top-level modules the skill's source tree provides (src layout or flat)."""
    root = skill.skill.path
    base = root / "src" if (root / "src").is_dir() else root
    names: list[str] = []
    for entry in sorted(base.iterdir()):
        if entry.name.startswith((".", "_")) or entry.name in ("tests", "test", "build", "dist"):
            continue
        if entry.is_dir() and (entry / "__init__.py").is_file():
            names.append(entry.name)
        elif base != root and entry.suffix == ".py" and entry.is_file():
            names.append(entry.stem)
    return names

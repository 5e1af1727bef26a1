"""The one skill factory: a skill directory with SKILL.md, optionally a Python package, files,
executable bits and symlinks. Every test and benchmark builds its skills here."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Package:
    """What makes a skill a Python project: a hatchling pyproject and one module."""

    project: str | None = None  # the distribution name (default: the skill's name)
    version: str = "0.1.0"
    deps: Sequence[str] = ()  # requirements, e.g. sibling skills by name
    flat: bool = False  # the module at the top instead of under src/
    module_text: str | None = None  # the module's __init__.py (default: VALUE = NAME)


def skill_md(name: str, description: str = "test skill", body: str = "") -> str:
    """SKILL.md text: front matter naming the skill, then ``body``."""
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}"


def pyproject_text(name: str, package: Package) -> str:
    module = name.replace("-", "_")
    where = module if package.flat else f"src/{module}"
    deps = ", ".join(json.dumps(d) for d in package.deps)
    return (
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        f'[project]\nname = "{package.project or name}"\nversion = "{package.version}"\n'
        f"dependencies = [{deps}]\n\n"
        f'[tool.hatch.build.targets.wheel]\npackages = ["{where}"]\n'
    )


def make_skill(parent: Path, name: str = "demo", files: Mapping[str, str | bytes] | None = None,
               *, description: str = "test skill", body: str = "",
               package: Package | None = None, executables: Iterable[str] = (),
               symlinks: Mapping[str, str] | None = None, exist_ok: bool = False) -> Path:
    """The skill ``parent/name``: SKILL.md (unless ``files`` brings its own), the ``package``'s
    pyproject.toml and module, ``files`` (relative path -> text or bytes), mode 0o755 on
    ``executables`` and ``symlinks`` (relative path -> link target). Returns its path."""
    root = parent / name
    root.mkdir(parents=True, exist_ok=exist_ok)
    contents: dict[str, str | bytes] = {"SKILL.md": skill_md(name, description, body)}
    if package is not None:
        module = name.replace("-", "_")
        init = f"{module}/__init__.py" if package.flat else f"src/{module}/__init__.py"
        contents[init] = package.module_text or f"VALUE = {name!r}\n"
        contents["pyproject.toml"] = pyproject_text(name, package)
    contents.update(files or {})
    for rel, data in contents.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
    for rel in executables:
        (root / rel).chmod(0o755)
    for rel, target in (symlinks or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).symlink_to(target)
    return root


def versioned_skill(parent: Path, version: str, files: Sequence[str],
                    name: str = "demo") -> Path:
    """A skill whose every file (``files``, SKILL.md among them) ends with ``version``: a
    reader can tell which version each file it sees belongs to. Overwrites in place."""
    texts = {rel: f"{version}\n" for rel in files}
    if "SKILL.md" in texts:
        texts["SKILL.md"] = skill_md(name, "test", f"{version}\n")
    return make_skill(parent, name, texts, exist_ok=True)

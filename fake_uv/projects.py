"""Editable projects: what `-e DIR` means, read from DIR/pyproject.toml's `[project]` table."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from fake_uv import reqs
from fake_uv.errors import failure


class Project(NamedTuple):
    """The static metadata of one editable project, enough to "build" and install it."""

    name: str
    version: str
    dependencies: tuple[reqs.Requirement, ...]
    scripts: tuple[tuple[str, str], ...]
    directory: Path
    pyproject_ctime_ns: int
    from_file: bool

    @property
    def norm(self) -> str:
        return reqs.normalize(self.name)

    @property
    def url(self) -> str:
        return self.directory.as_uri()

    @property
    def import_root(self) -> Path:
        """What goes on sys.path: the src layout's src/ if there is one, else the project root."""
        src = self.directory / "src"
        return src if src.is_dir() else self.directory

    def label(self) -> str:
        """How uv names a local build in its messages: `name @ file:///dir`."""
        return f"{self.norm} @ {self.url}"


def load(editable: reqs.Editable) -> Project:
    """Read the project at `editable.path`; exit 1 with uv's build-error wording if we cannot."""
    directory = editable.path
    pyproject = directory / "pyproject.toml"
    if not directory.is_dir():
        raise failure(1, f"Distribution not found at: {directory.as_uri()}")
    if not pyproject.is_file():
        raise failure(1, f"`{directory}` does not appear to be a Python project, as neither "
                         "`pyproject.toml` nor `setup.py` are present in the directory")
    # tomllib costs 5-30 ms to import, so only `pip install -e` pays for it.
    import tomllib

    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise failure(1, f"Failed to build `{directory.as_uri()}`",
                      [f"Failed to parse: `{pyproject}`", str(exc)]) from None
    table = data.get("project")
    if not isinstance(table, dict) or not isinstance(table.get("name"), str):
        raise failure(1, "Failed to parse metadata from built wheel",
                      ["`pyproject.toml` is using the `[project]` table, but the required "
                       "`project.name` field is not set"])
    name: str = table["name"]
    version = table.get("version", "0.0.0")
    dependencies = table.get("dependencies", [])
    scripts = table.get("scripts", {})
    if not (isinstance(version, str) and isinstance(dependencies, list)
            and all(isinstance(d, str) for d in dependencies) and isinstance(scripts, dict)):
        raise failure(1, f"Failed to build `{reqs.normalize(name)} @ {directory.as_uri()}`",
                      ["The build backend returned an error",
                       "`project.version`, `project.dependencies` or `project.scripts` has "
                       "the wrong type"])
    try:
        parsed = tuple(reqs.parse(d) for d in dependencies)
    except ValueError as exc:
        raise failure(1, f"Failed to build `{reqs.normalize(name)} @ {directory.as_uri()}`",
                      [f"Invalid dependency in `{pyproject}`: `{exc}`"]) from None
    return Project(
        name=name,
        version=version,
        dependencies=parsed,
        scripts=tuple((str(k), str(v)) for k, v in scripts.items()),
        directory=directory,
        pyproject_ctime_ns=pyproject.stat().st_ctime_ns,
        from_file=editable.from_file,
    )

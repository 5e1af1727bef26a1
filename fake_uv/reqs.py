"""Requirement strings and requirements files, parsed with a small regex.

`packaging` would cost ~10 ms per start and is not needed to pick a fake version: we only need
the name, the operators and a marker we deliberately do not evaluate (every marker counts as true).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final, NamedTuple

from fake_uv.errors import failure

DEFAULT_VERSION: Final = "1.0.0"

_REQUIREMENT: Final = re.compile(
    r"""^\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)
        \s*(?:\[(?P<extras>[^\]]*)\])?
        \s*(?:@\s*(?P<url>[^;\s]+)\s*|(?P<spec>[^;@]*?))
        \s*(?:;\s*(?P<marker>.*?))?\s*$""",
    re.VERBOSE,
)
_CLAUSE: Final = re.compile(r"\s*(===|==|>=|~=|<=|!=|<|>)\s*([^,;\s()]+)\s*")
# Options a requirements file may carry that only steer where packages come from.
_INDEX_OPTIONS: Final = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links")
_INDEX_FLAGS: Final = ("--no-index", "--pre", "--no-binary", "--only-binary")


class Requirement(NamedTuple):
    """One PEP 508 requirement, as far as fake_uv cares."""

    text: str
    name: str
    specifiers: tuple[tuple[str, str], ...]
    marker: str
    url: str

    @property
    def norm(self) -> str:
        return normalize(self.name)

    @property
    def specifier(self) -> str:
        return ",".join(op + version for op, version in self.specifiers)

    def pinned(self, *operators: str) -> str | None:
        """The version of the first clause using one of `operators`, wildcards dropped."""
        for op, version in self.specifiers:
            if op in operators:
                return version.removesuffix(".*")
        return None


class Editable(NamedTuple):
    """An `-e DIR` request; `from_file` is true for `-e` lines inside a requirements file."""

    path: Path
    from_file: bool


class Requests:
    """Everything one `pip install` call asked for, from the command line and from `-r` files."""

    def __init__(self) -> None:
        self.editables: list[Editable] = []
        self.requirements: list[Requirement] = []
        self.constraints: dict[str, Requirement] = {}

    def add_editable(self, text: str, *, from_file: bool) -> None:
        self.editables.append(Editable(editable_path(text), from_file))

    def add_requirement(self, text: str, origin: str = "") -> None:
        self.requirements.append(_parse_or_exit(text, origin))

    def add_constraint(self, text: str, origin: str = "") -> None:
        requirement = _parse_or_exit(text, origin)
        self.constraints[requirement.norm] = requirement

    def read(self, path: Path, *, constraints: bool = False) -> None:
        """Add the lines of requirements (or constraints) file `path`, following `-r`/`-c`."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise failure(2, f"File not found: `{path}`") from None
        except OSError as exc:
            raise failure(2, f"Failed to read `{path}`", [str(exc)]) from None
        for line in _logical_lines(text):
            self._read_line(line, path, constraints=constraints)

    def _read_line(self, line: str, origin: Path, *, constraints: bool) -> None:
        option, _, value = line.partition(" ")
        if "=" in option and option.startswith("--"):
            option, _, value = line.partition("=")
        value = value.strip()
        # Nested files are relative to the file naming them; `-e` paths are relative to the
        # working directory (checked against uv 0.13.9: `-e ./proj` in sub/r.txt means ./proj).
        if option in ("-r", "--requirement", "--requirements"):
            self.read(origin.parent / value, constraints=constraints)
        elif option in ("-c", "--constraint", "--constraints"):
            self.read(origin.parent / value, constraints=True)
        elif option in ("-e", "--editable"):
            if not constraints:
                self.add_editable(value, from_file=True)
        elif option.startswith("-e") and not option.startswith("--"):
            self.add_editable(line[2:].strip(), from_file=True)
        elif option in _INDEX_OPTIONS or option in _INDEX_FLAGS:
            pass
        elif line.startswith("-"):
            raise failure(2, f"Unsupported option in `{origin}`: `{option}`")
        elif constraints:
            self.add_constraint(line, str(origin))
        else:
            self.add_requirement(line, str(origin))

    def version_for(self, requirement: Requirement) -> str:
        """The fake index's version for `requirement`: an `==` pin wins, then a lower bound."""
        constraint = self.constraints.get(requirement.norm)
        candidates = (requirement, constraint) if constraint else (requirement,)
        for operators in (("==", "==="), (">=", "~=")):
            for source in candidates:
                version = source.pinned(*operators)
                if version:
                    return version
        return DEFAULT_VERSION


def normalize(name: str) -> str:
    """PEP 503 normalisation: `Demo_Skill` and `demo.skill` are both `demo-skill`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(text: str) -> Requirement:
    """Parse a PEP 508 string; raise ValueError if it is not one."""
    match = _REQUIREMENT.match(text)
    if not match:
        raise ValueError(text)
    spec = (match["spec"] or "").strip().removeprefix("(").removesuffix(")")
    clauses = [c for c in spec.split(",") if c.strip()]
    specifiers = []
    for clause in clauses:
        found = _CLAUSE.fullmatch(clause)
        if not found:
            raise ValueError(text)
        specifiers.append((found[1], found[2]))
    return Requirement(text.strip(), match["name"], tuple(specifiers), match["marker"] or "",
                       match["url"] or "")


def editable_path(text: str) -> Path:
    """The normalised absolute directory of an `-e` value (a path, or a file:// URL)."""
    text = re.sub(r"\[[^\]]*\]$", "", text.strip())  # extras on an editable: ignored
    if text.startswith("file://"):
        from urllib.parse import unquote, urlsplit

        text = unquote(urlsplit(text).path)
    # Lexical normalisation (no symlink resolution), so the file:// URL we record is the one
    # the caller passed; that is what "installed as editable of path X" checks compare.
    return Path(os.path.normpath(Path(text).expanduser().absolute()))


def env_names(variable: str) -> frozenset[str]:
    """The normalised names in a comma-separated environment variable."""
    return frozenset(normalize(n.strip()) for n in os.environ.get(variable, "").split(",")
                     if n.strip())


def _parse_or_exit(text: str, origin: str) -> Requirement:
    try:
        return parse(text)
    except ValueError:
        where = f" in `{origin}`" if origin else ""
        raise failure(2, f"Failed to parse requirement{where}: `{text.strip()}`") from None


def _logical_lines(text: str) -> list[str]:
    """Lines with comments removed and backslash continuations joined, blanks dropped."""
    joined = re.sub(r"\\\r?\n", " ", text)
    lines = (re.sub(r"(^|\s)#.*$", "", line).strip() for line in joined.splitlines())
    return [line for line in lines if line]


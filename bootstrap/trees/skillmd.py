"""SKILL.md as the Agent Skills spec defines it: the layout, the front matter, the name rules.

A skill is a directory holding ``SKILL.md``; its name is the directory's name. The front matter
is YAML between a first line ``---`` and the next ``---`` line, parsed by a real YAML parser
(PyYAML's safe loader, reading YAML 1.2 as agents' loaders do: :mod:`bootstrap.trees.yaml12`):
reading it line by line published ``description: |-`` as "|-" and YAML that no agent could load
as valid. What makes a skill unloadable is an error; what the spec only advises against is a
warning (Anthropic's own ``claude-api`` skill has a 1,068-character description: refusing it
would refuse real skills). Each finding names the file, the key and the rule.

PyYAML costs ~20 ms to import: it is imported only when a SKILL.md is actually checked, never
on the warm path (``bootstrap.warm`` answers from a stat fingerprint before any of this).
"""

from __future__ import annotations

import codecs
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bootstrap.errors import SkillError
from bootstrap.primitives.fs import open_regular

SKILL_FILE: Final = "SKILL.md"
MAX_NAME: Final = 64
MAX_DESCRIPTION: Final = 1024
MAX_COMPATIBILITY: Final = 500
KNOWN_KEYS: Final = ("name", "description", "license", "compatibility", "metadata",
                     "allowed-tools")
_STRING_KEYS: Final = ("license", "compatibility", "allowed-tools")
_ALLOWED: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
# Existing trees use "_" and "." inside names: the spec advises against them, agents load them.
_TOLERATED: Final = frozenset("_.")
_MAX_FRONT_MATTER: Final = 64 * 1024
_FENCE: Final = "---"


@dataclass(frozen=True)
class Finding:
    """One broken or advised-against rule: the file, the key (or "front matter") and the rule."""

    file: Path
    key: str
    rule: str

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.rule}"


@dataclass(frozen=True)
class Checked:
    """What checking one SKILL.md found."""

    errors: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()

    @property
    def problem(self) -> str:
        """Every error on one line; "" when the skill is loadable."""
        return "; ".join(map(str, self.errors))


def unsafe_name(name: str) -> str | None:
    """Why ``name`` cannot name a directory we publish or record at all, or None.

    Only what would make the name a path or a hidden entry; the spec's rules are
    :func:`name_findings`' and are checked against the front matter's ``name``.
    """
    if not name:
        return "is empty"
    if name.startswith("."):
        return "starts with a dot"
    if "/" in name or "\\" in name or ".." in name:
        return "contains a path separator or '..'"
    return None


def name_findings(name: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) of a skill name under the spec's rules."""
    errors: list[str] = []
    if not name:
        return ["must not be empty"], []
    if len(name) > MAX_NAME:
        errors.append(f"is longer than {MAX_NAME} characters ({len(name)})")
    if name != name.lower():
        errors.append("must not contain uppercase letters")
    if name.startswith("-") or name.endswith("-"):
        errors.append("must not start or end with a hyphen")
    if "--" in name:
        errors.append("must not contain '--'")
    odd = sorted(set(name.lower()) - _ALLOWED - _TOLERATED)
    if odd:
        errors.append(f"may hold only lowercase letters, digits and hyphens, not {''.join(odd)!r}")
    tolerated = sorted(set(name) & _TOLERATED)
    warnings = [f"contains {' and '.join(map(repr, tolerated))}: the spec allows only lowercase "
                "letters, digits and hyphens"] if tolerated else []
    return [f"invalid skill name {name!r}: {e}" for e in errors], warnings


def _lines(text: str) -> list[str]:
    # One reading of line ends for the fences and the YAML alike: "\r\n", "\n" and a lone
    # "\r" (a lone "\r" after the first fence used to make the front matter "missing").
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _closed(lines: list[str]) -> str | None:
    """The YAML between the first line's fence and the next, or None when it is not closed."""
    for index, line in enumerate(lines[1:], start=1):
        if line.rstrip() == _FENCE:
            return "\n".join(lines[1:index])
    return None


def front_matter_text(text: str) -> str | None:
    """The YAML between the fences, or None when there is no closed front matter."""
    lines = _lines(text)
    return _closed(lines) if lines[0].rstrip() == _FENCE else None


def check_text(skill_md: Path, text: str, dir_name: str, *, whole: bool = True) -> Checked:
    """Check the text of ``skill_md`` (in the directory ``dir_name``) against the spec;
    ``whole`` is false when ``text`` is only the file's first 64 KiB."""
    found = _Findings(skill_md)
    lines = _lines(text)
    if lines[0].rstrip() != _FENCE:
        found.error("front matter", "missing: SKILL.md must start with a '---' line")
        return found.result()
    yaml_text = _closed(lines)
    if yaml_text is None:
        # Past the limit, a closing fence may well follow: "not closed" sent people looking
        # for a fence that was there.
        found.error("front matter", "not closed: no second '---' line" if whole else
                    f"too large: no closing '---' line in its first {_MAX_FRONT_MATTER // 1024}"
                    " KiB, the most a front matter may hold")
        return found.result()
    data = _parse(found, yaml_text)
    if data is not None:
        _check_mapping(found, data, dir_name)
    return found.result()


def check_file(skill_md: Path, dir_name: str) -> Checked:
    """Read ``skill_md`` (its first 64 KiB) and check it; an unreadable file is an error."""
    try:
        # Never blocks: a FIFO put there is refused, not waited on (SKILL.md may be a link).
        with open(open_regular(skill_md, follow=True), "rb") as f:
            head = f.read(_MAX_FRONT_MATTER + 1)  # one byte more tells "all of it" apart
        whole = len(head) <= _MAX_FRONT_MATTER
        # Incremental: a multi-byte character cut by the read limit is not a decoding error
        # (fuzzing found valid files longer than 64 KiB reported as "not UTF-8").
        decoder = codecs.getincrementaldecoder("utf-8")()
        text = decoder.decode(head[:_MAX_FRONT_MATTER], final=whole)
    except UnicodeDecodeError:
        return Checked((Finding(skill_md, "file", "is not UTF-8 text"),))
    except OSError as e:
        return Checked((Finding(skill_md, "file", f"cannot read: {e.strerror or e}"),))
    return check_text(skill_md, text, dir_name, whole=whole)


# Checking a skill costs a YAML parse; ensure's ready gate asks twice per run, and a library
# caller at every kernel start. Only files settled for a while are cached, as the pyproject
# digests are (bootstrap.skills.python_skill): a rewrite within one timestamp tick keeps its stat.
_CHECKED: dict[str, tuple[tuple[int, int, int, int, int], Checked]] = {}
_SETTLED_NS: Final = 2_000_000_000


def checked(path: Path) -> Checked:
    """:func:`check_file` of the skill directory ``path``'s SKILL.md, cached by its stat."""
    skill_md = os.path.join(path, SKILL_FILE)
    try:
        st = os.stat(skill_md)
    except OSError:
        return check_file(Path(skill_md), path.name)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    cached = _CHECKED.get(skill_md)
    if cached is not None and cached[0] == key:
        return cached[1]
    result = check_file(Path(skill_md), path.name)
    if time.time_ns() - st.st_ctime_ns > _SETTLED_NS:
        _CHECKED[skill_md] = (key, result)
    return result


def check_layout(path: Path) -> str:
    """A directory that can be a skill: a usable name and a SKILL.md file; returns the name.

    What the spec says of SKILL.md's content is :func:`checked`'s: ``ensure`` reports a skill
    that breaks it as a failed skill instead of refusing the whole config.
    """
    name = path.name
    problem = unsafe_name(name)
    if problem:
        raise SkillError(f"{path}: invalid skill name {name!r}: {problem}")
    skill_md = path / SKILL_FILE
    try:
        is_file = skill_md.is_file()
    except OSError as e:  # pathlib swallows ENOENT, not EACCES or ENAMETOOLONG
        raise SkillError(f"{path}: cannot read {SKILL_FILE}: {e.strerror}") from None
    if not is_file:
        from bootstrap.primitives.fs import special_kind

        kind = special_kind(skill_md)
        raise SkillError(f"{skill_md}: is a {kind}, not a file: not a skill" if kind
                         else f"{path}: not a skill: no {SKILL_FILE}")
    return name


def check_skill_dir(path: Path) -> str:
    """Validate a skill directory as publish and push need it: the layout and SKILL.md under
    the spec. An error is a SkillError naming the file, the key and the rule; each warning is
    logged. Returns the skill's name."""
    name = check_layout(path)
    result = checked(path)
    if result.errors:
        raise SkillError("\n".join(map(str, result.errors)))
    log_warnings(result)
    return name


def log_warnings(result: Checked) -> None:
    if not result.warnings:
        return
    from bootstrap.primitives import log
    for w in result.warnings:
        log.warning("SKILL.md breaks an advisory rule of the Agent Skills spec; agents still "
                    "load it", file=str(w.file), key=w.key, rule=w.rule)


def report(named: Iterable[tuple[str, Checked]]) -> dict[str, str]:
    """Log what the spec says of each skill (name, its check); return the ones no agent can
    load, name -> the errors: ``ensure`` reports them as failed skills and goes on."""
    failed: dict[str, str] = {}
    for name, result in named:
        log_warnings(result)
        if result.errors:
            # The warm path repeats this warning, word for word.
            from bootstrap.primitives import log
            from bootstrap.warm_failures import INVALID, INVALID_HINT
            log.warning(INVALID, skill=name, error=result.problem, hint=INVALID_HINT)
            failed[name] = result.problem
    return failed


class _Findings:
    def __init__(self, file: Path) -> None:
        self.file = file
        self.errors: list[Finding] = []
        self.warnings: list[Finding] = []

    def error(self, key: str, rule: str) -> None:
        self.errors.append(Finding(self.file, key, rule))

    def warn(self, key: str, rule: str) -> None:
        self.warnings.append(Finding(self.file, key, rule))

    def result(self) -> Checked:
        return Checked(tuple(self.errors), tuple(self.warnings))


def _parse(found: _Findings, yaml_text: str) -> dict[Any, Any] | None:
    import yaml

    from bootstrap.trees import yaml12

    try:
        data = yaml12.load(yaml_text)
    except yaml12.DuplicateKeyError as e:
        # The file's lines: the YAML starts on line 2.
        found.error((str(e.key) or repr(e.key))[:80],
                    f"appears twice (lines {e.first_line + 2} and {e.line + 2}): "
                    "each key of a YAML mapping must be unique")
        return None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 2})" if mark is not None else ""
        found.error("front matter", f"not valid YAML: {e.problem or e.context}{where}")
        return None
    # ValueError: an explicit !!timestamp 2024-02-30, an integer of 5,000 digits;
    # RecursionError: nesting deeper than Python's stack. YAML that no agent's parser loads.
    except (yaml.YAMLError, ValueError, RecursionError, OverflowError) as e:
        found.error("front matter", f"not valid YAML: {str(e).splitlines()[0] if str(e) else e!r}")
        return None
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        found.error("front matter", f"must be a mapping of keys to values, not {kind}")
        return None
    return data


def _check_mapping(found: _Findings, data: dict[Any, Any], dir_name: str) -> None:
    _check_name(found, data, dir_name)
    description = data.get("description")
    if "description" not in data:
        found.error("description", "is required")
    elif not isinstance(description, str):
        found.error("description", f"must be a string, not {_kind(description)}")
    elif not description.strip():
        found.error("description", "must not be empty")
    elif len(description) > MAX_DESCRIPTION:
        found.warn("description", f"is longer than {MAX_DESCRIPTION} characters "
                                  f"({len(description)})")
    for key in _STRING_KEYS:
        if key in data and not isinstance(data[key], str):
            found.error(key, f"must be a string, not {_kind(data[key])}")
    compatibility = data.get("compatibility")
    if isinstance(compatibility, str) and not compatibility.strip():
        found.error("compatibility", "must not be empty (the spec: 1 to 500 characters)")
    elif isinstance(compatibility, str) and len(compatibility) > MAX_COMPATIBILITY:
        found.warn("compatibility", f"is longer than {MAX_COMPATIBILITY} characters "
                                    f"({len(compatibility)})")
    if "metadata" in data:
        _check_metadata(found, data["metadata"])
    for key in data:
        if key not in KNOWN_KEYS:
            # repr: an empty key ('': x) would make a finding with no key at all
            found.warn(str(key)[:80] or repr(key), "is not a key the spec defines "
                                                   f"({', '.join(KNOWN_KEYS)})")


def _check_name(found: _Findings, data: dict[Any, Any], dir_name: str) -> None:
    name = data.get("name")
    if "name" not in data:
        found.error("name", "is required")
        return
    if not isinstance(name, str):
        found.error("name", f"must be a string, not {_kind(name)}")
        return
    errors, warnings = name_findings(name)
    for rule in errors:
        found.error("name", rule)
    for rule in warnings:
        found.warn("name", rule)
    if name and name != dir_name:
        found.error("name", f"{name[:80]!r} differs from the directory name {dir_name!r}")


def _check_metadata(found: _Findings, metadata: object) -> None:
    if not isinstance(metadata, dict):
        found.error("metadata", f"must be a mapping of strings to strings, not {_kind(metadata)}")
        return
    for key, value in metadata.items():
        if not isinstance(key, str):
            found.error("metadata", f"keys must be strings, not {_kind(key)} ({key!r:.40})")
        elif not isinstance(value, str):
            found.error(f"metadata.{key[:80]}", f"must be a string, not {_kind(value)} "
                        "(quote it)")


def _kind(value: object) -> str:
    if value is None:
        return "empty"
    names = {bool: "a boolean", int: "a number", float: "a number", list: "a list",
             dict: "a mapping"}
    return names.get(type(value), f"a {type(value).__name__}")

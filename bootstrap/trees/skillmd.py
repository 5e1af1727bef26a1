"""SKILL.md: the front matter we read and the skill-name rules (Agent Skills format).

A skill's name is its directory's name. The front matter is the block between a first line
``---`` and the next ``---``; we read its top-level ``key: value`` lines only, which is all the
format needs from us (``name``, ``description``) and avoids a YAML dependency.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path
from typing import Final

from bootstrap.errors import SkillError

SKILL_FILE: Final = "SKILL.md"
MAX_NAME: Final = 64
# Agent Skills: lowercase letters, digits and single hyphens inside. Existing trees also use
# "_" and "." inside a name, so we accept those too; a leading dot, "/" and ".." never.
_NAME_RE: Final = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?")
_MAX_FRONT_MATTER: Final = 64 * 1024


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid skill name, or None when it is."""
    if not name:
        return "is empty"
    if len(name) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    if name.startswith("."):
        return "starts with a dot"
    if "/" in name or "\\" in name or ".." in name:
        return "contains a path separator or '..'"
    if "--" in name:
        return "contains a double hyphen"
    if not _NAME_RE.fullmatch(name):
        return "must be lowercase letters, digits and single hyphens (also '_' or '.' inside)"
    return None


def parse_front_matter(text: str) -> dict[str, str]:
    """The top-level ``key: value`` pairs of the front matter; {} when there is none."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    out: dict[str, str] = {}
    for line in lines[1:]:
        if line.strip() == "---":
            return out
        if not line or line[0] in " \t#" or ":" not in line:
            continue
        key, _, value = line.partition(":")
        out[key.strip()] = _unquote(value.strip())
    # No closing fence: not front matter at all, just a document starting with a rule.
    return {}


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def read_front_matter(skill_md: Path) -> dict[str, str]:
    """Front matter of a SKILL.md; an unreadable or binary file is a SkillError naming it."""
    try:
        with skill_md.open("rb") as f:
            head = f.read(_MAX_FRONT_MATTER)
        # Incremental: a multi-byte character cut by the read limit is not a decoding error
        # (fuzzing found valid files longer than 64 KiB reported as "not UTF-8").
        decoder = codecs.getincrementaldecoder("utf-8")()
        return parse_front_matter(decoder.decode(head, final=len(head) < _MAX_FRONT_MATTER))
    except UnicodeDecodeError:
        raise SkillError(f"{skill_md}: SKILL.md is not UTF-8 text") from None
    except OSError as e:
        raise SkillError(f"{skill_md}: cannot read SKILL.md: {e.strerror}") from None


def check_skill_dir(path: Path) -> str:
    """Validate a skill directory's name and SKILL.md; return the skill's name."""
    name = path.name
    problem = name_problem(name)
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
    declared = read_front_matter(skill_md).get("name")
    if declared is not None and declared != name:
        raise SkillError(
            f"{skill_md}: front matter name {declared!r} differs from the directory name {name!r}"
        )
    return name

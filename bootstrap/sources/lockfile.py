"""``skills-lock.toml``: each git-sourced skill pinned to a commit and a tree sha256.

Written atomically (the one atomic-write primitive), entries sorted, no timestamps: the same
sources give the same bytes, so the file diffs cleanly in review. Read as an untrusted file
(no symlink followed, bounded, every field validated): a bad one is an error naming the file
and the entry, exit 2, never a traceback. Only display URLs are written (no credentials).

    version = 1
    [[skill]]
    name = "pdf"
    git = "https://github.com/anthropics/skills"
    branch = "main"
    subdirectory = "skills/*"
    path = "skills/pdf"
    commit = "<40 hex>"
    sha256 = "<64 hex>"
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bootstrap.errors import ConfigError
from bootstrap.primitives.atomic import write_atomic
from bootstrap.primitives.fs import read_state_file
from bootstrap.sources.spec import REFS, GitSource
from bootstrap.trees.skillmd import unsafe_name

VERSION: Final = 1
_LIMIT: Final = 8 * 1024 * 1024
_HEX40: Final = re.compile(r"^[0-9a-f]{40}$")
_HEX64: Final = re.compile(r"^[0-9a-f]{64}$")
_KEYS: Final = ("name", "git", *REFS, "subdirectory", "path", "commit", "sha256")


@dataclass(frozen=True)
class LockedSkill:
    """One ``[[skill]]`` entry; ``ref_kind``/``ref`` and ``subdirectory`` as configured."""

    name: str
    git: str
    ref_kind: str | None
    ref: str | None
    subdirectory: str | None
    path: str  # inside the repository; "" its root (written ".")
    commit: str
    sha256: str

    @property
    def source_key(self) -> tuple[str, str | None, str | None, str | None]:
        return (self.git, self.ref_kind, self.ref, self.subdirectory)


def source_key(source: GitSource) -> tuple[str, str | None, str | None, str | None]:
    """What a lock entry must match to belong to ``source``."""
    return (source.display_url, source.ref_kind, source.ref, source.subdirectory)


def unclaimed(sources: tuple[GitSource, ...], entries: list[LockedSkill]) -> list[LockedSkill]:
    """The entries no configured source matches exactly (a source removed, or edited)."""
    keys = {source_key(s) for s in sources}
    return [e for e in entries if e.source_key not in keys]


def earlier(source: GitSource, unclaimed: list[LockedSkill]) -> list[LockedSkill]:
    """Of ``unclaimed``, those ``source`` held before its entry was edited: the same URL (its
    ref or subdirectory changed: a typo'd branch), or the same ref and subdirectory (its URL
    changed: a typo'd host). Kept while ``source`` fails, so a typo never uninstalls."""
    where = (source.ref_kind, source.ref, source.subdirectory)
    return [e for e in unclaimed
            if e.git == source.display_url or (e.ref_kind, e.ref, e.subdirectory) == where]


def read(path: Path) -> list[LockedSkill]:
    """The entries of the lock at ``path``; [] if there is none."""
    try:
        data = read_state_file(path, _LIMIT)
    except (FileNotFoundError, NotADirectoryError):  # no lock yet (or none can be there)
        return []
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the skills lock: {e.strerror or e}") from None
    import tomllib

    try:
        table = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: not a valid skills lock ({e}); fix it, or delete it and "
                          "run `kernel-bootstrap lock`") from None
    if table.get("version") != VERSION:
        raise ConfigError(f"{path}: skills lock version {table.get('version')!r} is not "
                          f"{VERSION}; delete it and run `kernel-bootstrap lock`")
    entries = table.get("skill", [])
    if not isinstance(entries, list) or set(table) - {"version", "skill"}:
        raise ConfigError(f"{path}: a skills lock holds `version` and [[skill]] tables only")
    return [_entry(path, i, e) for i, e in enumerate(entries)]


def _entry(path: Path, index: int, raw: Any) -> LockedSkill:
    where = f"{path}: skill[{index}]"
    if not isinstance(raw, dict) or set(raw) - set(_KEYS):
        raise ConfigError(f"{where}: unexpected content (keys: {', '.join(_KEYS)})")
    if not all(isinstance(v, str) for v in raw.values()):
        raise ConfigError(f"{where}: every value must be a string")
    for key in ("name", "git", "path", "commit", "sha256"):
        if key not in raw:
            raise ConfigError(f"{where}: key {key!r} is missing")
    refs = [k for k in REFS if k in raw]
    if len(refs) > 1:
        raise ConfigError(f"{where}: at most one of branch, tag and rev")
    if not _HEX40.match(raw["commit"]) or not _HEX64.match(raw["sha256"]):
        raise ConfigError(f"{where}: `commit` must be 40 and `sha256` 64 lowercase hex digits")
    problem = unsafe_name(raw["name"])  # it names a directory in the cache
    if problem:
        raise ConfigError(f"{where}: invalid skill name {raw['name']!r}: {problem}")
    if raw["path"].startswith("/") or ".." in raw["path"].split("/"):
        raise ConfigError(f"{where}: `path` must be inside the repository")
    inside = "" if raw["path"] in (".", "") else raw["path"]  # "." is the repository's root
    return LockedSkill(raw["name"], raw["git"], refs[0] if refs else None,
                       raw[refs[0]] if refs else None, raw.get("subdirectory"), inside,
                       raw["commit"], raw["sha256"])


def render(entries: list[LockedSkill]) -> str:
    """The file's text: entries sorted by name, then source; keys in one order."""
    lines = [f"version = {VERSION}"]
    for e in sorted(entries, key=lambda e: (e.name, e.git, e.path, e.commit)):
        lines += ["", "[[skill]]"]
        fields: list[tuple[str, str | None]] = [
            ("name", e.name), ("git", e.git), (e.ref_kind or "", e.ref),
            ("subdirectory", e.subdirectory), ("path", e.path or "."), ("commit", e.commit),
            ("sha256", e.sha256)]
        lines += [f"{k} = {_string(v)}" for k, v in fields if k and v is not None]
    return "\n".join(lines) + "\n"


def _string(value: str) -> str:
    # A JSON string is a TOML basic string when it is not forced to ASCII (TOML has no
    # surrogate-pair escapes).
    # surrogate-pair escapes); DEL, which JSON leaves raw, TOML wants escaped.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def write(path: Path, entries: list[LockedSkill]) -> bool:
    """Replace the lock with ``entries`` if that changes its bytes; whether it did."""
    text = render(entries).encode("utf-8")
    try:
        if read_state_file(path, _LIMIT) == text:
            return False
    except OSError:
        pass
    write_atomic(path, text)
    return True

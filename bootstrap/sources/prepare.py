"""What ``ensure`` does with git sources before the engine runs: lock, fetch, materialise, check.

For each configured source: the lock's entries for it are used as they are (never resolved
again, unless ``upgrade``); a source the lock lacks is resolved (one ``git ls-remote``) and
added. Every tree used is checked against its sha256 (:mod:`materialise`), fetched first if
the cache lacks it (offline: that skill fails at once, "not in the cache and offline"). A
failure fails that source's skills only: they are reported as failed skills and left out, the
others go on. Entries whose source is no longer configured are dropped; the lock is written
only if its bytes change. ``locked``: the lock must already match the sources exactly, or exit
2 naming the first mismatch, with nothing fetched or written.

Failures are not recorded for back-off (they are cheap: an offline one needs no network, and
the next start tries again); instead the warm fingerprint is forgotten so the next start does
not answer "ready" without them (``bootstrap.engine.sources``, which also turns the outcome
into the config's skills: this family stands below the config's layer and knows no Config).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap.errors import BootstrapError, ConfigError, SkillError
from bootstrap.primitives import log
from bootstrap.sources import fetch, lockfile, materialise
from bootstrap.sources.cached import describe
from bootstrap.sources.lockfile import LockedSkill, source_key
from bootstrap.sources.resolve import resolve
from bootstrap.sources.spec import GitSource
from bootstrap.trees.skillmd import unsafe_name


@dataclass(frozen=True)
class GitSkill:
    """A git-sourced skill ready to use: its checked tree, and how messages name its source."""

    name: str
    path: Path
    source: str


@dataclass(frozen=True)
class Prepared:
    """The git skills to use; ``failed``: name -> why, as ensure reports failed skills."""

    skills: tuple[GitSkill, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)


def prepare(sources: tuple[GitSource, ...], lock: Path, *, local: Mapping[str, Path],
            offline: bool, upgrade: bool = False, locked: bool = False) -> Prepared:
    """See the module docstring; ``local``: the local skills (name -> path), whose names the
    git ones must not take."""
    entries = lockfile.read(lock)
    if locked:
        _require_match(sources, entries, lock)
    keep: list[LockedSkill] = []
    skills: list[GitSkill] = []
    failed: dict[str, str] = {}
    for source in sources:
        held = [e for e in entries if e.source_key == source_key(source)]
        try:
            used = held if held and not upgrade else _resolved(source, offline)
        except (BootstrapError, OSError) as e:
            keep += held  # a failed resolution forgets nothing the lock knew
            failed[held[0].name if held else f"skills[{source.index}]"] = _say(e)
            continue
        keep += used
        for entry in used:
            try:
                skills.append(GitSkill(entry.name, _tree(source, entry, offline),
                                       describe(entry)))
            except (BootstrapError, OSError) as e:
                failed[entry.name] = _say(e)
    _check_names(local, skills, lock)
    if not locked:
        _write(lock, keep)
    return Prepared(tuple(skills), failed)


def _write(lock: Path, entries: list[LockedSkill]) -> None:
    """The lock, if changed. A config directory mounted read-only must not stop the kernel:
    the skills are installed all the same, and the warning says they are not pinned."""
    try:
        if lockfile.write(lock, entries):
            log.info("skills lock written", path=str(lock), skills=len(entries))
    except OSError as e:
        log.warning(f"cannot write the skills lock {lock} ({e.strerror or e}); the git "
                    "sources are used but not pinned: set `skills-lock` to a writable path",
                    path=str(lock))


def is_git(path: Path) -> bool:
    """Whether ``path`` is a materialised tree (a git skill's, not a local one)."""
    return path.is_relative_to(materialise.trees_root())


def _resolved(source: GitSource, offline: bool) -> list[LockedSkill]:
    """New lock entries for ``source``: its ref resolved now, its skills found in the commit."""
    commit = resolve(source, offline=offline)
    with fetch.repository(source, offline=offline) as repo:
        if not fetch.has_commit(repo, commit):
            fetch.fetch_commit(repo, source, commit)
        paths = fetch.skill_paths(repo, commit, source)
        if not paths:
            raise BootstrapError(f"{source.describe}: no skill (a directory with SKILL.md) at "
                                 f"{source.subdirectory or 'the repository root'} in commit "
                                 f"{commit}")
        out = []
        for path in paths:
            name = path.rsplit("/", 1)[-1] if path else source.repo_name
            problem = unsafe_name(name)
            if problem:
                raise SkillError(f"{source.describe}: {path or 'the repository root'}: "
                                 f"invalid skill name {name!r}: {problem}")
            _, sha = _materialised(repo, source, commit, path, name, None, offline)
            out.append(LockedSkill(name, source.display_url, source.ref_kind, source.ref,
                                   source.subdirectory, path, commit, sha))
    return out


def _tree(source: GitSource, entry: LockedSkill, offline: bool) -> Path:
    """The checked tree of a lock entry: the cache's, or fetched and materialised now."""
    found = materialise.checked(entry.sha256, entry.name)
    if found is not None:
        return found
    with fetch.repository(source, offline=offline, commit=entry.commit) as repo:
        path, _ = _materialised(repo, source, entry.commit, entry.path, entry.name,
                                entry.sha256, offline)
    return path


def _materialised(repo: Path, source: GitSource, commit: str, path: str, name: str,
                  expected: str | None, offline: bool) -> tuple[Path, str]:
    """Under the repository's lock: what the tree needs fetched (if allowed), then the tree."""
    absent = f"{source.display_url}@{commit}: not in the cache and offline"
    if not fetch.has_commit(repo, commit):
        if offline:
            raise fetch.NotCached(absent)
        fetch.fetch_commit(repo, source, commit)
    missing = fetch.missing_blobs(repo, commit, path)
    if missing:
        if offline:
            raise fetch.NotCached(absent)
        fetch.fetch_blobs(repo, source, missing)
    return materialise.materialise(repo, commit, path, name, expected, source.describe)


def _require_match(sources: tuple[GitSource, ...], entries: list[LockedSkill],
                   lock: Path) -> None:
    """``--locked``: every source in the lock, every entry a source's; else exit 2."""
    keys = {source_key(s) for s in sources}
    held = {e.source_key for e in entries}
    for source in sources:
        if source_key(source) not in held:
            raise ConfigError(f"{lock}: skills[{source.index}] ({source.describe}) is not in "
                              "the skills lock; run `kernel-bootstrap lock` (nothing changed)")
    for entry in entries:
        if entry.source_key not in keys:
            raise ConfigError(f"{lock}: skill {entry.name!r} ({entry.git}) is locked but no "
                              "longer configured; run `kernel-bootstrap lock` (nothing changed)")


def _check_names(local: Mapping[str, Path], git: list[GitSkill], lock: Path) -> None:
    seen = {name: str(path) for name, path in local.items()}
    for skill in git:
        other = seen.setdefault(skill.name, skill.source)
        if other != skill.source:
            raise ConfigError(f"two skills named {skill.name!r}: {other} and {skill.source} "
                              f"(the git sources locked in {lock})")


def _say(e: BaseException) -> str:
    return str(e) if isinstance(e, BootstrapError) else f"{e.__class__.__name__}: {e}"

"""What ``ensure`` does with git sources before the engine runs: lock, fetch, materialise, check.

For each configured source: the lock's entries for it are used as they are (never resolved
again, unless ``upgrade``); a source the lock lacks is resolved (one ``git ls-remote``) and
added. Every tree used is checked against its sha256 (:mod:`materialise`), fetched first if
the cache lacks it (offline: that skill fails at once, "not in the cache and offline"); the
trees of one source and commit are fetched and checked out together (:mod:`batch`). A skill
that fails (its tree escapes, its name is unsafe, its files cannot be fetched) fails alone,
named: the source's other skills are installed and locked. A source that cannot be resolved or
fetched (a typo'd branch, a host down, a refused login) keeps what the lock held for it, even
under its entry as it was before an edit (:func:`lockfile.earlier`): those skills are used from
their locked trees in the cache (offline: the source just failed, no second wait on it), their
entries stay, and one failure names the source (``skills[N]``, its URL without credentials)
and them. Entries whose source is no longer configured are dropped (and, with ``upgrade``,
those a failed source held before an edit); the lock is written only if its bytes change.
``locked``: the lock must already match the sources exactly, or exit 2 naming the first
mismatch, with nothing fetched or written.

Failures are not recorded for back-off (they are cheap: an offline one needs no network, and
the next start tries again); instead the warm fingerprint is forgotten so the next start does
not answer "ready" without them (``bootstrap.engine.sources``, which also turns the outcome
into the config's skills: this family stands below the config's layer and knows no Config).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from bootstrap.errors import BootstrapError, ConfigError
from bootstrap.primitives import log
from bootstrap.sources import lockfile, materialise
from bootstrap.sources.cached import describe
from bootstrap.sources.lockfile import LockedSkill, source_key
from bootstrap.sources.paths import trees_root
from bootstrap.sources.spec import GitSource
from bootstrap.trees.skillmd import unsafe_name

# Fetching (batch, fetch, resolve: git, its transport) is imported only when a tree is made:
# a start whose trees are all locked and cached runs no git and imports none of it.
if TYPE_CHECKING:
    from bootstrap.sources.batch import Outcome


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
    unclaimed = lockfile.unclaimed(sources, entries)
    for source in sources:
        held = [e for e in entries if e.source_key == source_key(source)]
        try:
            used, bad = (held, {}) if held and not upgrade else _resolved(source, offline)
        except (BootstrapError, OSError) as e:
            # A failed source forgets nothing the lock knew: a typo must never uninstall.
            kept = held + ([] if upgrade else lockfile.earlier(source, unclaimed))
            unclaimed = [u for u in unclaimed if u not in kept]
            keep += kept
            skills += _kept(source, kept, e, failed)
            continue
        keep += used
        failed.update(bad)
        skills += _trees(source, used, offline, failed)
    _check_names(local, skills, lock)
    if not locked:
        _write(lock, keep)
    return Prepared(tuple(skills), failed)


def _kept(source: GitSource, kept: list[LockedSkill], error: BaseException,
          failed: dict[str, str]) -> list[GitSkill]:
    """The skills a failed ``source`` keeps from the lock, from the cache alone; the failure,
    naming the source and them, added to ``failed``."""
    names = ", ".join(sorted(e.name for e in kept))
    failed[f"skills[{source.index}]"] = _say(error) + (f"\n  kept as locked: {names}"
                                                        if names else "")
    return _trees(source, kept, True, failed)


def _trees(source: GitSource, used: list[LockedSkill], offline: bool,
           failed: dict[str, str]) -> list[GitSkill]:
    """The checked tree of each entry; one that fails is added to ``failed``, by name."""
    out = []
    for entry, tree in zip(used, _checked(source, used, offline), strict=True):
        if isinstance(tree, Path):
            out.append(GitSkill(entry.name, tree, describe(entry)))
        else:
            failed[entry.name] = _say(tree)
    return out


def _checked(source: GitSource, used: list[LockedSkill],
             offline: bool) -> list[Path | BootstrapError | OSError]:
    """Each entry's checked tree, or why not: the cache's, or made now, those of one
    repository and commit together (:mod:`batch`: one fetch, one checkout)."""
    out = [_cached(_as_locked(source, e).cache_key, e) for e in used]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, entry in enumerate(used):
        if out[i] is None:
            groups.setdefault((_as_locked(source, entry).cache_key, entry.commit), []).append(i)
    for (_, commit), indexes in groups.items():
        made = _made(_as_locked(source, used[indexes[0]]), commit, [used[i] for i in indexes],
                     offline)
        for i, tree in zip(indexes, made, strict=True):
            out[i] = tree[0] if isinstance(tree, tuple) else tree
    return [tree for tree in out if tree is not None]


def _cached(key: str, entry: LockedSkill) -> Path | BootstrapError | OSError | None:
    """The cache's tree, if it is unchanged and was checked out from the entry's commit in the
    repository ``key`` (:func:`materialise.checked`); None: it is to be made."""
    try:
        return materialise.checked(entry.sha256, entry.name, (key, entry.commit, entry.path))
    except (BootstrapError, OSError) as e:
        return e


def _made(source: GitSource, commit: str, entries: list[LockedSkill],
          offline: bool) -> list[Outcome]:
    """The trees of ``entries`` (of ``commit``) made in one batch; what fails the batch (the
    fetch, the repository) fails each of them."""
    from bootstrap.sources import batch, fetch

    try:
        with fetch.repository(source, offline=offline, commit=commit) as repo:
            batch.ensure_commit(repo, source, commit, offline=offline)
            return batch.trees(repo, source, commit,
                               [(e.name, e.path, e.sha256) for e in entries], offline=offline)
    except (BootstrapError, OSError) as e:
        return [e] * len(entries)


def _as_locked(source: GitSource, entry: LockedSkill) -> GitSource:
    """The source as ``entry`` was locked for (an edited source keeps its earlier entries):
    its cache repository and how messages name it. Credentials only from the config."""
    if entry.source_key == source_key(source):
        return source
    url = source.url if entry.git == source.display_url else entry.git
    # replace: the config's git-timeout and git-safe-directories stay
    return replace(source, url=url, ref_kind=entry.ref_kind, ref=entry.ref,
                   subdirectory=entry.subdirectory)


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
    return path.is_relative_to(trees_root())


def _resolved(source: GitSource,
              offline: bool) -> tuple[list[LockedSkill], dict[str, str]]:
    """New lock entries for ``source``: its ref resolved now, its skills found in the commit;
    and those of its skills that failed (name -> why): one bad skill fails only itself."""
    from bootstrap.sources import batch, fetch
    from bootstrap.sources.resolve import resolve

    commit = resolve(source, offline=offline)
    failed: dict[str, str] = {}
    with fetch.repository(source, offline=offline) as repo:
        batch.ensure_commit(repo, source, commit, offline=offline)
        listing = fetch.list_tree(repo, commit, [fetch.glob_root(source)])
        paths = fetch.skill_paths(listing, source)
        if not paths:
            raise BootstrapError(f"{source.describe}: no skill (a directory with SKILL.md) at "
                                 f"{source.subdirectory or 'the repository root'} in commit "
                                 f"{commit}")
        named = []
        for path in paths:
            name = path.rsplit("/", 1)[-1] if path else source.repo_name
            problem = unsafe_name(name)
            if problem:
                failed[name] = (f"{source.describe}: {path or 'the repository root'}: "
                                f"invalid skill name {name!r}: {problem}")
            else:
                named.append((name, path))
        made = batch.trees(repo, source, commit, [(n, p, None) for n, p in named],
                           offline=offline, listing=listing)
    out = []
    for (name, path), got in zip(named, made, strict=True):
        if isinstance(got, tuple):
            out.append(LockedSkill(name, source.display_url, source.ref_kind, source.ref,
                                   source.subdirectory, path, commit, got[1]))
        else:
            failed[name] = _say(got)
    return out, failed


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

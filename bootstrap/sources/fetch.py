"""The cache's bare partial clones: one per URL, holding only the commits and blobs we used.

``<user cache>/git/repos/<sha256(display url)[:32]>/`` is a bare repository made a partial
clone by hand (``extensions.partialClone``, filter ``blob:none``): a fetch brings one commit
and its trees (``--depth=1``), never a blob; then the blobs under the skill's path alone are
fetched by id in one request, as git's own lazy fetch does, so a repository with a 1 GB blob
elsewhere costs its trees and the skill's bytes. Which blobs are missing is asked with
``rev-list --missing=print``, which never fetches (``cat-file`` would, one blob at a time).

Every step runs under the repository's own lock (the project's lock primitive), and starts by
removing what a killed git left: its ``*.lock`` files (``shallow.lock`` would fail every later
fetch) and a half-made repository (made beside, then renamed into place).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from bootstrap import warm
from bootstrap.errors import BootstrapError
from bootstrap.places import make_dir
from bootstrap.primitives import lock, log
from bootstrap.primitives.fs import remove_quietly
from bootstrap.sources import git
from bootstrap.sources.spec import GitSource

SKILL_FILE: Final = "SKILL.md"
# Blob ids per fetch command line: far below any ARG_MAX, and one round trip for a skill.
_BATCH: Final = 2000
LOCK_TIMEOUT: Final = 600.0


class NotCached(BootstrapError):
    """Offline, and the cache lacks what a locked source needs."""


def root() -> Path:
    return Path(warm.cache_dir()) / "git"


def repo_path(source: GitSource) -> Path:
    return root() / "repos" / source.cache_key


@contextlib.contextmanager
def repository(source: GitSource, *, offline: bool, commit: str = "") -> Iterator[Path]:
    """The source's cache repository, made if missing, held under its lock while in use
    (``commit``: what it is wanted for, named when offline finds no repository)."""
    repos = make_dir(root() / "repos")
    # A URL's credentials live in each repository's config (git needs the URL there for its
    # fetches): nobody else may read them.
    os.chmod(repos, 0o700)
    path = repos / source.cache_key
    name = f"the git cache of {source.display_url}"
    with lock.hold(repos / f"{source.cache_key}.lock", LOCK_TIMEOUT, "git fetch", name=name,
                   advice="If {who} is stuck, stop it ({stop})."):
        if not path.is_dir():
            if offline:
                at = f"@{commit}" if commit else ""
                raise NotCached(f"{source.display_url}{at}: not in the cache and offline")
            _create(source, path)
        _remove_stale_locks(path)
        if not offline:
            _set_url(path, source)
        yield path


def _create(source: GitSource, path: Path) -> None:
    """``git init --bare`` beside, configured as a partial clone, then renamed into place: a
    kill half way leaves only the side directory, removed at the next try."""
    side = path.with_name(path.name + ".init")
    remove_quietly(side)
    git.run(["init", "--quiet", "--bare", str(side)], what="cannot create a git cache")
    for key, value in (("core.repositoryformatversion", "1"),
                       ("extensions.partialClone", "origin"),
                       ("remote.origin.url", source.url),
                       ("remote.origin.promisor", "true"),
                       ("remote.origin.partialclonefilter", "blob:none")):
        git.run(["config", key, value], repo=side, url=source.url,
                what="cannot configure a git cache")
    os.rename(side, path)


def _set_url(path: Path, source: GitSource) -> None:
    # The same display URL may come with other credentials than last time.
    git.run(["config", "remote.origin.url", source.url], repo=path, url=source.url,
            what="cannot configure a git cache")


def _remove_stale_locks(path: Path) -> None:
    """Under our lock no other git works here: a ``*.lock`` is a killed git's leftover."""
    for directory, dirs, files in os.walk(path):
        if directory == str(path) and "objects" in dirs:
            dirs.remove("objects")  # packs and loose objects: git makes no *.lock there
        for name in files:
            if name.endswith(".lock"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))


def has_commit(repo: Path, commit: str) -> bool:
    """Whether the commit (and so its trees) is here; asked without any lazy fetch."""
    result = git.run(["rev-list", "--missing=print", "--no-walk", "-n1", commit, "--"],
                     repo=repo, offline=True, check=False)
    return result.returncode == 0 and result.stdout.strip() == commit


def fetch_commit(repo: Path, source: GitSource, commit: str) -> None:
    """The commit and its trees, no blob, no history, no tags."""
    log.info("fetching a git source", git=source.display_url, commit=commit)
    git.run(["fetch", "--quiet", "--filter=blob:none", "--depth=1", "--no-tags",
             "--no-write-fetch-head", "--recurse-submodules=no", "origin", commit],
            repo=repo, url=source.url, allow_file=source.scheme == "file",
            what=f"cannot fetch {source.display_url} commit {commit}")


def skill_paths(repo: Path, commit: str, source: GitSource) -> list[str]:
    """The directories of ``commit`` that are this source's skills: the subdirectory (or the
    root) itself, or the glob's matches that hold SKILL.md, sorted."""
    sub = source.subdirectory
    if sub is not None and not any(c in sub for c in "*?["):
        pattern_hit = _has_skill_md(repo, commit, sub)
        return [sub] if pattern_hit else []
    if sub is None:
        return [""] if _has_skill_md(repo, commit, "") else []
    listed = git.run(["ls-tree", "-r", "-z", "--name-only", "--full-tree", commit],
                     repo=repo, offline=True, what="cannot list a cached commit").stdout
    parts = sub.split("/")
    found = set()
    for name in listed.split("\0"):
        head, _, base = name.rpartition("/")
        if base == SKILL_FILE and head and _match(head.split("/"), parts):
            found.add(head)
    return sorted(found)


def _match(names: list[str], parts: list[str]) -> bool:
    # As glob does: one pattern part per path part, ``*`` never crossing a ``/``.
    return len(names) == len(parts) and all(fnmatch.fnmatchcase(n, p)
                                            for n, p in zip(names, parts, strict=True))


def _has_skill_md(repo: Path, commit: str, path: str) -> bool:
    spec = f"{path}/{SKILL_FILE}" if path else SKILL_FILE
    out = git.run(["ls-tree", "--full-tree", commit, "--", spec], repo=repo, offline=True,
                  what="cannot list a cached commit").stdout
    return out.startswith("100")  # a file (644 or 755), not a link or a directory


def missing_blobs(repo: Path, commit: str, path: str) -> list[str]:
    """The ids of blobs under ``path`` in ``commit`` that the cache does not hold."""
    listed = git.run(["ls-tree", "-r", "-z", "--full-tree", commit, "--", path or "."],
                     repo=repo, offline=True, what="cannot list a cached commit").stdout
    wanted = set()
    for record in filter(None, listed.split("\0")):
        meta = record.split("\t", 1)[0].split()
        if len(meta) == 3 and meta[1] == "blob":
            wanted.add(meta[2])
    if not wanted:
        return []
    result = git.run(["rev-list", "--objects", "--missing=print", "--no-walk", commit, "--"],
                     repo=repo, offline=True, what="cannot list a cached commit").stdout
    missing = {line[1:].strip() for line in result.splitlines() if line.startswith("?")}
    return sorted(wanted & missing)


def fetch_blobs(repo: Path, source: GitSource, oids: list[str]) -> None:
    """The blobs by id, in one request per batch (what git's lazy fetch would do one by one)."""
    log.info("fetching the files of a git source", git=source.display_url, files=len(oids))
    for start in range(0, len(oids), _BATCH):
        git.run(["-c", "fetch.negotiationAlgorithm=noop", "fetch", "--quiet", "--no-tags",
                 "--no-write-fetch-head", "--recurse-submodules=no", "--filter=blob:none",
                 "origin", *oids[start:start + _BATCH]],
                repo=repo, url=source.url, allow_file=source.scheme == "file",
                what=f"cannot fetch the files of {source.display_url}")


def checkout(repo: Path, commit: str, path: str, dest: Path) -> None:
    """Write ``path`` of ``commit`` into the new directory ``dest`` (git writes files, modes
    and links; it refuses ``..`` and ``.git`` names) through a private index, offline: every
    blob must be here already."""
    index = dest.with_name(dest.name + ".index")
    treeish = f"{commit}:{path}" if path else f"{commit}^{{tree}}"
    extra = {"GIT_INDEX_FILE": str(index)}
    try:
        git.run(["read-tree", treeish], repo=repo, offline=True, extra_env=extra,
                what="cannot read a cached tree")
        dest.mkdir(mode=0o700)
        git.run(["--work-tree", str(dest), "checkout-index", "--all", "--force"], repo=repo,
                offline=True, extra_env=extra, what="cannot write a cached tree")
    finally:
        with contextlib.suppress(FileNotFoundError):
            index.unlink()

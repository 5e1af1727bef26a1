"""The cache's bare partial clones: one per URL, holding only the commits and blobs we used.

``<user cache>/git/repos/<sha256(display url)[:32]>/`` is a bare repository that its first
fetch with ``--filter=blob:none`` makes a partial clone (git then records ``origin`` as a
promisor remote and the filter): a fetch brings one commit and its trees (``--depth=1``), never
a blob; then the blobs under the skills' paths alone are fetched by id, as git's own lazy fetch
does, so a repository with a 1 GB blob elsewhere costs its trees and the skills' bytes. Which
blobs are missing is asked with ``rev-list --missing=print``, which never fetches (``cat-file``
would, one blob at a time).

The skills of one source at one commit are one batch (``prepare`` and ``batch``): one
``ls-tree`` lists them all, one fetch brings all their missing blobs, and one private index
writes all their trees (:func:`checkout_all`): a 300-skill repository costs about ten git
processes, not six per skill.

Every step runs under the repository's own lock (the project's lock primitive), and starts by
removing what a killed git left: its ``*.lock`` files (``shallow.lock`` would fail every later
fetch) and a half-made repository (made beside, then renamed into place).
"""

from __future__ import annotations

import contextlib
import fnmatch
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Final, NamedTuple

from bootstrap.errors import BootstrapError
from bootstrap.places import make_dir
from bootstrap.primitives import lock, log
from bootstrap.primitives.fs import remove_quietly
from bootstrap.sources import git
from bootstrap.sources.paths import root
from bootstrap.sources.spec import GitSource

SKILL_FILE: Final = "SKILL.md"
# Blob ids per fetch command line (41 bytes each): far below any ARG_MAX (macOS: 1 MiB), and
# one round trip for 300 skills of 25 files; paths per ``ls-tree`` command line alike.
_BATCH: Final = 10_000
LOCK_TIMEOUT: Final = 600.0


class Item(NamedTuple):
    """One entry of ``git ls-tree -r``: a file, a link (mode 120000) or a submodule."""

    mode: str
    kind: str  # "blob" or "commit"
    oid: str
    path: str


class NotCached(BootstrapError):
    """Offline, and the cache lacks what a locked source needs."""


def repo_path(source: GitSource) -> Path:
    return root() / "repos" / source.cache_key


@contextlib.contextmanager
def repository(source: GitSource, *, offline: bool, commit: str = "") -> Iterator[Path]:
    """The source's cache repository, made if missing, held under its lock while in use
    (``commit``: what it is wanted for, named when offline finds no repository)."""
    repos = make_dir(root() / "repos")
    # Ours alone: what we fetched from private repositories (the URL in each config is
    # without credentials: transport.py).
    os.chmod(repos, 0o700)
    path = repos / source.cache_key
    name = f"the git cache of {source.display_url}"
    with lock.hold(repos / f"{source.cache_key}.lock", LOCK_TIMEOUT, "git fetch", name=name,
                   advice="If {who} is stuck, stop it ({stop})."):
        if not path.is_dir():
            if offline:
                at = f"@{commit}" if commit else ""
                raise NotCached(f"{source.display_url}{at}: not in the cache and offline")
            _create(source, path)  # new: no stale lock, and its URL is this one
        else:
            _remove_stale_locks(path)
            if not offline:
                _set_url(path, source)
        yield path


def _create(source: GitSource, path: Path) -> None:
    """``git init --bare`` beside, given its remote, then renamed into place: a kill half way
    leaves only the side directory, removed at the next try. Two processes: the first
    filtered fetch makes it a partial clone (see the module docstring)."""
    side = path.with_name(path.name + ".init")
    remove_quietly(side)
    git.run(["init", "--quiet", "--bare", str(side)], what="cannot create a git cache")
    _set_url(side, source)
    os.rename(side, path)


def _set_url(path: Path, source: GitSource) -> None:
    # Without credentials (they reach git through a helper, never a file); rewritten at each
    # online use, as an ssh URL's user may change, and caches made before kept the secret here.
    git.run(["config", "remote.origin.url", source.git_url], repo=path, url=source.url,
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
    """Whether the commit (and so its trees) is here; asked without any lazy fetch (and
    without git at all in a repository that holds no object yet: a new one)."""
    if _no_objects(repo):
        return False
    result = git.run(["rev-list", "--missing=print", "--no-walk", "-n1", commit, "--"],
                     repo=repo, offline=True, check=False)
    return result.returncode == 0 and result.stdout.strip() == commit


def _no_objects(repo: Path) -> bool:
    """``objects/`` holds no pack and no loose object (only what ``git init`` makes)."""
    try:
        return set(os.listdir(repo / "objects")) <= {"info", "pack"} and \
            not os.listdir(repo / "objects" / "pack")
    except OSError:
        return False


def fetch_commit(repo: Path, source: GitSource, commit: str) -> None:
    """The commit and its trees, no blob, no history, no tags. ``--progress``: the stall
    watchdog's sign of life (transport.py); not shown unless the fetch fails."""
    log.info("fetching a git source", git=source.display_url, commit=commit)
    git.run(["fetch", "--progress", "--filter=blob:none", "--depth=1", "--no-tags",
             "--no-write-fetch-head", "--recurse-submodules=no", "origin", commit],
            repo=repo, source=source, what=f"cannot fetch {source.display_url} commit {commit}")


def list_tree(repo: Path, commit: str, under: Iterable[str]) -> list[Item]:
    """Everything ``git ls-tree -r`` lists of ``commit`` under the directories ``under``
    (the whole commit when one is the root): one process for any number of skills."""
    paths = sorted(set(under))
    spec = [] if "" in paths or len(paths) > _BATCH else ["--", *paths]
    listed = git.run(["--literal-pathspecs", "ls-tree", "-r", "-z", "--full-tree", commit,
                      *spec], repo=repo, offline=True, what="cannot list a cached commit").stdout
    out = []
    for record in filter(None, listed.split("\0")):
        meta, _, path = record.partition("\t")
        mode, kind, oid = meta.split()
        out.append(Item(mode, kind, oid, path))
    return out


def under(listing: Iterable[Item], path: str) -> list[Item]:
    """The entries below the directory ``path`` ("": the root), paths made relative to it."""
    if not path:
        return list(listing)
    prefix = path + "/"
    cut = len(prefix)
    return [i._replace(path=i.path[cut:]) for i in listing if i.path.startswith(prefix)]


def glob_root(source: GitSource) -> str:
    """The directory whose listing holds every skill of ``source``: its subdirectory, or a
    glob's parts before the first that has a wildcard ("" for the root)."""
    parts = (source.subdirectory or "").split("/")
    fixed = [p for p in itertools.takewhile(lambda p: not any(c in p for c in "*?["), parts)]
    return "/".join(fixed)


def skill_paths(listing: Iterable[Item], source: GitSource) -> list[str]:
    """The directories of a commit (``listing``: :func:`list_tree` under :func:`glob_root`)
    that are this source's skills: the subdirectory (or the root) itself when it holds
    SKILL.md as a file, or the glob's matches that hold SKILL.md, sorted."""
    sub = source.subdirectory
    if sub is None or not any(c in sub for c in "*?["):
        wanted = f"{sub}/{SKILL_FILE}" if sub else SKILL_FILE
        # A file (644 or 755), not a link or a directory.
        return [sub or ""] if any(i.path == wanted and i.mode.startswith("100")
                                  for i in listing) else []
    parts = sub.split("/")
    found = set()
    for item in listing:
        head, _, base = item.path.rpartition("/")
        if base == SKILL_FILE and head and _match(head.split("/"), parts):
            found.add(head)
    return sorted(found)


def _match(names: list[str], parts: list[str]) -> bool:
    # As glob does: one pattern part per path part, ``*`` never crossing a ``/``.
    return len(names) == len(parts) and all(fnmatch.fnmatchcase(n, p)
                                            for n, p in zip(names, parts, strict=True))


def absent(repo: Path, commit: str) -> set[str]:
    """The ids of the objects of ``commit`` the cache does not hold (asked without any lazy
    fetch: ``cat-file`` would fetch each one it is asked about)."""
    result = git.run(["rev-list", "--objects", "--missing=print", "--no-walk", commit, "--"],
                     repo=repo, offline=True, what="cannot list a cached commit").stdout
    return {line[1:].strip() for line in result.splitlines() if line.startswith("?")}


def fetch_blobs(repo: Path, source: GitSource, oids: list[str]) -> None:
    """The blobs by id, in one request per batch (what git's lazy fetch would do one by one)."""
    log.info("fetching the files of a git source", git=source.display_url, files=len(oids))
    for start in range(0, len(oids), _BATCH):
        git.run(["-c", "fetch.negotiationAlgorithm=noop", "fetch", "--progress", "--no-tags",
                 "--no-write-fetch-head", "--recurse-submodules=no", "--filter=blob:none",
                 "origin", *oids[start:start + _BATCH]],
                repo=repo, source=source, what=f"cannot fetch the files of {source.display_url}")


def checkout_all(repo: Path, trees: Sequence[tuple[str, Sequence[Item]]], work: Path) -> None:
    """Write each (directory, entries relative to it) into ``work/<directory>/`` in one pass:
    one private index holding them all (``update-index --index-info``, which refuses ``..``
    and ``.git`` names, as ``read-tree`` does), then one ``checkout-index``; offline, every blob
    must be here already. The same files, modes and links :func:`checkout` writes."""
    index = work.with_name(work.name + ".index")
    info = work.with_name(work.name + ".info")
    extra = {"GIT_INDEX_FILE": str(index)}
    records = (f"{i.mode} {i.kind} {i.oid}\t{where}/{i.path}\0"
               for where, items in trees for i in items)
    try:
        info.write_bytes("".join(records).encode("utf-8"))
        with open(info, "rb") as stdin:
            listed = git.run(["update-index", "-z", "--index-info"], repo=repo, offline=True,
                             extra_env=extra, stdin=stdin, what="cannot read a cached tree")
        if listed.stderr.strip():
            # A path git refuses (``.git``, ``..``) is left out with a warning and exit 0:
            # that tree would lack a file the commit has. Refused as read-tree refuses it.
            raise git.GitError(("git", "update-index", "--index-info"), 0, listed.stderr,
                               "cannot read a cached tree")
        work.mkdir(mode=0o700)
        git.run(["--work-tree", str(work), "checkout-index", "--all", "--force"], repo=repo,
                offline=True, extra_env=extra, what="cannot write a cached tree")
    finally:
        for made in (index, info):
            with contextlib.suppress(FileNotFoundError):
                made.unlink()


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

"""One fetch per commit: the trees of a source's skills at one commit, made together.

Under the source's repository lock (:func:`bootstrap.sources.fetch.repository`): the commit
fetched if the cache lacks it, one ``ls-tree`` of the directories wanted (or the listing that
found the skills), one ``rev-list`` for the blobs the cache lacks, one fetch of them all, and
one checkout of every tree (:func:`bootstrap.sources.materialise.materialise_all`). A source
costs the same handful of git processes whatever its number of skills: six per skill made 300
skills from one repository 1,800 processes and 45.6 s. A skill that fails (its tree refused,
its hash not the lock's, its files not cached offline) fails alone; what fails the commit
(fetching it or its files) is raised, for the caller to fail each skill with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bootstrap.errors import BootstrapError
from bootstrap.sources import fetch, materialise
from bootstrap.sources.spec import GitSource

Outcome = tuple[Path, str] | BootstrapError | OSError  # (tree, its sha256), or why not


def ensure_commit(repo: Path, source: GitSource, commit: str, *, offline: bool) -> None:
    """The commit and its trees in the cache: fetched if missing (offline: NotCached)."""
    if fetch.has_commit(repo, commit):
        return
    if offline:
        raise fetch.NotCached(_absent(source, commit))
    fetch.fetch_commit(repo, source, commit)


def trees(repo: Path, source: GitSource, commit: str,
          wanted: Sequence[tuple[str, str, str | None]], *, offline: bool,
          listing: Sequence[fetch.Item] | None = None) -> list[Outcome]:
    """Each (name, path, the lock's sha256 or None) of ``commit`` (in the cache: see
    :func:`ensure_commit`) as a checked tree in place, in order. ``listing``: the commit's
    :func:`fetch.list_tree` under every path, if the caller has it already."""
    if listing is None:
        listing = fetch.list_tree(repo, commit, [path for _, path, _ in wanted])
    made = [materialise.Wanted(name, path, tuple(fetch.under(listing, path)), sha)
            for name, path, sha in wanted]
    out: list[Outcome | None] = [None] * len(made)
    missing = _missing(repo, commit, made)
    if missing and offline:
        out = [fetch.NotCached(_absent(source, commit))
               if any(f.oid in missing for f in w.files) else None for w in made]
    elif missing:
        fetch.fetch_blobs(repo, source, sorted(missing))
    todo = [i for i, o in enumerate(out) if o is None]
    done = materialise.materialise_all(repo, commit, [made[i] for i in todo], source.describe)
    for i, outcome in zip(todo, done, strict=True):
        out[i] = outcome
    return [o for o in out if o is not None]  # every one is set by now


def _missing(repo: Path, commit: str, made: Sequence[materialise.Wanted]) -> set[str]:
    """The blobs of ``made`` the cache does not hold (git runs only if there are blobs)."""
    blobs = {f.oid for w in made for f in w.files if f.kind == "blob"}
    return fetch.absent(repo, commit) & blobs if blobs else set()


def _absent(source: GitSource, commit: str) -> str:
    return f"{source.display_url}@{commit}: not in the cache and offline"

"""A source's ref to a commit: one ``git ls-remote``, no clone, no fetch.

A ``rev`` is already a commit (spec.py accepts full ids only) and is never resolved. A tag
resolves to the commit it points at (the peeled ``^{}`` line of an annotated tag).
"""

from __future__ import annotations

from bootstrap.errors import BootstrapError
from bootstrap.sources import git
from bootstrap.sources.fetch import NotCached
from bootstrap.sources.spec import GitSource


def resolve(source: GitSource, *, offline: bool) -> str:
    """The commit ``source``'s ref names now (40 hex)."""
    if source.ref_kind == "rev":
        assert source.ref is not None, "BUG: a rev source without a rev"
        return source.ref
    if offline:
        raise NotCached(f"{source.describe}: not in the skills lock, and offline: it cannot be "
                        "resolved (run `kernel-bootstrap lock` with a network)")
    wanted = _wanted(source)
    out = git.run(["ls-remote", source.git_url, *wanted], source=source,
                  what=f"cannot resolve {source.describe}").stdout
    refs: dict[str, str] = {}
    for line in out.splitlines():
        oid, _, name = line.partition("\t")
        refs[name.strip()] = oid.strip()
    for ref in reversed(wanted):  # the peeled tag first
        found = refs.get(ref)
        if found is not None and len(found) == 40:
            return found.lower()
    kind = source.ref_kind or "default branch (HEAD)"
    raise BootstrapError(f"{source.describe}: the remote has no {kind}"
                         f"{' ' + source.ref if source.ref else ''}")


def _wanted(source: GitSource) -> list[str]:
    if source.ref_kind == "branch":
        return [f"refs/heads/{source.ref}"]
    if source.ref_kind == "tag":
        return [f"refs/tags/{source.ref}", f"refs/tags/{source.ref}^{{}}"]
    return ["HEAD"]

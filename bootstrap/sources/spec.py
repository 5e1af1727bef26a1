"""A ``skills`` entry that is an inline table: a git source, validated before any git runs.

The keys are uv's ``[tool.uv.sources]`` names (``git``, ``branch``, ``tag``, ``rev``,
``subdirectory``), so a user who knows one knows the other. Everything a hostile config could
use to make git run something is refused here, at config time, with exit 2 and the entry's
index: a transport other than https, ssh, git or file (``ext::`` runs a command, ``fd::``
talks to a descriptor), an option-like URL, a ``rev`` that is not a full commit id (a short
one can only be expanded by fetching the whole history), or a subdirectory that climbs out.

:attr:`GitSource.display_url` is the URL with any ``user:password@`` removed: the only form
that reaches the lock file, a log line, an error message or ``status``; :attr:`GitSource.git_url`
the one git is given (credentials travel apart: :mod:`bootstrap.sources.transport`).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

from bootstrap.config_file import Reader, short, source_name
from bootstrap.errors import ConfigError

KEYS: Final = ("git", "branch", "tag", "rev", "subdirectory")
REFS: Final = ("branch", "tag", "rev")
# file:// only: a bare local path would be taken by git as "file" too, but through its local
# (hard-link) transport, which ignores --filter.
SCHEMES: Final = ("https", "ssh", "git", "file")
_SCHEME: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_CREDENTIALS: Final = re.compile(r"(?<=://)[^/@\s]*@")
_FULL_REV: Final = re.compile(r"^[0-9a-f]{40}$")
# A branch or tag name git would accept (git check-ref-format's rules, the ones that matter to
# us: nothing option-like, no "..", no control characters, no refspec or glob characters).
_BAD_REF: Final = re.compile(r"(^-|\.\.|[\x00-\x20\x7f~^:?*\[\\]|@\{|^/|/$|\.lock$|^@$)")
# How long git may wait for a server that sends nothing (`git-timeout`, seconds).
TIMEOUT: Final = 15.0


@dataclass(frozen=True)
class GitSource:
    """One configured git source (``skills[index]``); ``ref`` None: the remote's HEAD."""

    index: int
    url: str
    ref_kind: str | None = None  # "branch", "tag" or "rev"
    ref: str | None = None
    subdirectory: str | None = None
    # The config's `git-timeout` and `git-safe-directories` (file:// repositories of another
    # user that git may read): how git reaches it, not what it is.
    timeout: float = field(default=TIMEOUT, compare=False)
    safe_directories: tuple[str, ...] = field(default=(), compare=False)

    @property
    def display_url(self) -> str:
        return display_url(self.url)

    @property
    def git_url(self) -> str:
        """The URL git is given, on its command line and in the cache repository's config:
        without credentials, but an ssh URL keeps its user name (ssh needs it; no secret)."""
        found = _CREDENTIALS.search(self.url)
        if found is None or self.scheme != "ssh":
            return self.display_url
        user = found.group(0)[:-1].partition(":")[0]
        return self.display_url.replace("://", f"://{user}@" if user else "://", 1)

    @property
    def credentials(self) -> tuple[str, str | None] | None:
        """An https URL's user and password (percent-decoded, as git would), None without."""
        found = _CREDENTIALS.search(self.url)
        if found is None or self.scheme != "https":
            return None
        user, colon, password = found.group(0)[:-1].partition(":")
        return unquote(user), unquote(password) if colon else None

    @property
    def scheme(self) -> str:
        match = _SCHEME.match(self.url)
        assert match is not None, "BUG: a GitSource with an unchecked URL"
        return match.group(1).lower()

    @property
    def cache_key(self) -> str:
        """The cache repository's name: one per URL, whatever credentials it was given with."""
        return hashlib.sha256(self.display_url.encode("utf-8")).hexdigest()[:32]

    @property
    def describe(self) -> str:
        """How messages name it: ``URL`` plus its ref, never a credential."""
        ref = f" {self.ref_kind} {self.ref}" if self.ref_kind else ""
        sub = f" subdirectory {self.subdirectory}" if self.subdirectory else ""
        return f"{self.display_url}{ref}{sub}"

    @property
    def repo_name(self) -> str:
        """The skill name a source without ``subdirectory`` gets: the repository's name."""
        tail = self.display_url.rstrip("/").rsplit("/", 1)[-1]
        return tail[:-4] if tail.endswith(".git") else tail


def display_url(url: str) -> str:
    """``url`` without ``user:password@`` (or a bare token before ``@``)."""
    return _CREDENTIALS.sub("", url, count=1)


def scrub(text: str, url: str) -> str:
    """``text`` (git's stderr) with ``url``'s credentials and any other URL's removed: git
    also prints them without the scheme ("unable to look up user:secret@host")."""
    found = _CREDENTIALS.search(url)
    if found:
        userinfo = found.group(0)
        text = text.replace(userinfo, "")
        secret = userinfo[:-1].partition(":")[2]
        if secret:
            text = text.replace(secret, "***")
    return _CREDENTIALS.sub("", text)


def parse(index: int, entry: dict[str, Any], file: Path) -> GitSource:
    """``skills[index]``, an inline table, as a :class:`GitSource`; ConfigError naming the key."""
    where = f"{source_name(file)}: skills[{index}]"
    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {short(unknown[0])} "
                          f"(known: {', '.join(KEYS)})")
    for key, value in entry.items():
        if not isinstance(value, str):
            raise ConfigError(f"{where}: key {key!r} must be a string, got "
                              f"{type(value).__name__} {short(value)}")
        if "\x00" in value or any(ord(c) < 0x20 for c in value):
            raise ConfigError(f"{where}: key {key!r} contains a control character: "
                              f"{short(value)}")
    url = entry.get("git")
    if url is None or not url.strip():
        raise ConfigError(f"{where}: key 'git' must be a non-empty URL"
                          + ("" if url is not None else " (it is missing)"))
    _check_url(url, where)
    refs = [k for k in REFS if k in entry]
    if len(refs) > 1:
        raise ConfigError(f"{where}: keys {refs[0]!r} and {refs[1]!r}: give at most one of "
                          "branch, tag and rev")
    kind = refs[0] if refs else None
    ref = entry[kind] if kind else None
    if kind is not None:
        _check_ref(kind, ref or "", where)
    sub = entry.get("subdirectory")
    return GitSource(index, url, kind, ref, _check_subdirectory(sub, where) if sub else None)


def with_transport(reader: Reader, sources: tuple[GitSource, ...]) -> tuple[GitSource, ...]:
    """``sources`` given the config's ``git-timeout`` (seconds > 0 a server may send nothing
    before its source counts as unreachable) and ``git-safe-directories`` (absolute paths of
    file:// repositories of another user that git may read), checked; no source is needed."""
    given: dict[str, Any] = {}
    if "git-timeout" in reader.data:
        value = reader.data["git-timeout"]
        # bool is an int to Python, and NaN compares false both ways: neither is a duration.
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 < value < float("inf"):
            raise reader.bad("git-timeout", "a number of seconds greater than 0")
        given["timeout"] = float(value)
    safe = reader.strings("git-safe-directories")
    for index, path in enumerate(safe):
        if not path.startswith("/"):
            raise ConfigError(f"{source_name(reader.file)}: git-safe-directories[{index}]: not "
                              "an absolute path (a file:// repository's directory, as in its "
                              f"URL): {short(path)}")
    if safe:
        given["safe_directories"] = tuple(posixpath.normpath(p) for p in safe)
    return tuple(replace(s, **given) for s in sources)


def _check_url(url: str, where: str) -> None:
    shown = short(display_url(url))
    if url.startswith("-"):
        raise ConfigError(f"{where}: key 'git': {shown} looks like an option, not a URL")
    match = _SCHEME.match(url)
    if match is None:
        if "::" in url.split("/", 1)[0]:  # ext::cmd, fd::0: git's remote helpers
            raise ConfigError(f"{where}: key 'git': {shown}: the {url.split('::')[0]}:: "
                              f"transport is not allowed (allowed: {', '.join(SCHEMES)})")
        raise ConfigError(f"{where}: key 'git': {shown} is not a URL; write it as "
                          "https://HOST/PATH, ssh://USER@HOST/PATH (not scp-like "
                          "USER@HOST:PATH), git://HOST/PATH or file:///PATH")
    scheme = match.group(1).lower()
    if scheme not in SCHEMES:
        raise ConfigError(f"{where}: key 'git': {shown}: the {scheme}:// transport is not "
                          f"allowed (allowed: {', '.join(SCHEMES)})")
    if not url[match.end():].strip("/"):
        raise ConfigError(f"{where}: key 'git': {shown} names no repository")


def _check_ref(kind: str, ref: str, where: str) -> None:
    if kind == "rev":
        if not _FULL_REV.match(ref):
            raise ConfigError(f"{where}: key 'rev' must be a full commit id (40 lowercase hex "
                              f"digits), got {short(ref)}; a short one cannot be resolved "
                              "without fetching the whole history")
        return
    if not ref or _BAD_REF.search(ref):
        raise ConfigError(f"{where}: key {kind!r}: {short(ref)} is not a valid {kind} name")


def _check_subdirectory(sub: str, where: str) -> str | None:
    """A relative POSIX path (or glob) inside the repository, normalised (no ``./``)."""
    norm = posixpath.normpath(sub.strip("/")) if sub.strip("/") else "."
    parts = norm.split("/")
    if sub.startswith("/") or "\\" in sub or ".." in parts or ".git" in (p.lower() for p in parts):
        raise ConfigError(f"{where}: key 'subdirectory': {short(sub)} must be a relative path "
                          "inside the repository (no '..', no '.git', no backslash)")
    return None if norm == "." else norm

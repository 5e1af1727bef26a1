"""A skill directory as a validated, sorted list of entries; its content hash; a durable copy.

Shared by ``publish`` and ``push``: both must refuse the same unsafe trees and agree on what
"the same content" means. The walk never follows a symlink (``os.scandir`` + ``lstat``), so a
link loop or a link to ``/`` cannot make it hang or escape; it reads no file content, and
hashing and copying stream files in chunks, so a 10^5-file tree costs bounded memory
(here: about 1 s to walk, 2 s to hash, 75 MB).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import posixpath
import re
import stat
import struct
import sys
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from bootstrap.errors import SkillError
from bootstrap.primitives.fs import libc_function, write_all
from bootstrap.trees.skillmd import check_layout, check_skill_dir

EntryKind = Literal["file", "dir", "symlink"]

_CHUNK: Final = 1024 * 1024
# Bumped whenever the record layout changes, so old and new hashes never compare equal.
_HASH_TAG: Final = b"kernel-bootstrap tree v1"
_LENGTH: Final = struct.Struct(">Q")  # each field's length prefix
_KIND_FIELDS: Final = {k: _LENGTH.pack(len(k)) + k.encode() for k in ("file", "dir", "symlink")}


@dataclass(frozen=True)
class Entry:
    """One path inside a skill tree (the root itself is never an entry)."""

    rel: str  # POSIX path relative to the skill root
    kind: EntryKind
    mode: int  # stat.S_IMODE: permission bits, exec bits included
    size: int  # bytes for files, 0 otherwise
    mtime_ns: int
    path: Path  # absolute source path
    target: str | None  # the symlink's target text, for symlinks only


@dataclass(frozen=True)
class SkillTree:
    """A validated skill directory; ``entries`` are sorted by ``rel`` as UTF-8 bytes."""

    name: str
    root: Path  # absolute, resolved
    entries: tuple[Entry, ...]


def load_skill_tree(src: Path, *, spec: bool = True) -> SkillTree:
    """Validate the skill directory ``src`` and list its entries.

    Raises :class:`SkillError` naming the skill and the offending path for: no SKILL.md, a bad
    name, an absolute or escaping symlink, a device/fifo/socket, a file name that is not valid
    UTF-8, or two names in one directory that only differ in case (they would collide on a
    case-insensitive target such as macOS or Windows).
    """
    # abspath, not resolve(): a symlinked SRC keeps its own name, and "a/.." is collapsed.
    absolute = Path(os.path.abspath(src))
    if not absolute.is_dir():
        raise SkillError(f"{absolute}: not a skill: not a directory")
    # spec=False: a tree we published ourselves, checked (and warned about) on its way in.
    name = check_skill_dir(absolute) if spec else check_layout(absolute)
    root = absolute.resolve()
    entries = sorted(_walk(name, root), key=lambda e: e.rel.encode("utf-8"))
    return SkillTree(name=name, root=root, entries=tuple(entries))


def _walk(name: str, root: Path) -> Iterator[Entry]:
    # Iterative, so a deep tree cannot hit the recursion limit; only directories are stacked.
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        for entry in _scan(name, root, rel_dir):
            if entry.kind == "dir":
                pending.append(entry.rel)
            yield entry


def _scan(name: str, root: Path, rel_dir: str) -> list[Entry]:
    directory = root / rel_dir if rel_dir else root
    try:
        with os.scandir(directory) as it:
            found = [(d.name, d.stat(follow_symlinks=False)) for d in it]
    except OSError as e:
        raise SkillError(f"skill {name!r}: cannot read {directory}: {e.strerror}") from None
    _check_case_collisions(name, directory, [n for n, _ in found])
    return [_entry(name, root, rel_dir, n, st) for n, st in found]


def _entry(name: str, root: Path, rel_dir: str, base: str, st: os.stat_result) -> Entry:
    rel = f"{rel_dir}/{base}" if rel_dir else base
    path = root / rel
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        # os.fsdecode smuggles undecodable bytes in as surrogates; such a name cannot be
        # written into a tar stream or onto a UTF-8-only target as the same name.
        raise SkillError(f"skill {name!r}: {path!r}: file name is not valid UTF-8") from None
    mode = st.st_mode
    kind: EntryKind
    size, target = 0, None
    if stat.S_ISREG(mode):
        kind, size = "file", st.st_size
    elif stat.S_ISDIR(mode):
        kind = "dir"
    elif stat.S_ISLNK(mode):
        kind, target = "symlink", _check_symlink(name, root, rel, path)
    else:
        raise SkillError(
            f"skill {name!r}: {path}: is a {_kind_name(mode)}; only files, directories and "
            "symlinks inside the skill can be published"
        )
    return Entry(rel, kind, stat.S_IMODE(mode), size, st.st_mtime_ns, path, target)


def _kind_name(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def _check_symlink(name: str, root: Path, rel: str, path: Path) -> str:
    """The link's target text, if it stays inside the skill both as written and as resolved."""
    target = os.readlink(path)
    if Path(target).is_absolute():
        raise SkillError(f"skill {name!r}: {path}: symlink to an absolute path {target!r}")
    # Lexically: normpath keeps a leading "..", so any excursion above the root shows.
    lexical = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    # Resolved: catches a hop through another link (``x -> up/..`` with ``up -> ../..``).
    # realpath does not raise on a loop; a looping link is kept as a link, never followed.
    resolved = os.path.realpath(path)
    if lexical == ".." or lexical.startswith("../") or not _inside(root, resolved):
        raise SkillError(
            f"skill {name!r}: {path}: symlink {target!r} points outside the skill directory"
        )
    return target


def _inside(root: Path, resolved: str) -> bool:
    return os.path.commonpath([str(root), resolved]) == str(root)


def _check_case_collisions(name: str, directory: Path, names: list[str]) -> None:
    seen: dict[str, str] = {}
    for base in names:
        # NFC too: macOS file systems also treat composed and decomposed accents as one name.
        key = unicodedata.normalize("NFC", base).casefold()
        other = seen.setdefault(key, base)
        if other != base:
            raise SkillError(
                f"skill {name!r}: {directory}: {other!r} and {base!r} differ only in case; "
                "they would overwrite each other on a case-insensitive file system"
            )


def check_collisions(trees: Sequence[SkillTree]) -> None:
    """Two trees published under one name (or names equal up to case) are a SkillError."""
    seen: dict[str, SkillTree] = {}
    for tree in trees:
        other = seen.setdefault(tree.name.casefold(), tree)
        if other is not tree:
            raise SkillError(
                f"two skills would be published as {tree.name!r}: {other.root} and {tree.root}"
            )


def tree_hash(tree: SkillTree) -> str:
    """``sha256:<hex>`` over the sorted (path, type, mode, size, content) records.

    Content is the sha256 of a file's bytes or a symlink's target text; mtimes are left out,
    so touching a file does not count as a change, and a symlink's mode counts as 0 (Linux
    cannot set it, macOS can). Every field is length-prefixed, so no two different trees can
    produce the same byte stream.
    """
    return hash_records(tree, (file_digest(e.path) for e in tree.entries if e.kind == "file"))


def is_tree_hash(value: object) -> bool:
    """Whether ``value`` is a digest as :func:`tree_hash` writes it: for one read back from a
    record, which is not trusted (a sandbox's report, a record of published skills)."""
    return (isinstance(value, str) and value.startswith("sha256:") and len(value) == 71
            and all(c in "0123456789abcdef" for c in value[7:]))


def hash_records(tree: SkillTree, file_digests: Iterator[bytes] | Sequence[bytes]) -> str:
    """:func:`tree_hash` with the file digests supplied, in entry order (e.g. from a copy)."""
    digests = iter(file_digests)

    def records() -> Iterator[tuple[str, str, int, int, bytes]]:
        for e in tree.entries:
            if e.kind == "file":
                content = next(digests, None)
                if content is None:
                    raise AssertionError("BUG: fewer file digests than file entries")
            else:
                content = (e.target or "").encode("utf-8")
            yield e.rel, e.kind, e.mode, e.size, content

    return hash_fields(records())


def hash_fields(records: Iterable[tuple[str, str, int, int, bytes]]) -> str:
    """:func:`hash_records` over (rel, kind, mode, size, content) tuples in entry order: the one
    definition of the record stream, for a caller that walked the tree itself (``verify``)."""
    # Each field length-prefixed (8 bytes, big-endian), joined and hashed in one update: the
    # bytes are those of one update per field, at a third of the time (verify hashes 100s).
    prefix = _LENGTH.pack
    parts = [prefix(len(_HASH_TAG)), _HASH_TAG]
    for rel, kind, mode, size, content in records:
        path = rel.encode("utf-8")
        perms = b"%o" % (0 if kind == "symlink" else mode)
        length = b"%d" % size
        parts += (prefix(len(path)), path, _KIND_FIELDS[kind], prefix(len(perms)), perms,
                  prefix(len(length)), length, prefix(len(content)), content)
    return f"sha256:{hashlib.sha256(b''.join(parts)).hexdigest()}"


def file_digest(path: Path) -> bytes:
    """The sha256 of a file's content, read in chunks; unreadable → SkillError naming it."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except OSError as e:
        raise SkillError(f"{path}: cannot read: {e.strerror}") from None
    return h.digest()


def copy_tree(tree: SkillTree, dest: Path) -> str:
    """Copy ``tree`` into the new directory ``dest``; return the tree hash of what was copied.

    Modes (exec bits) and mtimes are kept, internal symlinks are recreated as symlinks, hard
    links become independent files, and everything is made durable before this returns, so a
    crash right after a swap cannot leave a published tree with empty files. Compare the
    result with :func:`tree_hash` taken earlier to notice a source that changed in between.
    """
    # One syncfs instead of an fsync per file and directory where the kernel reports writeback
    # errors through it: 10^4 small files took 3.5 s with per-file fsync here, 1.2 s with one
    # syncfs (syncfs also flushes other writers on that file system; we accept that cost).
    each = _syncfs() is None
    dest.mkdir(mode=0o700)
    digests = []
    for e in tree.entries:
        digest = _copy_entry(e, dest / e.rel, each)
        if digest is not None:
            digests.append(digest)
    for e in reversed(tree.entries):  # children first: creating entries touches the parent
        if e.kind == "dir":
            _finish_dir(dest / e.rel, e.mode, e.mtime_ns, each)
    root_st = os.stat(tree.root)
    _finish_dir(dest, stat.S_IMODE(root_st.st_mode), root_st.st_mtime_ns, each)
    if not each:
        _sync_fs(dest)
    return hash_records(tree, digests)


def _copy_entry(e: Entry, dest: Path, fsync: bool) -> bytes | None:
    if e.kind == "dir":
        dest.mkdir(mode=0o700)  # writable until filled; the real mode is set afterwards
        return None
    if e.kind == "symlink":
        assert e.target is not None, "BUG: a symlink entry without a target"
        os.symlink(e.target, dest)
        if os.utime in os.supports_follow_symlinks:
            os.utime(dest, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)
        return None
    return _copy_file(e.path, dest, e.mode, e.mtime_ns, fsync)


def _copy_file(src: Path, dest: Path, mode: int, mtime_ns: int, fsync: bool) -> bytes:
    """Stream ``src`` to a new ``dest`` with its mode and mtime; return its sha256."""
    h = hashlib.sha256()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    try:
        with open(src, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                write_all(fd, chunk)
        os.fchmod(fd, mode)
        os.utime(fd, ns=(mtime_ns, mtime_ns))
        if fsync:
            _fsync(fd)
    finally:
        os.close(fd)
    return h.digest()


def _finish_dir(path: Path, mode: int, mtime_ns: int, fsync: bool) -> None:
    # Through one fd: a 0o555 source dir must still be fsynced and stamped after its chmod.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        if fsync:
            _fsync(fd)
        os.fchmod(fd, mode)
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    finally:
        os.close(fd)


def _fsync(fd: int) -> None:
    os.fsync(fd)  # one seam, so tests can inject a full disk


_SyncFs = Callable[[int], int]


@functools.cache
def _syncfs() -> _SyncFs | None:
    """libc ``syncfs`` on Linux >= 5.8 (older kernels do not report writeback errors), else None."""
    release = tuple(int(p) for p in re.findall(r"\d+", platform.release())[:2])
    if not sys.platform.startswith("linux") or release < (5, 8):
        return None
    fn: _SyncFs | None = libc_function("syncfs")
    return fn


def _sync_fs(path: Path) -> None:
    """Flush every dirty page and inode of ``path``'s file system, or raise what went wrong."""
    fn = _syncfs()
    assert fn is not None, "BUG: _sync_fs without syncfs"
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        if fn(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)

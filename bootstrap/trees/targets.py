"""Where ``push`` copies skill trees to: this machine, or any sandbox reached by an exec prefix.

The harness we replace wrote one file per process on exec-based targets (32 files: 6.1 s
sequential, 1.0 s with ``asyncio.gather``), held the whole tree in memory, needed a separate
``chmod +x`` round trip because writes carry bytes and not modes, and let two sources race for
one destination. Here an exec target gets ONE process per push, ``PREFIX sh -c SCRIPT``, fed an
uncompressed tar stream built from the validated :class:`~bootstrap.trees.skilltree.SkillTree`:
file contents are read from disk in chunks straight into the pipe (:mod:`bootstrap.primitives.tar`),
modes, mtimes and symlinks travel inside the archive, and the script renames each complete
skill into place. Pushes from separate invocations into one DEST take turns for the renames
(a ``mkdir`` lock beside DEST), so they never nest one tree inside another or mix two.

Targets are registered in one place, :func:`target_for`; a harness may pass any object that
satisfies :class:`Target` to :func:`bootstrap.trees.push.push`.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import secrets
import shlex
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, TypedDict

from bootstrap.errors import BootstrapError, ConfigError
from bootstrap.primitives import log, process, tar
from bootstrap.trees import pushrecord
from bootstrap.trees.skilltree import SkillTree

LOCAL: Final = "local"
CHUNK: Final = tar.CHUNK  # per read from disk and per write into the pipe
# The last member of every stream. The script swaps nothing unless it was extracted, so a stream
# cut short (our read error, a dropped connection, a prefix without ``-i``) changes nothing even
# when the cut falls on a member boundary and tar reports success.
COMPLETE_MARKER: Final = ".kb-push-complete"


@dataclass(frozen=True)
class PushedSkill:
    name: str
    path: str  # where it landed, as the target names it


class ReportJSON(TypedDict):
    runtime: str  # the key push --json has always printed: the target's name
    dest: str
    ok: bool
    skills: list[dict[str, str]]
    removed: list[str]
    error: str | None


@dataclass(frozen=True)
class PushReport:
    """What one target ended up with; ``ok`` False carries the error message."""

    runtime: str  # the target's name (``runtime`` in push --json)
    dest: str
    ok: bool
    skills: tuple[PushedSkill, ...] = ()
    error: str | None = None
    removed: tuple[str, ...] = ()  # skills pruned (``push --prune``)

    def to_json(self) -> ReportJSON:
        skills = [{"name": s.name, "path": s.path} for s in self.skills]
        return {"runtime": self.runtime, "dest": self.dest, "ok": self.ok, "skills": skills,
                "removed": list(self.removed), "error": self.error}


class Target(Protocol):
    """A place skill trees are pushed into.

    ``push`` receives trees that are already validated and free of collisions; it returns a
    report on success and raises :class:`~bootstrap.errors.BootstrapError` on failure. For
    ``push --prune`` it is called with ``prune=True`` as well (only then: a runtime that does not
    take it can still serve pushes without it), and then removes the skills it put into DEST
    earlier that ``trees`` no longer has, listing them in the report's ``removed``.
    """

    @property
    def name(self) -> str: ...

    async def push(self, trees: Sequence[SkillTree], dest: str, *,
                   prune: bool = False) -> PushReport: ...


def target_for(exec_prefix: str | None) -> Target:
    """The one registry of built-in targets: no prefix is this machine, a prefix is exec."""
    if exec_prefix is None:
        return LocalTarget()
    return ExecTarget.from_prefix(exec_prefix)


# --- local ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalTarget:
    """A directory on this machine, written by :func:`bootstrap.trees.publish.publish_trees` (atomic
    swap, under publish's lock: concurrent pushes into one DEST serialise there)."""

    name: str = LOCAL
    lock_timeout: float = 600.0

    async def push(self, trees: Sequence[SkillTree], dest: str, *,
                   prune: bool = False) -> PushReport:
        from bootstrap.trees.publish import publish_trees

        # publish is blocking file I/O: a thread keeps the other targets' streams flowing.
        results, pruned = await asyncio.to_thread(
            lambda: publish_trees(trees, Path(dest).expanduser(), lock_timeout=self.lock_timeout,
                                  prune=prune))
        skills = tuple(PushedSkill(r.name, str(r.path)) for r in results)
        return PushReport(self.name, dest, ok=True, skills=skills, removed=pruned.removed)


# --- exec -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecTarget:
    """Any command prefix that runs a command in the target with our stdin attached."""

    argv: tuple[str, ...]
    # How long the script's report of what it holds may take before everything is sent
    # anyway (a transport that holds stdout back until the end never answers in time).
    answer_timeout: float = 15.0

    @classmethod
    def from_prefix(cls, prefix: str) -> ExecTarget:
        try:
            argv = tuple(shlex.split(prefix))
        except ValueError as e:
            raise ConfigError(f"--exec {prefix!r}: cannot split it into words: {e}") from None
        if not argv:
            raise ConfigError("--exec needs a command prefix, e.g. 'docker exec -i CONTAINER'")
        return cls(argv)

    @property
    def name(self) -> str:
        return shlex.join(self.argv)

    async def push(self, trees: Sequence[SkillTree], dest: str, *,
                   prune: bool = False) -> PushReport:
        target = remote_dest(dest)
        token = secrets.token_hex(4)
        names = [t.name for t in trees]
        script = remote_script(target, names, token, prune=prune)
        shown = (*self.argv, "sh", "-c", "<push script>")  # the script itself is noise in errors
        what = f"push to {self.name} failed"
        digests = dict(zip(names, await asyncio.gather(
            *(asyncio.to_thread(pushrecord.push_digest, t) for t in trees)), strict=True))
        sent: list[str] = []

        def answer(line: str | None) -> Iterator[bytes]:
            # Only what the sandbox does not hold intact goes (a changed file: that skill).
            have = pushrecord.held(line, token)
            changed = [t for t in trees if have.get(t.name) != digests[t.name]]
            sent.extend(t.name for t in changed)
            return tar_stream(changed, manifest=pushrecord.manifest(digests))

        stdout = await process.feed(self.command(script), answer, shown, what,
                                    ask=f"{pushrecord.HELD} {token}",
                                    ask_timeout=self.answer_timeout)
        log.debug("pushed", runtime=self.name, sent=sent,
                  unchanged=[n for n in names if n not in sent])
        if f"kb-push-ok {token}" not in stdout:
            # Exit 0 without the script's last line: the prefix lost the exit status (or ran
            # something else). Claiming success here would hide a sandbox without skills.
            raise BootstrapError(
                "the runtime exited 0 but never confirmed the push; does the prefix pass the "
                f"command's exit status on?\n  command: {shlex.join(shown)}"
            )
        skills = tuple(PushedSkill(n, posixpath.join(target, n)) for n in names)
        removed = pushrecord.said(stdout, "kb-push-removed")
        pushrecord.log_notes(stdout, target, self.name)
        return PushReport(self.name, dest, ok=True, skills=skills, removed=removed)

    def command(self, script: str) -> tuple[str, ...]:
        """``PREFIX sh -c SCRIPT``, quoted once more for prefixes that go through a shell."""
        if Path(self.argv[0]).name == "ssh":
            # ssh joins its remaining arguments with spaces into one line for the remote login
            # shell, which would split SCRIPT into words: hand it one pre-quoted line instead.
            return (*self.argv, shlex.join(["sh", "-c", script]))
        return (*self.argv, "sh", "-c", script)


def remote_dest(dest: str) -> str:
    """``dest`` normalised for the remote script (a leading ``-`` can never read as an option)."""
    if not dest or "\0" in dest:
        raise ConfigError(f"--dest {dest!r}: not a usable path")
    target = posixpath.normpath(dest)
    if target in ("/", "//"):
        raise ConfigError("--dest /: refusing to push skills into the file system root")
    return f"./{target}" if target.startswith("-") else target


def _sh_path(path: str) -> str:
    """A shell word for ``path``; ``~`` and ``~/...`` mean the target's $HOME, as for scp."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"' + shlex.quote(path[1:])
    return shlex.quote(path)


# POSIX sh, busybox-portable: only mkdir, mv, ln, rm, cat, sleep, tar (-x -p -o -f - -C: the
# spellings GNU, busybox and bsdtar all accept; -o is no-same-owner, -p keeps exec bits for
# non-root), dirname, basename, kill -0, printf.
_SCRIPT: Final = r"""set -u
stage=
link_test=
lock=
held=
have=
say() { printf 'kernel-bootstrap push: %s\n' "$*" >&2; }
cleanup() {
  if [ -n "$held" ]; then rm -rf "$lock"; held=; fi
  if [ -n "$link_test" ]; then rm -f "$link_test"; link_test=; fi
  if [ -n "$stage" ]; then rm -rf "$stage"; fi
}
fail() { say "$*"; cleanup; exit 1; }
trap 'cleanup; exit 1' HUP INT TERM
parent=$(dirname "$dest") && base=$(basename "$dest") || fail "bad destination $dest"
# Staging and link tests left by pushes that were killed (their shell no longer runs) go first.
for old in "$parent/.$base.kb-push."* "$dest/.kb-push."*; do
  [ -e "$old" ] || [ -L "$old" ] || continue
  pid=${old##*.}
  case $pid in ''|*[!0-9]*) continue ;; esac
  kill -0 "$pid" 2>/dev/null || rm -rf "$old"
done
mkdir -p "$dest" || fail "cannot create $dest"
# Staging sits next to DEST, so agents scanning DEST never see a half-extracted tree. The
# final rename must not cross a mount: where it would (DEST is a volume, a bind mount, or a
# link into another file system), mv falls back to copying, busybox's silently, and readers
# see a half-copied skill. Minimal images have no `mountpoint` (Debian's busybox), so ask the
# kernel what the rename needs: a hard link from the staging into DEST is refused across any
# mount, as the rename would be, and ln never copies instead. When the link fails, or the
# parent is not writable, stage in a hidden directory inside DEST (the lock too: every push
# into one DEST makes the same choice, so they all meet at one lock).
same_mount() {
: > "$stage/link-test" 2>/dev/null || return 1
  link_test="$dest/.kb-push.$token.$$"
  ln "$stage/link-test" "$link_test" 2>/dev/null || { link_test=; return 1; }
  rm -f "$link_test" "$stage/link-test"
  link_test=
}
if mkdir "$parent/.$base.kb-push.$token.$$" 2>/dev/null; then
  stage="$parent/.$base.kb-push.$token.$$"
fi
if [ -n "$stage" ] && same_mount; then
  lock="$parent/.$base.kb-push-lock"
  record="$parent/.$base.kb-record"
else
  if [ -n "$stage" ]; then rm -rf "$stage"; fi
  stage=
  mkdir "$dest/.kb-push.$token.$$" || fail "cannot create a staging directory in $dest"
  stage="$dest/.kb-push.$token.$$"
  lock="$dest/.kb-push-lock"
  record="$dest/.kb-record"
fi
mkdir "$stage/new" "$stage/old" || fail "cannot create $stage"
# Pushes into one DEST take turns for the renames: with two at once, one's `mv new/NAME
# DEST/NAME` moved INTO the tree the other had just put there (DEST/NAME/NAME). mkdir is the
# one atomic test-and-set every sh has; the holder's pid inside lets a waiter break the lock
# of a push that was killed. Breaking renames the lock into our staging first and checks the
# pid again, so of two waiters that found the same dead owner only one removes anything, and
# a lock a live push took in between is handed back.
break_lock() {
  mv "$lock" "$stage/dead-lock" 2>/dev/null || return 0
  if [ "$(cat "$stage/dead-lock/pid" 2>/dev/null)" = "$1" ] || [ -e "$lock" ]; then
    rm -rf "$stage/dead-lock"
  else
    mv "$stage/dead-lock" "$lock" 2>/dev/null
  fi
}
take_lock() {
  waits=0
  until mkdir "$lock" 2>/dev/null; do
    owner=$(cat "$lock/pid" 2>/dev/null) || owner=
    case $owner in
      ''|*[!0-9]*) ;;
      *) if ! kill -0 "$owner" 2>/dev/null; then break_lock "$owner"; continue; fi ;;
    esac
    waits=$((waits + 1))
    [ "$waits" -le 3000 ] ||
      fail "another push has held $lock for minutes; if no push is running, remove it"
    sleep 0.1 2>/dev/null || sleep 1
  done
  held=1
  echo "$$" > "$lock/pid"
}
@REPORT@
hint="(docker and kubectl need -i to pass the stream on stdin)"
tar -x -p -o -f - -C "$stage/new" || fail "tar could not unpack the stream $hint"
[ -f "$stage/new/@MARKER@" ] || fail "the stream ended early; nothing was changed $hint"
for name in @NAMES@; do
  [ -d "$stage/new/$name" ] || case " $have " in
    *" $name="*) ;;
    *) fail "skill $name is missing from the stream" ;;
  esac
done
[ -n "$held" ] || take_lock
# Each skill sent: old tree aside, new tree in (sh has no renameat2). Between the two renames
# DEST/name is absent for an instant; it never names a half-written tree. Signals are ignored
# from here on, so a dropped connection cannot stop us between the two renames. A skill not
# sent is the tree DEST already holds, as reported above under this same lock.
trap '' HUP INT TERM PIPE
for name in @NAMES@; do
  [ -d "$stage/new/$name" ] || continue
  if [ -e "$dest/$name" ] || [ -L "$dest/$name" ]; then
    mv "$dest/$name" "$stage/old/$name" || fail "cannot move the old $dest/$name aside"
  fi
  if ! mv "$stage/new/$name" "$dest/$name"; then
    if [ -e "$stage/old/$name" ]; then mv "$stage/old/$name" "$dest/$name"; fi
    fail "cannot move $name into $dest"
  fi
  sent="$sent $name"
done
@RECORD@
cleanup
echo "kb-push-ok $token"
"""

def remote_script(dest: str, names: Sequence[str], token: str, *, prune: bool = False) -> str:
    """The script run as ``sh -c``: extract the stream into staging, rename each skill in,
    keep the record of what pushes put there (and with ``prune``, remove what it no longer
    names)."""
    words = " ".join(shlex.quote(n) for n in names)
    body = (_SCRIPT.replace("@REPORT@", pushrecord.REPORT).replace("@RECORD@", pushrecord.RECORD)
            .replace("@NAMES@", words).replace("@MARKER@", COMPLETE_MARKER))
    return (f"dest={_sh_path(dest)}\ntoken={shlex.quote(token)}\nprune={'1' if prune else ''}\n"
            f"{body}")


# --- the tar stream ---------------------------------------------------------------------------


def tar_stream(trees: Sequence[SkillTree], chunk: int = CHUNK, *,
               manifest: bytes = b"") -> Iterator[bytes]:
    """An uncompressed tar of every tree (each under its name), in pieces of about ``chunk``,
    ending with :data:`COMPLETE_MARKER` (holding ``manifest``). Memory stays bounded by
    ``chunk`` whatever the file sizes: contents are read while the stream is consumed."""
    return tar.coalesce(_members(trees, chunk, manifest), chunk)


def _members(trees: Sequence[SkillTree], chunk: int, manifest: bytes) -> Iterator[bytes]:
    for tree in trees:
        st = os.stat(tree.root)
        yield tar.header(tree.name, "dir", stat.S_IMODE(st.st_mode), st.st_mtime_ns)
        for e in tree.entries:
            yield tar.header(f"{tree.name}/{e.rel}", e.kind, e.mode, e.mtime_ns, e.size,
                             e.target)
            if e.kind == "file":
                yield from tar.file_data(e.path, e.size, chunk)
    yield pushrecord.member(COMPLETE_MARKER, manifest)
    yield tar.END

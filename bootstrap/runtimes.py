"""Where ``push`` copies skill trees to: this machine, or any sandbox reached by an exec prefix.

The harness we replace wrote one file per process on exec-based runtimes (32 files: 6.1 s
sequential, 1.0 s with ``asyncio.gather``), held the whole tree in memory, needed a separate
``chmod +x`` round trip because writes carry bytes and not modes, and let two sources race for
one destination. Here an exec runtime gets ONE process per push, ``PREFIX sh -c SCRIPT``, fed an
uncompressed tar stream built from the validated :class:`~bootstrap.skilltree.SkillTree`:
file contents are read from disk in chunks straight into the pipe, modes, mtimes and symlinks
travel inside the archive, and the script renames each complete skill into place.

Runtimes are registered in one place, :func:`runtime_for`; a harness may pass any object that
satisfies :class:`Runtime` to :func:`bootstrap.push.push`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import secrets
import shlex
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, TypedDict

from bootstrap.errors import BootstrapError, ConfigError, ProcessError
from bootstrap.process import child_env
from bootstrap.skilltree import Entry, SkillTree

if TYPE_CHECKING:
    from bootstrap.publish import PublishResult

LOCAL: Final = "local"
CHUNK: Final = 256 * 1024  # per read from disk and per write into the pipe
_BLOCK: Final = tarfile.BLOCKSIZE
_RECORD: Final = tarfile.RECORDSIZE
_TAIL_LIMIT: Final = 64 * 1024  # stderr kept per runtime: a chatty sandbox cannot grow us
_DRAIN_TIMEOUT: Final = 30.0  # after we abort a stream, how long the runtime gets to clean up
# The last member of every stream. The script swaps nothing unless it was extracted, so a stream
# cut short (our read error, a dropped connection, a prefix without ``-i``) changes nothing even
# when the cut falls on a member boundary and tar reports success.
COMPLETE_MARKER: Final = ".kb-push-complete"
_KIND_TYPES: Final = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}


@dataclass(frozen=True)
class PushedSkill:
    name: str
    path: str  # where it landed, as the runtime names it


class ReportJSON(TypedDict):
    runtime: str
    dest: str
    ok: bool
    skills: list[dict[str, str]]
    error: str | None


@dataclass(frozen=True)
class PushReport:
    """What one runtime ended up with; ``ok`` False carries the error message."""

    runtime: str
    dest: str
    ok: bool
    skills: tuple[PushedSkill, ...] = ()
    error: str | None = None

    def to_json(self) -> ReportJSON:
        skills = [{"name": s.name, "path": s.path} for s in self.skills]
        return {"runtime": self.runtime, "dest": self.dest, "ok": self.ok, "skills": skills,
                "error": self.error}


class Runtime(Protocol):
    """A place skill trees are pushed into.

    ``push`` receives trees that are already validated and free of collisions; it returns a
    report on success and raises :class:`~bootstrap.errors.BootstrapError` on failure.
    """

    @property
    def name(self) -> str: ...

    async def push(self, trees: Sequence[SkillTree], dest: str) -> PushReport: ...


def runtime_for(exec_prefix: str | None) -> Runtime:
    """The one registry of built-in runtimes: no prefix is this machine, a prefix is exec."""
    if exec_prefix is None:
        return LocalRuntime()
    return ExecRuntime.from_prefix(exec_prefix)


# --- local ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalRuntime:
    """A directory on this machine, written by :func:`bootstrap.publish.publish` (atomic swap)."""

    name: str = LOCAL

    async def push(self, trees: Sequence[SkillTree], dest: str) -> PushReport:
        # publish is blocking file I/O: a thread keeps the other runtimes' streams flowing.
        results = await asyncio.to_thread(_publish_trees, trees, Path(dest).expanduser())
        skills = tuple(PushedSkill(r.name, str(r.path)) for r in results)
        return PushReport(self.name, dest, ok=True, skills=skills)


def _publish_trees(trees: Sequence[SkillTree], into: Path) -> list[PublishResult]:
    from bootstrap.publish import publish

    # publish takes source paths and names each skill after its path. A symlinked source keeps
    # its own name (``foo -> store/foo-v2`` is "foo") but tree.root is resolved, so such trees
    # are passed through an alias link carrying the name.
    if all(t.root.name == t.name for t in trees):
        return list(publish([t.root for t in trees], into))
    with tempfile.TemporaryDirectory(prefix="kb-push-") as tmp:
        sources = []
        for t in trees:
            alias = Path(tmp) / t.name
            alias.symlink_to(t.root, target_is_directory=True)
            sources.append(alias)
        return list(publish(sources, into))


# --- exec -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecRuntime:
    """Any command prefix that runs a command in the target with our stdin attached."""

    argv: tuple[str, ...]

    @classmethod
    def from_prefix(cls, prefix: str) -> ExecRuntime:
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

    async def push(self, trees: Sequence[SkillTree], dest: str) -> PushReport:
        target = remote_dest(dest)
        token = secrets.token_hex(4)
        names = [t.name for t in trees]
        script = remote_script(target, names, token)
        shown = (*self.argv, "sh", "-c", "<push script>")  # the script itself is noise in errors
        what = f"push to {self.name} failed"
        stdout = await stream_to_process(self.command(script), tar_stream(trees), shown, what)
        if f"kb-push-ok {token}" not in stdout:
            # Exit 0 without the script's last line: the prefix lost the exit status (or ran
            # something else). Claiming success here would hide a sandbox without skills.
            raise BootstrapError(
                f"{what}: the runtime exited 0 but never confirmed the push; does the prefix "
                f"pass the command's exit status on?\n  command: {shlex.join(shown)}"
            )
        skills = tuple(PushedSkill(n, posixpath.join(target, n)) for n in names)
        return PushReport(self.name, dest, ok=True, skills=skills)

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
    """A shell word for ``path``; ``~`` and ``~/...`` mean the runtime's $HOME, as for scp."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"' + shlex.quote(path[1:])
    return shlex.quote(path)


# POSIX sh, busybox-portable: only mkdir, mv, rm, tar (-x -p -o -f - -C: the spellings GNU,
# busybox and bsdtar all accept; -o is no-same-owner, -p keeps exec bits for non-root), dirname,
# basename, kill -0, printf; `mountpoint` where present.
_SCRIPT: Final = r"""set -u
stage=
say() { printf 'kernel-bootstrap push: %s\n' "$*" >&2; }
cleanup() { if [ -n "$stage" ]; then rm -rf "$stage"; fi; }
fail() { say "$*"; cleanup; exit 1; }
trap 'cleanup; exit 1' HUP INT TERM
parent=$(dirname "$dest") && base=$(basename "$dest") || fail "bad destination $dest"
# Staging left by pushes that were killed (their shell no longer runs) goes first.
for old in "$parent/.$base.kb-push."* "$dest/.kb-push."*; do
  [ -d "$old" ] || continue
  pid=${old##*.}
  case $pid in ''|*[!0-9]*) continue ;; esac
  kill -0 "$pid" 2>/dev/null || rm -rf "$old"
done
mkdir -p "$dest" || fail "cannot create $dest"
# Staging sits next to DEST, so agents scanning DEST never see a half-extracted tree. The
# final rename must not cross a mount: when DEST is itself a mount point (a volume), or its
# parent is not writable, stage in a hidden directory inside DEST instead.
if mountpoint -q "$dest" 2>/dev/null || ! mkdir "$parent/.$base.kb-push.$token.$$" 2>/dev/null
then
  stage="$dest/.kb-push.$token.$$"
  mkdir "$stage" || fail "cannot create a staging directory in $dest"
else
  stage="$parent/.$base.kb-push.$token.$$"
fi
mkdir "$stage/new" "$stage/old" || fail "cannot create $stage"
hint="(docker and kubectl need -i to pass the stream on stdin)"
tar -x -p -o -f - -C "$stage/new" || fail "tar could not unpack the stream $hint"
[ -f "$stage/new/@MARKER@" ] || fail "the stream ended early; nothing was changed $hint"
for name in @NAMES@; do
  [ -d "$stage/new/$name" ] || fail "skill $name is missing from the stream"
done
# Each skill: old tree aside, new tree in (sh has no renameat2). Between the two renames
# DEST/name is absent for an instant; it never names a half-written tree. Signals are ignored
# from here on, so a dropped connection cannot stop us between the two renames.
trap '' HUP INT TERM PIPE
for name in @NAMES@; do
  if [ -e "$dest/$name" ] || [ -L "$dest/$name" ]; then
    mv "$dest/$name" "$stage/old/$name" || fail "cannot move the old $dest/$name aside"
  fi
  if ! mv "$stage/new/$name" "$dest/$name"; then
    if [ -e "$stage/old/$name" ]; then mv "$stage/old/$name" "$dest/$name"; fi
    fail "cannot move $name into $dest"
  fi
done
cleanup
echo "kb-push-ok $token"
"""


def remote_script(dest: str, names: Sequence[str], token: str) -> str:
    """The script run as ``sh -c``: extract the stream into staging, rename each skill in."""
    words = " ".join(shlex.quote(n) for n in names)
    body = _SCRIPT.replace("@NAMES@", words).replace("@MARKER@", COMPLETE_MARKER)
    return f"dest={_sh_path(dest)}\ntoken={shlex.quote(token)}\n{body}"


# --- the tar stream ---------------------------------------------------------------------------


def tar_stream(trees: Sequence[SkillTree], chunk: int = CHUNK) -> Iterator[bytes]:
    """An uncompressed tar of every tree (each under its name), in pieces of about ``chunk``.

    Memory stays bounded by ``chunk`` whatever the file sizes: contents are read while the
    stream is consumed. Headers come from :class:`tarfile.TarInfo` (pax only where a name
    needs it), so GNU tar, busybox and bsdtar read it.
    """
    return _coalesce(_members(trees, chunk), chunk)


def _members(trees: Sequence[SkillTree], chunk: int) -> Iterator[bytes]:
    for tree in trees:
        st = os.stat(tree.root)
        yield _header(tree.name, "dir", stat.S_IMODE(st.st_mode), st.st_mtime_ns)
        for e in tree.entries:
            yield _header(f"{tree.name}/{e.rel}", e.kind, e.mode, e.mtime_ns, e.size, e.target)
            if e.kind == "file":
                yield from _file_content(e, chunk)
    yield _header(COMPLETE_MARKER, "file", 0o644, 0)
    yield b"\0" * (2 * _BLOCK)  # end of archive


def _header(name: str, kind: str, mode: int, mtime_ns: int, size: int = 0,
            target: str | None = None) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = _KIND_TYPES[kind]
    info.mode = mode
    # Whole seconds: a float would add a pax record to every member for no reader's benefit.
    info.mtime = mtime_ns // 1_000_000_000
    info.size = size if kind == "file" else 0
    info.linkname = target or ""
    # Owners are not restored (tar -o); zeros keep our uid/user name out of the sandbox.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _file_content(e: Entry, chunk: int) -> Iterator[bytes]:
    """Exactly ``e.size`` bytes of the file and the block padding, a chunk at a time."""
    remaining = e.size
    try:
        # O_NOFOLLOW: the walk saw a regular file; a symlink swapped in since is not followed.
        fd = os.open(e.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with open(fd, "rb", buffering=0) as f:
            while remaining:
                data = f.read(min(chunk, remaining))
                if not data:
                    raise BootstrapError(f"{e.path}: the file shrank while it was being pushed; "
                                         "push again")
                remaining -= len(data)
                yield data
    except OSError as err:
        raise BootstrapError(f"{e.path}: cannot read while pushing: {err.strerror}") from None
    if pad := -e.size % _BLOCK:
        yield b"\0" * pad


def _coalesce(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """Join small pieces (headers, small files) into writes of about ``size`` bytes; pad the
    stream to whole tar records, as tar itself writes them."""
    buf = bytearray()
    total = 0
    for piece in pieces:
        total += len(piece)
        if not buf and len(piece) >= size:
            yield piece
            continue
        buf += piece
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
    buf += b"\0" * (-total % _RECORD)
    if buf:
        yield bytes(buf)


# --- one process, fed a stream ----------------------------------------------------------------


async def stream_to_process(
    cmd: Sequence[str], chunks: Iterator[bytes], shown: tuple[str, ...], what: str
) -> str:
    """Run ``cmd`` with ``chunks`` on its stdin; return its stdout, raise ProcessError if it
    fails. A local error while producing ``chunks`` is raised after the process has ended."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=child_env(),
        )
    except FileNotFoundError as e:
        raise ProcessError(shown, 127, f"{e.filename}: not found", what) from None
    except PermissionError as e:
        raise ProcessError(shown, 126, str(e), what) from None
    assert proc.stdin and proc.stdout and proc.stderr, "BUG: pipes were requested"
    out = asyncio.ensure_future(_read_tail(proc.stdout))
    err = asyncio.ensure_future(_read_tail(proc.stderr))
    try:
        local_error = await _feed(proc.stdin, chunks)
        if local_error is not None:
            await _await_exit(proc)
            raise local_error
        returncode = await proc.wait()
        stdout, stderr = await out, await err
    finally:
        if proc.returncode is None:  # cancelled (^C) or our own bug: do not leave it running
            await _stop(proc)
        out.cancel()
        err.cancel()
    if returncode != 0:
        raise ProcessError(shown, returncode, stderr.decode(errors="replace"), what)
    return stdout.decode(errors="replace")


async def _feed(stdin: asyncio.StreamWriter, chunks: Iterator[bytes]) -> BootstrapError | None:
    """Write the stream; a runtime that stops reading is not an error here (its exit status
    says why). A local error is returned after closing stdin without the end marker."""
    failed: BootstrapError | None = None
    try:
        for data in chunks:
            stdin.write(data)
            await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    except BootstrapError as e:
        failed = e
    except OSError as e:  # e.g. the skill root vanished: still ours, still before any swap
        failed = BootstrapError(f"cannot read a skill while pushing: {e}")
    stdin.close()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await stdin.wait_closed()
    return failed


async def _await_exit(proc: asyncio.subprocess.Process, timeout: float = _DRAIN_TIMEOUT) -> None:
    """After an aborted stream the script fails (no marker) and cleans up; give it time."""
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Stop a runtime we are abandoning (^C): EOF first, then SIGTERM, not SIGKILL, so the
    script's trap (or ssh/docker/kubectl hanging up on the far side) removes the staging."""
    if proc.stdin is not None:
        proc.stdin.close()
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    await _await_exit(proc, timeout=5.0)


async def _read_tail(stream: asyncio.StreamReader) -> bytes:
    buf = bytearray()
    while data := await stream.read(65536):
        buf += data
        if len(buf) > _TAIL_LIMIT:
            del buf[:-_TAIL_LIMIT]
    return bytes(buf)

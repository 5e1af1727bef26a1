"""The snapshot store: prebuilt venvs keyed by runtime identity and platform.

Benchmark fleets start hundreds of fresh sandboxes that all build byte-for-byte the same
environment (the system we learn from paid 13-16 s of install each time). After a successful
rebuild we archive the relocatable venv, marker included; a later rebuild of the same key on
the same platform extracts it instead of running ``uv venv`` and the runtime install.

An archive is written under a temp name and renamed, so readers never see a partial one, and
concurrent writers of one key are harmless (same content, last rename wins). A store that is
read-only or full only costs a warning. A bad archive (truncated, corrupt, wrong key, unsafe
members, failing validation) is a warning naming it, then a normal build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from bootstrap import log, process
from bootstrap.atomic import fsync_dir, temp_name
from bootstrap.config import Config
from bootstrap.errors import BootstrapError, ProcessError
from bootstrap.identity import runtime_inputs
from bootstrap.marker import RuntimeRecord, read_marker, write_marker
from bootstrap.uv import Uv

if TYPE_CHECKING:
    import tarfile  # a restore never imports it (~5 ms): only writing an archive does

SUFFIX: Final = ".tar"
MANIFEST: Final = "kernel-bootstrap-snapshot.json"
TOP: Final = "venv"
_PLATFORM_SCRIPT: Final = (
    "import json, platform, sys; print(json.dumps({'python_version': platform.python_version(),"
    " 'implementation': sys.implementation.name, 'os': sys.platform,"
    " 'machine': platform.machine(), 'libc': '-'.join(platform.libc_ver()) or 'none'}))"
)
_BLOCK: Final = 512
_CHUNK: Final = 1 << 18  # read, vetted and handed to tar this much at a time
_PIPE: Final = 1 << 20  # tar's stdin holds this much (Linux): room for a few chunks
_ZERO_BLOCK: Final = bytes(_BLOCK)
_END: Final = bytes(2 * _BLOCK)
_GNU_MAGIC: Final = b"ustar  \0"  # magic and version as one field: GNU, not POSIX "ustar\x0000"
_LONG: Final = (b"L", b"K")  # GNU long name and long link name: the name is the data
_MAX_LONG: Final = 4096  # PATH_MAX; a longer name is not one Store.write wrote
_KINDS: Final = (b"0", b"1", b"2", b"5")  # file ("\0" is read as "0"), hard link, symlink, dir


class BadSnapshot(Exception):
    """Why an archive cannot be used; always turned into a warning plus a normal build."""


@dataclass(frozen=True)
class Platform:
    python_version: str
    implementation: str
    os: str
    machine: str
    libc: str

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Snapshot:
    key: str
    path: Path
    size: int
    created: float
    platform: dict[str, str]


def platform_of(uv: Uv, request: str) -> Platform:
    """The platform of the interpreter ``uv venv --python request`` would use.

    Every field of a Platform is a property of the binary that runs, and for an absolute path
    ``uv venv`` runs that very binary (uv 0.13.9 keeps the path as given, takes a venv's base
    interpreter, and a pyenv shim's target). So the interpreter running us (the default) is
    answered in-process, another absolute path is probed directly, and only a request such as
    "3.11" asks ``uv python find`` first (with the probe, ~0.1 s of every restore).
    """
    import platform

    if _is_running_interpreter(request):
        return local_platform(platform.python_version())
    python = Path(request) if _is_executable(request) else _find_python(uv, request)
    raw = process.run(python, "-I", "-c", _PLATFORM_SCRIPT,
                      what=f"the interpreter {python} does not run").stdout
    return Platform(**json.loads(raw))


def _is_running_interpreter(request: str) -> bool:
    # realpath, not samefile: a hard link elsewhere would find another prefix's stdlib.
    return os.path.isabs(request) and os.path.realpath(request) == os.path.realpath(
        sys.executable)


def _is_executable(request: str) -> bool:
    return os.path.isabs(request) and os.path.isfile(request) and os.access(request, os.X_OK)


def _find_python(uv: Uv, request: str) -> Path:
    found = uv.run("python", "find", "--system", request,
                   what=f"uv found no interpreter for {request!r}")
    return Path(found.stdout.strip().splitlines()[-1])


def snapshot_key(config: Config, platform: Platform) -> str:
    """Runtime identity inputs plus the platform: never restored where it was not built."""
    inputs = dict(runtime_inputs(config, platform.python_version))
    blob = json.dumps({"runtime": inputs, "platform": platform.as_dict()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, key: str) -> Path:
        return self.root / f"{key}{SUFFIX}"

    def has(self, key: str) -> bool:
        return self.path_for(key).is_file()

    # -- writing -----------------------------------------------------------------------------
    def write(self, venv: Path, key: str, platform: Platform) -> Path | None:
        """Archive ``venv``; a store we cannot write is a warning, never a failure."""
        import tarfile

        target = self.path_for(key)
        tmp = temp_name(target)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            manifest = {"key": key, "platform": platform.as_dict(), "created": time.time(),
                        "source": str(venv), "format": 1}
            # GNU format, the only one a restore accepts (see _Reader): PAX, the default, adds
            # an extended header per member for sub-second mtimes, doubling the headers to vet.
            with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
                _add_bytes(tar, MANIFEST, json.dumps(manifest).encode())
                tar.add(venv, arcname=TOP, filter=_skip_locks)
            _fsync(tmp)
            os.replace(tmp, target)
            fsync_dir(self.root)
        except OSError as e:
            log.warning("could not write the snapshot; continuing without it",
                        snapshot=str(target), error=e.strerror or str(e))
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return None
        log.info("snapshot written", snapshot=str(target), bytes=target.stat().st_size)
        return target

    # -- reading -----------------------------------------------------------------------------
    def restore(self, key: str, into: Path, platform: Platform) -> Path:
        """Extract the snapshot for ``key`` under ``into``; return the venv tree's path.

        The archive is read in large chunks into our own buffer; every header in a chunk is
        vetted (see :class:`_Reader`) and only then is the vetted prefix handed to the system
        ``tar``, so the bytes it extracts are exactly the bytes we vetted and an unsafe member
        never reaches it. Raises BadSnapshot (naming the archive) for anything that makes it
        unusable.
        """
        archive = self.path_for(key)
        try:
            with archive.open("rb", buffering=0) as f:
                reader = _Reader(f, archive)
                manifest = reader.manifest()
                if manifest.get("key") != key or manifest.get("platform") != platform.as_dict():
                    raise BadSnapshot(f"{archive}: built for another key or platform")
                into.mkdir(parents=True)
                _extract(reader, into)
        except OSError as e:
            raise BadSnapshot(f"{archive}: unreadable archive: {e}") from None
        venv = into / TOP
        if not (venv / "pyvenv.cfg").is_file():
            raise BadSnapshot(f"{archive}: holds no venv")
        return venv

    def entries(self) -> list[Snapshot]:
        found: list[Snapshot] = []
        try:
            paths = sorted(self.root.glob(f"*{SUFFIX}"))
        except OSError:
            return []
        for path in paths:
            if path.name.startswith("."):
                continue
            found.append(_describe(path))
        return found

    def prune(self, keep: int | None, older_than_days: float | None) -> list[Path]:
        """Remove snapshots beyond the newest ``keep`` and those older than the given age."""
        snapshots = sorted(self.entries(), key=lambda s: s.created, reverse=True)
        cutoff = time.time() - older_than_days * 86400 if older_than_days is not None else None
        removed: list[Path] = []
        for index, snap in enumerate(snapshots):
            if (keep is not None and index >= keep) or (cutoff is not None
                                                         and snap.created < cutoff):
                snap.path.unlink(missing_ok=True)
                removed.append(snap.path)
        for leftover in self.root.glob(f".*{SUFFIX}.tmp-*"):
            if _pid_dead(leftover.name):
                leftover.unlink(missing_ok=True)
                removed.append(leftover)
        return removed


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    import io
    import tarfile

    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _skip_locks(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    # uv's own venv lock is per machine state, not part of the environment.
    return None if info.name == f"{TOP}/.lock" else info


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Reader:
    """Vets an archive in the one format :meth:`Store.write` produces, chunk by chunk.

    GNU tar: ustar-style headers with the GNU magic, plus GNU 'L' (long name) and 'K' (long
    link) headers; members are files, hard links, symlinks and directories. Anything else (pax
    headers, devices, fifos, sparse files, GNU extension fields, a bad checksum, an archive that
    ends early) is a BadSnapshot. tarfile spent ~20 us a header (a 9k-file venv has 12k
    headers), longer than ``tar -x`` took for the whole tree; this reader spends ~8 us. The
    member rules are lexical (no realpath) and listed in :func:`_member_problem`.
    """

    def __init__(self, file: IO[bytes], archive: Path) -> None:
        self.file = file
        self.archive = archive
        self.buf = b""
        self.pos = 0  # where vetting continues in buf
        self.skip = 0  # data bytes (with padding) of the current file not yet in buf
        self.done = False  # the end-of-archive block has been vetted
        self.links: set[str] = set()

    def bad(self, why: str) -> BadSnapshot:
        return BadSnapshot(f"{self.archive}: {why}")

    def manifest(self) -> dict[str, Any]:
        """The first member, which must be the manifest; read before anything is extracted."""
        self.buf = self.file.read(_CHUNK)
        if len(self.buf) < _BLOCK or self.buf[:_BLOCK] == _ZERO_BLOCK:
            raise self.bad("no manifest; not a kernel-bootstrap snapshot")
        kind, size, mode = self._fields(self.buf[:_BLOCK])
        if kind != b"0" or _cstr(self.buf, 0, 100) != MANIFEST.encode() or mode & 0o6000:
            raise self.bad("no manifest; not a kernel-bootstrap snapshot")
        if _BLOCK + size > len(self.buf):
            raise self.bad("corrupt manifest")
        try:
            data = json.loads(self.buf[_BLOCK:_BLOCK + size])
        except ValueError:
            raise self.bad("corrupt manifest") from None
        if not isinstance(data, dict):
            raise self.bad("corrupt manifest")
        # Extracted beside the venv tree, harmless. Its padding may lie beyond this chunk.
        self.pos, self.skip = _BLOCK, _padded(size)
        return data

    def vetted(self) -> Iterator[memoryview]:
        """The archive's bytes, each run only once every header in it is vetted, then the
        end-of-archive blocks. Call after :meth:`manifest`."""
        while True:
            end = self._scan()
            if end:
                yield memoryview(self.buf)[:end]
            if self.done:
                yield memoryview(_END)  # tar stops here: trailing bytes are never sent
                return
            more = self.file.read(_CHUNK)
            if not more:
                raise self.bad("truncated: the archive ends inside a member")
            # Only an incomplete header group is carried over (a few KiB at most).
            self.buf = self.buf[end:] + more
            self.pos -= end

    def _scan(self) -> int:
        """Vet from ``pos`` as far as ``buf`` holds whole headers; return that offset."""
        buf, pos = self.buf, self.pos
        while not self.done:
            if self.skip:
                step = min(self.skip, len(buf) - pos)
                pos += step
                self.skip -= step
                if self.skip:
                    break
            after = self._member(buf, pos)
            if after is None:
                break
            pos = after
        self.pos = pos
        return pos

    def _member(self, buf: bytes, pos: int) -> int | None:
        """Vet the header group at ``pos`` (long-name headers, then the member's); return the
        offset of its data, or None if ``buf`` ends inside the group."""
        longs: dict[bytes, bytes] = {}
        while len(buf) - pos >= _BLOCK:
            header = buf[pos:pos + _BLOCK]
            if header == _ZERO_BLOCK:
                if longs:
                    raise self.bad("a GNU long name header with no member after it")
                self.done = True
                return pos + _BLOCK
            kind, size, mode = self._fields(header)
            pos += _BLOCK
            if kind in _LONG:
                if kind in longs or not 1 < size <= _MAX_LONG:
                    raise self.bad("malformed GNU long name header")
                if pos + size > len(buf):
                    return None
                value = buf[pos:pos + size]
                if value.find(0) != size - 1:
                    raise self.bad("malformed GNU long name header")
                longs[kind] = value[:-1]
                pos += _padded(size)
                continue
            name = longs.get(b"L") or _cstr(header, 0, 100)
            link = longs.get(b"K") or _cstr(header, 157, 257)
            self._admit(kind, _text(name), _text(link), size, mode)
            self.skip = _padded(size) if kind == b"0" else 0
            return pos
        return None

    def _fields(self, header: bytes) -> tuple[bytes, int, int]:
        """Type (``\\0`` read as ``0``), size and mode of one header, after its checksum."""
        try:
            stored = _octal(header[148:156])
            size = _number(header[124:136])
            mode = _octal(header[100:108])
        except ValueError:
            raise self.bad("corrupt header (not a number where one belongs)") from None
        # The checksum field itself counts as eight spaces (8 * 0x20).
        if stored != sum(header) - sum(header[148:156]) + 256:
            raise self.bad("corrupt header (checksum mismatch)")
        if header[257:265] != _GNU_MAGIC:
            raise self.bad("not the GNU tar format kernel-bootstrap writes (a pax or v7 header)")
        # GNU keeps atime, ctime and sparse maps there; Store.write leaves them empty, and tar
        # implementations differ on what they mean: nothing we do not read may reach tar.
        if header.count(0, 345) != _BLOCK - 345:
            raise self.bad("unexpected GNU extension fields in a header")
        kind = header[156:157]
        return (b"0" if kind == b"\0" else kind), size, mode

    def _admit(self, kind: bytes, name: str, link: str, size: int, mode: int) -> None:
        if kind == b"5":
            name = name.removesuffix("/")  # tarfile writes directory names with a slash
        problem = _member_problem(name, kind, link, mode, self.links)
        if problem is None and size and kind != b"0":
            problem = "a link or directory carrying data"
        if problem:
            raise self.bad(f"unsafe member {name!r}: {problem}")
        if kind in (b"1", b"2"):
            self.links.add(name)


def _member_problem(name: str, kind: bytes, link: str, mode: int, links: set[str]) -> str | None:
    """Why a member could write outside the venv tree, or None.

    Names stay under ``venv/`` with no ``..``, ``.`` or empty parts; only files, directories
    and links; no setuid bits; no member reached through (or replacing) a link; relative links
    stay inside, and the only absolute links are the venv's own ``bin/python*`` pointing at its
    base interpreter (a venv cannot work without those).
    """
    if kind not in _KINDS:
        return f"not a file, directory or link (type {kind!r})"
    parts = name.split("/")
    if parts[0] != TOP or "" in parts or "." in parts or ".." in parts:
        return "outside the venv"
    if mode & 0o6000:
        return "setuid or setgid"
    if _through_link(name, links) or name in links:
        return "reached through a link"
    if kind == b"2" and (os.path.isabs(link) or link.startswith("/")):
        if len(parts) == 3 and parts[1] in ("bin", "Scripts") and parts[2].startswith("python"):
            return None
        return f"absolute link to {link!r}"
    if kind in (b"1", b"2"):
        target = os.path.normpath(os.path.join(os.path.dirname(name) if kind == b"2" else "",
                                               link))
        if not link or (target != TOP and not target.startswith(TOP + "/")):
            return f"link leaving the venv to {link!r}"
        # tar's link() follows links on the way to its target, and a hard link to a symlink
        # moves the symlink's relative target to another directory.
        if kind == b"1" and (target in links or _through_link(target, links)):
            return f"hard link through a link to {link!r}"
    return None


def _through_link(name: str, links: set[str]) -> bool:
    """Whether a proper prefix of ``name`` is a link (one set lookup per level)."""
    cut = name.find("/")
    while cut != -1 and links:
        if name[:cut] in links:
            return True
        cut = name.find("/", cut + 1)
    return False


def _octal(field: bytes) -> int:
    # Strict: octal digits then NULs or spaces, as tarfile writes them. int() alone would also
    # take "+", "_" and whitespace, which tar reads differently (or not at all).
    digits = field.rstrip(b" \0")
    if not digits or digits.translate(None, b"01234567"):
        raise ValueError(field)
    return int(digits, 8)


def _number(field: bytes) -> int:
    # GNU base-256 (first byte 0x80): tarfile writes sizes of 8 GiB and more that way.
    return int.from_bytes(field[1:], "big") if field[:1] == b"\x80" else _octal(field)


def _cstr(buf: bytes, start: int, end: int) -> bytes:
    nul = buf.find(0, start, end)
    return buf[start:nul if nul != -1 else end]


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")  # as tarfile and tar name files


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


def _extract(reader: _Reader, into: Path) -> None:
    """Hand ``tar -x`` the vetted bytes, one chunk per write, while vetting the next chunk."""
    import shutil
    import subprocess

    tar_exe = shutil.which("tar")
    if tar_exe is None:
        _extract_with_tarfile(reader, into)
        return
    # -p keeps exec bits under any umask; -o does not chown to the archive's owners. Not
    # process.run: we write its stdin while we parse, which run() cannot do.
    argv = (tar_exe, "-x", "-p", "-o", "-f", "-", "-C", str(into))
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=err,
                                env=process.child_env())
        assert proc.stdin is not None
        _grow_pipe(proc.stdin)
        try:
            for run in reader.vetted():
                proc.stdin.write(run)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # tar stopped reading; its exit code and stderr say why
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if proc.wait() != 0:
            err.seek(0)
            raise ProcessError(argv, proc.returncode, err.read().decode(errors="replace"),
                               "tar could not extract the snapshot")


def _grow_pipe(pipe: IO[bytes]) -> None:
    # In a 64 KiB pipe each chunk waits for tar to drain it (a restore took 1.4x longer); with
    # room for several we vet the next one while tar writes files. Linux, up to pipe-max-size.
    if sys.platform != "linux":
        return
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _PIPE)


def _extract_with_tarfile(reader: _Reader, into: Path) -> None:
    """No system tar: extract with tarfile from a private copy of exactly the vetted bytes."""
    import tarfile

    with tempfile.TemporaryFile() as copy:
        for run in reader.vetted():
            copy.write(run)
        copy.seek(0)
        try:
            with tarfile.open(fileobj=copy, mode="r:") as tar:
                tar.extractall(into, filter="fully_trusted")  # vetted above
        except tarfile.TarError as e:
            raise BadSnapshot(f"{reader.archive}: unreadable archive: {e}") from None


def _describe(path: Path) -> Snapshot:
    size = path.stat().st_size
    platform: dict[str, str] = {}
    created = path.stat().st_mtime
    try:
        with path.open("rb", buffering=0) as f:
            manifest = _Reader(f, path).manifest()
        platform = manifest.get("platform", {})
        created = float(manifest.get("created", created))
    except (BadSnapshot, OSError, ValueError, TypeError):
        platform = {"error": "unreadable"}
    return Snapshot(path.name.removesuffix(SUFFIX), path, size, created, platform)


def _pid_dead(name: str) -> bool:
    # temp names are ".<target>.tmp-<pid>-<token>"
    try:
        pid = int(name.rsplit(".tmp-", 1)[1].split("-")[0])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def local_platform(python_version: str) -> Platform:
    """The platform as seen from this process: no child (``status``, and a restore for the
    interpreter running us). The same expressions as ``_PLATFORM_SCRIPT``: ``libc_ver()`` asks
    the libc loaded in this process (glibc's confstr), not the executable's file, which names
    an older symbol version (2.34 where confstr says 2.36 here).
    """
    import platform

    libc = "-".join(platform.libc_ver()) or "none"
    return Platform(python_version, sys.implementation.name, sys.platform, platform.machine(),
                    libc)


class Plan:
    """The snapshot side of one rebuild: which key, whether the store has it, and saving."""

    def __init__(self, store: Store, key: str, platform: Platform) -> None:
        self.store = store
        self.key = key
        self.platform = platform
        self.restored = False

    @property
    def archive(self) -> Path:
        return self.store.path_for(self.key)

    @property
    def available(self) -> bool:
        return self.store.has(self.key)

    def extract(self, staging: Path) -> Path:
        return self.store.restore(self.key, staging, self.platform)

    def adopt_marker(self, venv: Path, runtime: RuntimeRecord) -> None:
        """Check the snapshot's marker is for this runtime; point it at the live interpreter.

        Its skill records stay: the sync then installs only what they do not already cover.
        """
        data = read_marker(venv).data
        if data is None or data["runtime"]["identity"] != runtime["identity"]:
            raise BadSnapshot(f"{self.archive}: its marker is for another runtime")
        data["runtime"] = runtime
        write_marker(venv, data)

    def save(self, venv: Path) -> None:
        self.store.write(venv, self.key, self.platform)


def plan(config: Config, uv: Uv) -> Plan | None:
    """The snapshot plan for a rebuild of ``config``; None without a store (or a platform)."""
    if config.snapshots is None:
        return None
    try:
        found = platform_of(uv, config.python)
    except BootstrapError as e:
        log.warning("snapshots skipped: could not identify the interpreter", error=str(e))
        return None
    return Plan(Store(config.snapshots), snapshot_key(config, found), found)

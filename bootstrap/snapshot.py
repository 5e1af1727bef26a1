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
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from bootstrap import log, process
from bootstrap.atomic import fsync_dir, temp_name
from bootstrap.config import Config
from bootstrap.errors import BootstrapError, ProcessError
from bootstrap.identity import runtime_inputs
from bootstrap.marker import RuntimeRecord, read_marker, write_marker
from bootstrap.uv import Uv

SUFFIX: Final = ".tar"
MANIFEST: Final = "kernel-bootstrap-snapshot.json"
TOP: Final = "venv"
_PLATFORM_SCRIPT: Final = (
    "import json, platform, sys; print(json.dumps({'python_version': platform.python_version(),"
    " 'implementation': sys.implementation.name, 'os': sys.platform,"
    " 'machine': platform.machine(), 'libc': '-'.join(platform.libc_ver()) or 'none'}))"
)


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


def platform_of(uv: Uv, request: str) -> tuple[Path, Platform]:
    """The interpreter ``request`` resolves to (as ``uv venv`` would pick it) and its platform."""
    found = uv.run("python", "find", "--system", request,
                   what=f"uv found no interpreter for {request!r}")
    python = Path(found.stdout.strip().splitlines()[-1])
    raw = process.run(python, "-I", "-c", _PLATFORM_SCRIPT,
                      what=f"the interpreter {python} does not run").stdout
    return python, Platform(**json.loads(raw))


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
        target = self.path_for(key)
        tmp = temp_name(target)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            manifest = {"key": key, "platform": platform.as_dict(), "created": time.time(),
                        "source": str(venv), "format": 1}
            # GNU format: PAX (the default) adds an extended header per member for sub-second
            # mtimes, doubling the headers a restore has to vet.
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

        Each member is vetted before the system ``tar`` is given its bytes, so vetting and
        extracting overlap and an unsafe member never reaches ``tar``. (tarfile's own extraction
        with its safety filter costs a realpath per member, ~2x the physical copy for a venv of
        8k files.) Raises BadSnapshot (naming the archive) for anything that makes it unusable.
        """
        archive = self.path_for(key)
        try:
            with archive.open("rb") as f, archive.open("rb") as raw, \
                    tarfile.open(fileobj=f, mode="r:") as tar:
                manifest = _manifest(tar, archive)
                if manifest.get("key") != key or manifest.get("platform") != platform.as_dict():
                    raise BadSnapshot(f"{archive}: built for another key or platform")
                into.mkdir(parents=True)
                _extract_vetted(tar, raw, into, archive)
        except (tarfile.TarError, OSError, EOFError, ValueError) as e:
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


def _manifest(tar: tarfile.TarFile, archive: Path) -> dict[str, Any]:
    first = tar.next()
    if first is None or first.name != MANIFEST or not first.isfile():
        raise BadSnapshot(f"{archive}: no manifest; not a kernel-bootstrap snapshot")
    handle = tar.extractfile(first)
    if handle is None:
        raise BadSnapshot(f"{archive}: unreadable manifest")
    try:
        data = json.loads(handle.read(1 << 20))
    except ValueError:
        raise BadSnapshot(f"{archive}: corrupt manifest") from None
    if not isinstance(data, dict):
        raise BadSnapshot(f"{archive}: corrupt manifest")
    return data


def _vetted(tar: tarfile.TarFile, archive: Path) -> Iterator[tarfile.TarInfo]:
    """Every member, refusing the archive if any could write outside the venv tree.

    Judged lexically (no realpath): names stay under ``venv/`` with no ``..``; only files,
    directories and links; no setuid bits; no member reached through a link; relative links
    stay inside, and the only absolute links are the venv's own ``bin/python*`` pointing at its
    base interpreter (a venv cannot work without those).
    """
    links: set[str] = set()
    for member in tar:
        if member.name == MANIFEST and member.isfile():
            continue  # read already; extracted beside the venv tree, harmless
        problem = _member_problem(member, links)
        if problem:
            raise BadSnapshot(f"{archive}: unsafe member {member.name!r}: {problem}")
        if member.issym() or member.islnk():
            links.add(member.name)
        yield member


def _member_problem(member: tarfile.TarInfo, links: set[str]) -> str | None:
    name = member.name
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or parts[0] != TOP:
        return "outside the venv"
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return "not a file, directory or link"
    if member.mode & 0o6000:
        return "setuid or setgid"
    if any("/".join(parts[:i]) in links for i in range(1, len(parts))):
        return "reached through a link"
    if member.issym() and os.path.isabs(member.linkname):
        if len(parts) == 3 and parts[1] in ("bin", "Scripts") and parts[2].startswith("python"):
            return None
        return f"absolute link to {member.linkname!r}"
    if member.issym() or member.islnk():
        base = os.path.dirname(name) if member.issym() else ""
        target = os.path.normpath(os.path.join(base, member.linkname))
        if target != TOP and not target.startswith(TOP + "/"):
            return f"link leaving the venv to {member.linkname!r}"
    return None


def _extract_vetted(tar: tarfile.TarFile, raw: IO[bytes], into: Path, archive: Path) -> None:
    """Feed ``tar -x`` the archive's bytes member by member, each only once it is vetted."""
    import shutil
    import subprocess

    tar_exe = shutil.which("tar")
    if tar_exe is None:
        members = list(_vetted(tar, archive))
        tar.extractall(into, members=members, filter="fully_trusted")  # vetted above
        return
    # -p keeps exec bits under any umask; -o does not chown to the archive's owners. Not
    # process.run: we write its stdin while we parse, which run() cannot do.
    argv = (tar_exe, "-x", "-p", "-o", "-f", "-", "-C", str(into))
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=err,
                                env=process.child_env())
        assert proc.stdin is not None
        try:
            sent = 0
            for member in _vetted(tar, archive):
                end = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * \
                    tarfile.BLOCKSIZE
                _copy(raw, proc.stdin, end - sent)
                sent = end
            shutil.copyfileobj(raw, proc.stdin, 1 << 20)  # the end-of-archive blocks
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


def _copy(src: IO[bytes], dst: IO[bytes], n: int) -> None:
    while n > 0:
        chunk = src.read(min(n, 1 << 20))
        if not chunk:
            raise EOFError("archive ends inside a member")
        dst.write(chunk)
        n -= len(chunk)


def _describe(path: Path) -> Snapshot:
    size = path.stat().st_size
    platform: dict[str, str] = {}
    created = path.stat().st_mtime
    try:
        with tarfile.open(path, "r:") as tar:
            manifest = _manifest(tar, path)
        platform = manifest.get("platform", {})
        created = float(manifest.get("created", created))
    except (BadSnapshot, tarfile.TarError, OSError, EOFError, ValueError, TypeError):
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
    """The platform as seen from this process, for read-only questions (``status``): no child.

    ``platform.libc_ver()`` reads our own executable; the interpreter a venv runs on this
    machine links the same libc.
    """
    import platform
    import sys

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
        _, found = platform_of(uv, config.python)
    except BootstrapError as e:
        log.warning("snapshots skipped: could not identify the interpreter", error=str(e))
        return None
    return Plan(Store(config.snapshots), snapshot_key(config, found), found)

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

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from bootstrap import log, process
from bootstrap.archive import MANIFEST as MANIFEST  # re-exported: part of the format
from bootstrap.archive import TOP, extract, open_for, open_snapshot, write_snapshot
from bootstrap.archive import BadSnapshot as BadSnapshot  # what callers catch
from bootstrap.cloud import Bucket, Unavailable
from bootstrap.config import Config
from bootstrap.errors import BootstrapError
from bootstrap.fs import fsync_dir, open_regular, owner_pid, pid_alive, remove_quietly, temp_name
from bootstrap.identity import runtime_inputs
from bootstrap.marker import RuntimeRecord, read_marker, write_marker
from bootstrap.uv import Uv

if TYPE_CHECKING:
    from bootstrap.bucket import BucketStore

SUFFIX: Final = ".tar"
_PLATFORM_SCRIPT: Final = (
    "import json, platform, sys; print(json.dumps({'python_version': platform.python_version(),"
    " 'implementation': sys.implementation.name, 'os': sys.platform,"
    " 'machine': platform.machine(), 'libc': '-'.join(platform.libc_ver()) or 'none'}))"
)


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
                   what=f"uv found no interpreter for {request!r}", index=False)
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
        target = self.path_for(key)
        tmp = temp_name(target)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(tmp, "xb") as out:
                write_snapshot(out, venv, key, platform.as_dict())
                out.flush()
                os.fsync(out.fileno())
            # Readers never see a partial archive: it appears under its key only when whole.
            os.replace(tmp, target)
            fsync_dir(self.root)
        except OSError as e:
            log.warning("could not write the snapshot; continuing without it",
                        snapshot=str(target), error=e.strerror or str(e))
            remove_quietly(tmp)
            return None
        log.info("snapshot written", snapshot=str(target), bytes=target.stat().st_size)
        return target

    # -- reading -----------------------------------------------------------------------------
    def restore(self, key: str, into: Path, platform: Platform) -> Path:
        """Extract the snapshot for ``key`` under ``into``; return the venv tree's path.

        The archive is read in large chunks into our own buffer; every header in a chunk is
        vetted (:class:`bootstrap.archive.Reader`) and only then is the vetted prefix handed to
        the system ``tar``, so the bytes it extracts are exactly the bytes we vetted and an
        unsafe member never reaches it. Raises BadSnapshot (naming the archive) for anything
        that makes it unusable.
        """
        archive = self.path_for(key)
        try:
            with _open_archive(archive) as f:
                reader = open_for(f, archive, key, platform.as_dict())
                into.mkdir(parents=True)
                extract(reader, into)
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


def _open_archive(path: Path) -> IO[bytes]:
    """``path`` opened for reading if it is a regular file: the store may be shared, and a
    FIFO or device planted under a key must be a bad snapshot, not a hang or an endless read."""
    # A store shared through symlinks is fine: follow a link at the archive's own name.
    return open(open_regular(path, follow=True), "rb", buffering=0)


def _describe(path: Path) -> Snapshot:
    size = path.stat().st_size
    platform: dict[str, str] = {}
    created = path.stat().st_mtime
    try:
        with _open_archive(path) as f:
            manifest, _ = open_snapshot(f, path)
        platform = manifest.get("platform", {})
        created = float(manifest.get("created", created))
    except (BadSnapshot, OSError, ValueError, TypeError):
        platform = {"error": "unreadable"}
    return Snapshot(path.name.removesuffix(SUFFIX), path, size, created, platform)


def _pid_dead(name: str) -> bool:
    pid = owner_pid(name, "tmp")  # temp names are ".<target>.tmp-<pid>-<token>"
    return pid is not None and not pid_alive(pid)


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

    def __init__(self, store: Store | BucketStore, key: str, platform: Platform) -> None:
        self.store = store
        self.key = key
        self.platform = platform

    @property
    def archive(self) -> Path | str:
        return self.store.path_for(self.key)

    @property
    def available(self) -> bool:
        return self.store.has(self.key) is True  # a bucket answers None when unreachable

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
        store = open_store(config.snapshots)
    except Unavailable as e:
        log.warning(f"{e}; building without snapshots", store=str(config.snapshots))
        return None
    try:
        found = platform_of(uv, config.python)
    except BootstrapError as e:
        log.warning("snapshots skipped: could not identify the interpreter", error=str(e))
        return None
    return Plan(store, snapshot_key(config, found), found)


def open_store(location: Path | Bucket) -> Store | BucketStore:
    """The store at ``location``: a directory, or a bucket (:class:`bootstrap.cloud.Unavailable`
    when the ``cloud`` extra is not installed)."""
    if isinstance(location, Path):
        return Store(location)
    from bootstrap.bucket import BucketStore

    return BucketStore(location.url)

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
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from bootstrap import places
from bootstrap.config import Bucket, Config
from bootstrap.env.identity import runtime_inputs
from bootstrap.env.platform import Platform
from bootstrap.errors import ConfigError
from bootstrap.primitives import log
from bootstrap.primitives.atomic import writing
from bootstrap.primitives.fs import (
    open_regular,
    owner_pid,
    pid_alive,
)
from bootstrap.primitives.tar import BadArchive
from bootstrap.snapshots.archive import MANIFEST as MANIFEST  # re-exported: part of the format
from bootstrap.snapshots.archive import (
    TOP,
    Snapshot,
    extract,
    open_for,
    open_snapshot,
    write_snapshot,
)

if TYPE_CHECKING:
    from bootstrap.snapshots.bucket import BucketStore

SUFFIX: Final = ".tar"


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
        try:
            places.make_dir(self.root, owned=False)
            # Readers never see a partial archive: it appears under its key only when whole.
            with writing(target) as out:
                write_snapshot(out, venv, key, platform.as_dict())
        except OSError as e:
            log.warning("could not write the snapshot; continuing without it",
                        snapshot=str(target), error=e.strerror or str(e))
            return None
        log.info("snapshot written", snapshot=str(target), bytes=target.stat().st_size)
        return target

    # -- reading -----------------------------------------------------------------------------
    def restore(self, key: str, into: Path, platform: Platform) -> Path:
        """Extract the snapshot for ``key`` under ``into``; return the venv tree's path.

        The archive is read in large chunks into our own buffer; every header in a chunk is
        vetted (:class:`archive.Reader`) and only then is the vetted prefix handed to
        the system ``tar``, so the bytes it extracts are exactly the bytes we vetted and an
        unsafe member never reaches it. Raises BadArchive (naming the archive) for anything
        that makes it unusable.
        """
        archive = self.path_for(key)
        try:
            with _open_archive(archive) as f:
                reader = open_for(f, archive, key, platform.as_dict())
                into.mkdir(parents=True)
                extract(reader, into)
        except OSError as e:
            raise BadArchive(f"{archive}: unreadable archive: {e}") from None
        venv = into / TOP
        if not (venv / "pyvenv.cfg").is_file():
            raise BadArchive(f"{archive}: holds no venv")
        return venv

    def _listable(self) -> bool:
        """Whether the store is there to list; an error when it is not a real directory (a
        link there would have `prune` remove in whatever it points at)."""
        if not os.path.lexists(self.root):
            return False
        try:
            places.check_dir(self.root, owned=False)
        except places.UntrustedPlace as e:
            raise ConfigError(f"the snapshot store {e.filename} {e.strerror}: point `snapshots` "
                              "at the directory itself") from None
        return True

    def entries(self) -> list[Snapshot]:
        if not self._listable():
            return []
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
                path = self.path_for(snap.key)
                path.unlink(missing_ok=True)
                removed.append(path)
        for leftover in self.root.glob(f".*{SUFFIX}.tmp-*") if self._listable() else ():
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
    except (BadArchive, OSError, ValueError, TypeError):
        platform = {"error": "unreadable"}
    return Snapshot(path.name.removesuffix(SUFFIX), path, size, created, platform)


def _pid_dead(name: str) -> bool:
    pid = owner_pid(name, "tmp")  # temp names are ".<target>.tmp-<pid>-<token>"
    return pid is not None and not pid_alive(pid)


def offline_bucket(config: Config) -> bool:
    """Whether the store is a bucket that the config's ``offline`` keeps us from contacting:
    offline means no network at all, buckets included (a fleet set offline once still sent
    every rebuild's HEAD and upload to its bucket, and waited out the bound where none was)."""
    offline = config.offline or "--offline" in config.uv_args
    return offline and isinstance(config.snapshots, Bucket)


def open_store(location: Path | Bucket) -> Store | BucketStore:
    """The store at ``location``: a directory, or a bucket (:class:`cloud.Unavailable`
    when the ``cloud`` extra is not installed)."""
    if isinstance(location, Path):
        return Store(location)
    from bootstrap.snapshots.bucket import BucketStore

    return BucketStore(location.url)

"""The snapshot side of one rebuild: which key, whether the store has it, restoring and saving.

Engine glue between a rebuild and a store (``snapshots/``): the store knows archives and keys,
this knows a rebuild's runtime and its marker.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bootstrap.config import Config
from bootstrap.env.marker import RuntimeRecord, read_marker, write_marker
from bootstrap.env.platform import Platform, platform_of
from bootstrap.env.uv import Uv
from bootstrap.errors import BootstrapError
from bootstrap.primitives import log
from bootstrap.primitives.tar import BadArchive
from bootstrap.snapshots.cloud import Unavailable
from bootstrap.snapshots.store import Store, offline_bucket, open_store, snapshot_key

if TYPE_CHECKING:
    from bootstrap.snapshots.bucket import BucketStore


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

    def claim_marker(self, venv: Path, runtime: RuntimeRecord) -> None:
        """Check the snapshot's marker is for this runtime; point it at the live interpreter.

        Its skill records stay: the sync then installs only what they do not already cover.
        """
        data = read_marker(venv).data
        if data is None or data["runtime"]["identity"] != runtime["identity"]:
            raise BadArchive(f"{self.archive}: its marker is for another runtime")
        data["runtime"] = runtime
        write_marker(venv, data)

    def save(self, venv: Path) -> None:
        # The tree itself, not the link to it: tar would archive a symlink as a symlink.
        self.store.write(venv, self.key, self.platform)


def plan(config: Config, uv: Uv) -> Plan | None:
    """The snapshot plan for a rebuild of ``config``; None without a store (or a platform)."""
    if config.snapshots is None:
        return None
    if offline_bucket(config):
        # Nothing local mirrors a bucket: the rebuild comes from uv's caches, and nothing is
        # uploaded after it.
        log.warning("snapshots skipped: the store is a bucket and offline is set (no network, "
                    "buckets included); building from the caches", store=str(config.snapshots))
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

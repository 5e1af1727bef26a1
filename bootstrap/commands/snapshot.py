"""``kernel-bootstrap snapshot list|prune``: look after the snapshot store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from bootstrap.config import Config, load_config
from bootstrap.errors import EXIT_OK, ConfigError
from bootstrap.snapshots.store import Store, offline_bucket, open_store

if TYPE_CHECKING:
    from bootstrap.snapshots.bucket import BucketStore


def _store(config: Config) -> Store | BucketStore:
    """The configured store; a bucket without the ``cloud`` extra is an error naming it."""
    if config.snapshots is None:
        raise ConfigError(
            f"{config.path}: no snapshot store: set `snapshots = \"PATH\"` in the config or "
            "KERNEL_BOOTSTRAP_SNAPSHOTS"
        )
    if offline_bucket(config):
        raise ConfigError(
            f"{config.path}: the snapshot store {config.snapshots} is a bucket and `offline` is "
            "set (no network, buckets included); unset `offline` (and KERNEL_BOOTSTRAP_OFFLINE, "
            "UV_OFFLINE) to reach it"
        )
    return open_store(config.snapshots)


def list_(config_path: Path | None, *, as_json: bool) -> int:
    store = _store(load_config(config_path))
    entries = store.entries()
    if as_json:
        print(json.dumps({"store": str(store.root), "snapshots": [
            {"key": s.key, "path": str(s.path), "bytes": s.size, "created": s.created,
             "platform": s.platform} for s in entries]}))
        return EXIT_OK
    if not entries:
        print(f"no snapshots in {store.root}")
    for s in entries:
        plat = "/".join(s.platform.get(k, "?") for k in ("python_version", "os", "machine"))
        print(f"{s.key}  {s.size / 1e6:8.1f} MB  {plat}  {s.path}")
    return EXIT_OK


def prune(config_path: Path | None, *, keep: int | None, older_than_days: float | None,
          as_json: bool) -> int:
    if keep is None and older_than_days is None:
        raise ConfigError("snapshot prune: say what to remove: --keep N and/or --older-than DAYS")
    store = _store(load_config(config_path))
    removed = store.prune(keep, older_than_days)
    if as_json:
        print(json.dumps({"store": str(store.root), "removed": [str(p) for p in removed]}))
    else:
        print("\n".join(f"removed {p}" for p in removed) if removed else "nothing to remove")
    return EXIT_OK

"""Installed distributions: `*.dist-info` directories in site-packages, their RECORD, removal.

The on-disk shapes match what uv writes (RECORD, INSTALLER = `uv`, direct_url.json,
uv_cache.json), so code that inspects a venv behaves the same on a fake and a real install.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from fake_uv import reqs
from fake_uv.venvs import Venv


class Dist(NamedTuple):
    """One installed distribution, identified by its dist-info directory's name."""

    norm: str
    version: str
    dist_info: Path

    def read(self, name: str) -> str:
        try:
            return (self.dist_info / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return ""

    def metadata(self, field: str) -> list[str]:
        """The values of one METADATA header (e.g. all `Requires-Dist` lines)."""
        headers = self.read("METADATA").partition("\n\n")[0]
        prefix = field.lower() + ":"
        return [line.split(":", 1)[1].strip() for line in headers.splitlines()
                if line.lower().startswith(prefix)]

    @property
    def name(self) -> str:
        return next(iter(self.metadata("Name")), self.norm)

    def direct_url(self) -> dict[str, Any]:
        try:
            data = json.loads(self.read("direct_url.json") or "{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def editable_location(self) -> Path | None:
        """The project directory of an editable install (from direct_url.json), else None."""
        data = self.direct_url()
        url = data.get("url")
        if not (isinstance(url, str) and url.startswith("file://")
                and data.get("dir_info", {}).get("editable")):
            return None
        from urllib.parse import unquote, urlsplit

        return Path(unquote(urlsplit(url).path))

    def cache_timestamp_ns(self) -> int | None:
        """The project's pyproject.toml ctime recorded at install time (uv's freshness key)."""
        try:
            stamp = json.loads(self.read("uv_cache.json") or "{}")["timestamp"]
            return int(stamp["secs_since_epoch"]) * 10**9 + int(stamp["nanos_since_epoch"])
        except (ValueError, KeyError, TypeError):
            return None

    def described(self) -> str:
        """`name==version`, plus `(from file:///...)` for editables, as uv lists changes."""
        location = self.editable_location()
        source = f" (from {location.as_uri()})" if location else ""
        return f"{self.norm}=={self.version}{source}"


def scan(site: Path) -> dict[str, Dist]:
    """Installed distributions by normalised name; half-written leftovers are ignored."""
    found: dict[str, Dist] = {}
    try:
        entries = list(os.scandir(site))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.endswith(".dist-info") or entry.name.startswith("."):
            continue
        name, _, version = entry.name.removesuffix(".dist-info").rpartition("-")
        if name and entry.is_dir():
            found[reqs.normalize(name)] = Dist(reqs.normalize(name), version, Path(entry.path))
    return found


def dist_info_name(name: str, version: str) -> str:
    return f"{reqs.normalize(name).replace('-', '_')}-{version}.dist-info"


def write(venv: Venv, files: Mapping[str, str], dist_info: str,
          meta: Mapping[str, str], executables: Iterable[str] = (), *,
          payload: bool = True) -> None:
    """Install one distribution: payload `files` first, then its dist-info moved into place.

    Keys of `files` are RECORD paths (relative to site-packages, `../../../bin/x` for scripts).
    The dist-info appears in one rename at the end, so a kill mid-install never leaves a
    dist-info that claims files which were never written. Not so a full disk under the real
    uv, which links a wheel's dist-info with its other directories: `payload=False` leaves
    that state, a dist-info whose RECORD lists files that are not there.
    """
    import base64
    import hashlib

    site = venv.site
    records: list[str] = []

    def put(target: Path, record_as: str, text: str, executable: bool = False,
            written: bool = True) -> None:
        data = text.encode("utf-8")
        if written:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if executable and written:
            target.chmod(0o755)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        records.append(f"{record_as},sha256={digest},{len(data)}")

    executable = set(executables)
    for relative, text in files.items():
        put(site / relative, relative, text, relative in executable, payload)
    staging = site / f".{dist_info}.{os.getpid()}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    for filename, text in meta.items():
        put(staging / filename, f"{dist_info}/{filename}", text)
    records.append(f"{dist_info}/RECORD,,")
    (staging / "RECORD").write_text("\n".join(records) + "\n", encoding="utf-8")
    shutil.rmtree(site / dist_info, ignore_errors=True)
    staging.rename(site / dist_info)


def torn(norm: str) -> str | None:
    """How the package's install is torn, if it is: its dist-info lands, its files do not.

    FAKE_UV_ENOSPC=name fails the call there, as the real uv does on a full disk (it links a
    wheel's dist-info with its other directories, so the dist-info can be all that landed);
    with FAKE_UV_ENOSPC_ONCE=FILE, only while FILE exists, which the failure removes (the
    space came back). FAKE_UV_PARTIAL=name reports success: a dist-info a later call trusts.
    """
    if norm in reqs.env_names("FAKE_UV_ENOSPC"):
        once = os.environ.get("FAKE_UV_ENOSPC_ONCE")
        if not once:
            return "ENOSPC"
        try:
            os.unlink(once)
            return "ENOSPC"
        except FileNotFoundError:
            pass
    return "partial" if norm in reqs.env_names("FAKE_UV_PARTIAL") else None


def remove(venv: Venv, dist: Dist) -> None:
    """Delete every file RECORD lists (never outside the venv), then the dist-info itself."""
    root = venv.root
    touched: set[Path] = set()
    for line in dist.read("RECORD").splitlines():
        relative = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line
        if not relative:
            continue
        target = Path(os.path.normpath(dist.dist_info.parent / relative))
        if not target.is_relative_to(root) or target == root:
            continue  # a hostile or corrupt RECORD must not delete files outside the venv
        if target.is_file() or target.is_symlink():
            target.unlink()
            touched.add(target.parent)
    shutil.rmtree(dist.dist_info, ignore_errors=True)
    for directory in sorted(touched, key=lambda p: len(p.parts), reverse=True):
        _prune(directory, stop=dist.dist_info.parent)


def _prune(directory: Path, stop: Path) -> None:
    """Remove `directory` and its parents up to `stop` while they hold nothing but bytecode."""
    while directory != stop and directory.is_relative_to(stop):
        try:
            names = set(os.listdir(directory))
        except OSError:
            return
        if names == {"__pycache__"}:
            shutil.rmtree(directory / "__pycache__", ignore_errors=True)
        elif names:
            return
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent

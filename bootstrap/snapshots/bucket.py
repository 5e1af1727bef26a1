"""A snapshot store in object storage (``snapshots = "s3://BUCKET/PREFIX"``).

Same interface and archive format as the directory store (:class:`bootstrap.snapshots.store.Store`):
one object ``PREFIX/<key>.tar`` per snapshot, zstd-compressed (the bucket is paid for in bytes
moved: 0.18 of the plain size for the example runtime; see BENCHMARKS.md), its format told
by its magic bytes (:mod:`bootstrap.snapshots.compression`), so a plain archive restores too.

Writing: the archive is written straight into the compressor (the same writer the directory
store uses), and the compressed bytes into an unnamed temp file: S3 takes an object's metadata,
its size and sha256 here, before the first byte of its body, so the body must be complete
before the upload starts. It is then uploaded in one PUT (or a multipart upload, which S3
makes visible only on completion): a reader sees the whole object or none. Each object carries
its own size and digest, so concurrent writers of one key are harmless (each object is
consistent with its own digest; the last one wins).

Reading: the body is streamed through the same vetting reader as a local restore into
``tar -x`` (no copy of the archive on disk, memory bounded by a few chunks) and its size and
digest are checked before the caller swaps anything in. Every failure is a warning and a
normal build.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from bootstrap.primitives import log
from bootstrap.primitives.tar import BadArchive
from bootstrap.snapshots import cloud, compression
from bootstrap.snapshots.archive import TOP, Snapshot, extract, open_for, write_snapshot

if TYPE_CHECKING:
    from obstore import ObjectMeta
    from obstore.store import ObjectStore

    from bootstrap.env.platform import Platform

SUFFIX: Final = ".tar"  # the container; compression is told by the content, not the name
_STREAM_CHUNK: Final = 1 << 20
# Progress, for the stall bound: a download must bring at least this much in every bound's
# worth of seconds. A body that trickles slower (a dripping bucket once held a cold start for
# 30 s with a 2 s bound) is no faster than building; one that keeps coming may take its time.
_PROGRESS: Final = 64 * 1024
_META_SIZE: Final = "kb-size"
_META_SHA: Final = "kb-sha256"
_META_CREATED: Final = "kb-created"
_META_PLATFORM: Final = "kb-platform"


class BucketStore:
    """Snapshots under ``url``; after one request that fails to reach the store, the rest of
    this process skips it (one bounded wait per run, not one per request)."""

    def __init__(self, url: str, bound: float | None = None) -> None:
        cloud.require()  # raises Unavailable, naming the extra
        self.url = url.rstrip("/")
        self.root = self.url  # what `snapshot list` and status print as the store
        self.bound = cloud.timeout() if bound is None else bound
        self.unreachable = False
        self._store: ObjectStore | None = None
        self._streaming: ObjectStore | None = None

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = cloud.connect(self.url, self.bound)
        return self._store

    @property
    def streaming(self) -> ObjectStore:
        """The client for a snapshot's download: bounded by stalls, not by its length."""
        if self._streaming is None:
            self._streaming = cloud.connect(self.url, self.bound, streaming=True)
        return self._streaming

    def path_for(self, key: str) -> str:
        return f"{self.url}/{key}{SUFFIX}"

    def _failed(self, what: str, error: BaseException, **fields: str) -> None:
        if not isinstance(error, FileNotFoundError | BadArchive):
            self.unreachable = True
        hint = {} if cloud.has_credentials() else {
            "hint": "no AWS credentials in the environment or ~/.aws/credentials"}
        log.warning(what, store=self.url, error=cloud.describe(error), **fields, **hint)

    # -- reading -----------------------------------------------------------------------------
    def has(self, key: str) -> bool | None:
        """Whether the snapshot exists: one bounded HEAD. None: the store did not answer."""
        import obstore

        if self.unreachable:
            return None
        try:
            obstore.head(self.store, key + SUFFIX)
        except FileNotFoundError:
            return False
        except Exception as e:  # obstore raises its own types for every transport failure
            self._failed("the snapshot bucket did not answer or refused the request; going on "
                         "without it", e)
            return None
        return True

    def restore(self, key: str, into: Path, platform: Platform) -> Path:
        """Stream the snapshot for ``key`` into ``into``; return the venv tree's path.

        Raises BadArchive naming the object for anything that makes it unusable: not found,
        unreachable, no recorded digest, wrong key or platform, unsafe members, a size or
        digest that differs from what was recorded when it was written.
        """
        import obstore

        url = self.path_for(key)
        try:
            result = obstore.get(self.streaming, key + SUFFIX)
            size, sha = _recorded(result.attributes, result.meta["size"], url)
            # Chunks as they arrive (no minimum): each wait for one is what the bound measures.
            raw = _Body(result.stream(min_chunk_size=0), url, self.bound)
            reader = open_for(compression.decoded(raw), url, key, platform.as_dict())
            into.mkdir(parents=True)
            extract(reader, into)
            raw.drain()
        except BadArchive:
            raise
        except OSError as e:
            raise BadArchive(f"{url}: unreadable: {cloud.describe(e)}") from None
        except Exception as e:  # obstore's own error types: not found, refused, timed out
            raise BadArchive(f"{url}: {cloud.describe(e)}") from None
        raw.check(size, sha)
        if not (into / TOP / "pyvenv.cfg").is_file():
            raise BadArchive(f"{url}: holds no venv")
        return into / TOP

    # -- writing -----------------------------------------------------------------------------
    def write(self, venv: Path, key: str, platform: Platform) -> str | None:
        """Archive, compress and upload ``venv``; any failure is a warning, never an error."""
        url = self.path_for(key)
        if self.unreachable:
            log.warning("snapshot not uploaded: the bucket did not answer earlier in this run",
                        snapshot=url)
            return None
        try:
            # Unnamed: it never outlives this process, however the process ends.
            with tempfile.TemporaryFile() as body:
                size, sha = _spool(body, venv, key, platform)
                self._upload(key, body, size, sha, platform)
        except Exception as e:  # obstore's types, OSError, zstd: all only cost the upload
            self._failed("could not upload the snapshot; continuing without it", e,
                         snapshot=url)
            return None
        log.info("snapshot uploaded", snapshot=url, bytes=size)
        return url

    def _upload(self, key: str, body: IO[bytes], size: int, sha: str,
                platform: Platform) -> None:
        import obstore

        attributes = {_META_SIZE: str(size), _META_SHA: sha,
                      _META_CREATED: f"{time.time():.3f}",
                      _META_PLATFORM: json.dumps(platform.as_dict(), sort_keys=True)}
        # Overwrite, not create-if-absent: a conditional PUT cannot be multipart (obstore
        # would hold the whole archive in memory), and a racing writer's object is as good.
        obstore.put(self.store, key + SUFFIX, body, attributes=attributes,
                    chunk_size=8 * _STREAM_CHUNK, max_concurrency=4)

    # -- looking after the store ---------------------------------------------------------------
    def entries(self) -> list[Snapshot]:
        """Every snapshot object, with its platform from its metadata (one ranged GET each)."""
        found: list[Snapshot] = []
        for meta in self._objects():
            key = meta["path"].removesuffix(SUFFIX)
            found.append(Snapshot(key, self.path_for(key), meta["size"],
                               meta["last_modified"].timestamp(), self._platform(key)))
        return found

    def _objects(self) -> Iterator[ObjectMeta]:
        """The snapshot objects at the store's own level. Not obstore.list, which is
        recursive: prune once deleted the store's newest snapshot because a copy of it lay
        under a nested prefix (``PREFIX/team-b/<key>.tar``, another team's store)."""
        import obstore

        try:
            for meta in obstore.list_with_delimiter(self.store)["objects"]:
                name = meta["path"]
                if "/" not in name and name.endswith(SUFFIX) and not name.startswith("."):
                    yield meta
        except Exception as e:
            from bootstrap.errors import BootstrapError

            raise BootstrapError(f"{self.url}: cannot list the snapshots: "
                                 f"{cloud.describe(e)}") from None

    def _platform(self, key: str) -> dict[str, str]:
        import obstore

        try:
            got = obstore.get(self.store, key + SUFFIX, options={"range": (0, 1)})
            value = json.loads(got.attributes.get(_META_PLATFORM, "null"))
        except Exception:  # one unreadable entry must not hide the others
            return {"error": "unreadable"}
        return value if isinstance(value, dict) else {"error": "no metadata"}

    def prune(self, keep: int | None, older_than_days: float | None) -> list[str]:
        """Remove snapshots beyond the newest ``keep`` and those older than the given age."""
        import obstore

        objects = sorted(self._objects(), key=lambda m: m["last_modified"], reverse=True)
        cutoff = time.time() - older_than_days * 86400 if older_than_days is not None else None
        removed: list[str] = []
        for index, meta in enumerate(objects):
            old = cutoff is not None and meta["last_modified"].timestamp() < cutoff
            if (keep is not None and index >= keep) or old:
                # Exactly the object listed, by its whole path under the store's prefix.
                obstore.delete(self.store, meta["path"])
                removed.append(f"{self.url}/{meta['path']}")
        return removed


def _spool(body: IO[bytes], venv: Path, key: str, platform: Platform) -> tuple[int, str]:
    """Write the snapshot into ``body``, compressed; return its size and sha256, ``body``
    rewound for the upload."""
    with compression.compressed(body) as out:
        write_snapshot(out, venv, key, platform.as_dict())
    size = body.tell()
    body.seek(0)
    digest = hashlib.sha256()
    while chunk := body.read(_STREAM_CHUNK):
        digest.update(chunk)
    body.seek(0)
    return size, digest.hexdigest()


def _recorded(attributes: dict[str, str], size: int, url: str) -> tuple[int, str]:
    """The size and digest the writer recorded, checked against the object's own size."""
    try:
        recorded, sha = int(attributes[_META_SIZE]), attributes[_META_SHA]
    except (KeyError, ValueError):
        raise BadArchive(f"{url}: no recorded size and digest (not written by "
                          "kernel-bootstrap, or its metadata was lost)") from None
    if recorded != size:
        raise BadArchive(f"{url}: truncated or replaced: {size} bytes, written as {recorded}")
    return recorded, sha


class _Body:
    """The object's body as a file: counts and digests every byte as it arrives."""

    def __init__(self, stream: Iterator[bytes], url: str, bound: float) -> None:
        self.stream = stream
        self.url = url
        self.bound = bound
        self.pending = memoryview(b"")
        self.digest = hashlib.sha256()
        self.size = 0
        self.window = time.monotonic()
        self.window_bytes = 0

    def _next(self) -> bytes:
        try:
            chunk = bytes(next(self.stream))
        except StopIteration:
            return b""
        except Exception as e:  # a reset or timed-out connection mid-body
            raise OSError(f"the download broke off: {cloud.describe(e)}") from None
        self.digest.update(chunk)
        self.size += len(chunk)
        self._progressed(len(chunk))
        return chunk

    def _progressed(self, arrived: int) -> None:
        """Raise once a bound's worth of seconds brought less than :data:`_PROGRESS` bytes
        (silence is the client's read timeout, the same bound)."""
        now = time.monotonic()
        self.window_bytes += arrived
        if now - self.window < self.bound:
            return
        if self.window_bytes < _PROGRESS:
            raise OSError(f"the download stalled: {self.window_bytes} bytes in "
                          f"{now - self.window:.1f} s (KERNEL_BOOTSTRAP_SNAPSHOT_TIMEOUT="
                          f"{self.bound:g})")
        self.window, self.window_bytes = now, 0

    def read(self, size: int = -1, /) -> bytes:
        if size < 0:
            rest = [bytes(self.pending)]
            while chunk := self._next():
                rest.append(chunk)
            self.pending = memoryview(b"")
            return b"".join(rest)
        # Chunks come as the network delivers them (a few KiB): gathered up to what the reader
        # asked for, so that the decompressor and the archive reader see large reads, as they
        # did with obstore's 1 MiB chunks (a restore took 1.23x as long without this).
        pieces = [self.pending] if self.pending else []
        have = len(self.pending)
        while have < size and (chunk := self._next()):
            pieces.append(memoryview(chunk))
            have += len(chunk)
        joined = memoryview(b"".join(pieces)) if len(pieces) != 1 else pieces[0]
        out, self.pending = joined[:size], joined[size:]
        return bytes(out)

    def drain(self) -> None:
        """Read what the archive reader left (tar's end padding): the digest covers it all."""
        self.pending = memoryview(b"")
        while self._next():
            pass

    def check(self, size: int, sha256: str) -> None:
        if self.size != size:
            raise BadArchive(f"{self.url}: truncated: {self.size} bytes of {size}")
        if self.digest.hexdigest() != sha256:
            raise BadArchive(f"{self.url}: corrupt: its sha256 differs from the one recorded "
                              "when it was written")

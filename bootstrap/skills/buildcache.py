"""The build cache: every editable wheel kernel-bootstrap built, kept per user, so a skill is
built once, ever, not once per venv.

uv keeps the editables it builds in its own cache and reuses them when a venv is made again
(a runtime change, ``repair --force``, a host that wipes venvs but keeps skills); our batched
builds (bootstrap.skills.builds) happened in scratch space, so we redid them every time. An entry
here is one skill's editable wheel, keyed on what uv keys a local project on and what the
build reads: the skill's absolute path, the bytes of ``pyproject.toml``, ``setup.cfg`` and
``setup.py``, whether ``src/`` exists, the build backend and its requirements, uv's arguments
(the index the backend comes from), the interpreter version and the platform.

Layout: ``<root>/<key>/`` holds ``entry.json`` (what the wheel is, its sha256, the skill it
was built from), the wheel, and ``used`` (its mtime is the last use, for ``gc``). An entry is
written complete in a hidden sibling and renamed into place by the build worker as soon as its
build returns, so a killed session keeps every build it finished and no reader ever sees half
an entry. A reader copies the wheel's verified bytes into its own scratch space: what uv
installs cannot change under it. Anything unreadable, of the wrong shape or with the wrong
hash is a miss (rebuilt) with a warning, never a failure.

Two sessions missing the same key: the second waits (bounded, :data:`WAIT`) on the first's
per-key lock and then finds the entry; past the bound it builds anyway, because a build that
slow is more likely stuck than busy, and building again costs one build, never correctness
(the first entry renamed into place wins; the other is dropped).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import sysconfig
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bootstrap import places
from bootstrap.errors import BootstrapError, LockTimeout
from bootstrap.primitives import log
from bootstrap.primitives.fs import (
    owner_pid,
    pid_alive,
    read_state_file,
    remove_quietly,
    temp_name,
    write_file,
)
from bootstrap.skills.python_skill import PythonSkill

ENV: Final = "KERNEL_BOOTSTRAP_BUILD_CACHE"
SCHEMA: Final = 1
ENTRY: Final = "entry.json"
USED: Final = "used"
# Entries nobody used for this long are pruned by `gc`.
MAX_AGE_DAYS: Final = 30.0
# How long a session waits for another one building the same keys (a group of editables
# builds in ~1 s here, ~10 s under heavy load); past it, it builds them itself.
WAIT: Final = 30.0
_KEY_FILES: Final = ("pyproject.toml", "setup.cfg", "setup.py")
_BUILDING: Final = "build"
_TRASH: Final = "trash"
_LOCKS: Final = "locks"


def root() -> Path:
    """``$KERNEL_BOOTSTRAP_BUILD_CACHE``, else ``builds`` in the user cache directory."""
    override = os.environ.get(ENV, "").strip()
    if override:
        return Path(override).absolute()
    from bootstrap.warm import cache_dir

    return Path(cache_dir()) / "builds"


def _file_digest(path: Path) -> str | None:
    """sha256 of a key file; None when absent. Not a regular file counts as its kind."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return "special"
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return "unreadable"


def key(skill: PythonSkill, python_version: str, build_args: Sequence[str] = ()) -> str:
    """The cache key of ``skill``'s editable wheel for an interpreter of ``python_version``."""
    path = skill.skill.path.absolute()
    parts = {
        "schema": SCHEMA,
        "path": str(path),
        "files": {name: _file_digest(path / name) for name in _KEY_FILES},
        "src": (path / "src").is_dir(),
        "build-system": list(skill.build_system or ()),
        "uv-args": list(build_args),
        "python": python_version,
        "platform": sysconfig.get_platform(),
    }
    text = json.dumps(parts, sort_keys=True, ensure_ascii=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Cache:
    root: Path

    def entry(self, key: str) -> Path:
        return self.root / key

    def staging(self, key: str) -> Path:
        """Where a build of ``key`` writes its entry before renaming it into place (the
        writer's pid in its name: `gc` reaps a dead writer's)."""
        return temp_name(self.entry(key), _BUILDING)

    def metadata(self, skill: PythonSkill) -> dict[str, object]:
        """What the build worker writes into ``entry.json`` (it adds the wheel's name and hash)."""
        return {"schema": SCHEMA, "name": skill.name, "project": skill.project,
                "path": str(skill.skill.path.absolute()), "created": time.time()}

    def take(self, key: str, skill: str, dest: Path) -> Path | None:
        """Copy the wheel of ``key`` into ``dest`` (made here) and return its path; None on a
        miss. A corrupt entry is a miss: it is warned about and moved out of the way, so the
        rebuild can take its place."""
        entry = self.entry(key)
        if not os.path.lexists(entry):
            return None
        # A planted entry carries a matching sha256 as easily as a wheel: only one nobody else
        # could have written is installed.
        untrusted = places.problem(entry)
        if untrusted is not None:
            _corrupt(entry, skill, f"the entry {untrusted}")
            return None
        try:
            meta = json.loads(read_state_file(entry / ENTRY))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as e:
            _corrupt(entry, skill, f"unreadable {ENTRY}: {e}")
            return None
        problem, data = _verified(entry, meta)
        if data is None:
            _corrupt(entry, skill, problem)
            return None
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / str(meta["wheel"])
        write_file(wheel, data)
        _touch(entry / USED)
        return wheel

    @contextlib.contextmanager
    def building(self, keys: Sequence[str], timeout: float = WAIT) -> Iterator[set[str]]:
        """Hold the build locks of ``keys`` (sorted, so two sessions never wait on each other
        in a circle); yields the keys locked. Keys not locked within ``timeout`` s in all are
        left out: the caller builds them anyway."""
        from bootstrap.primitives.lock import hold

        deadline = time.monotonic() + timeout
        locked: set[str] = set()
        try:
            places.make_dir(self.root / _LOCKS)
        except places.UntrustedPlace as e:
            log.warning("building without the build cache's locks: " + places.refusal(e))
            keys = ()
        except OSError as e:
            log.debug("could not make the build cache's lock directory", error=str(e))
        with contextlib.ExitStack() as stack:
            for k in sorted(set(keys)):
                try:
                    stack.enter_context(hold(
                        self.root / _LOCKS / f"{k}.lock", max(0.0, deadline - time.monotonic()),
                        purpose="build", name=f"the build cache entry {k[:12]}",
                        advice="Building it here as well."))
                except LockTimeout as e:
                    log.warning("another session is still building this skill; building it "
                                "here as well", key=k, error=str(e))
                    continue
                # An unwritable cache, or something planted at a lock's name: no lock, and
                # nothing to share.
                except (OSError, BootstrapError) as e:
                    log.debug("could not lock a build cache entry", key=k, error=str(e))
                    continue
                locked.add(k)
            yield locked


def _corrupt(entry: Path, skill: str, problem: str) -> None:
    log.warning("ignoring a corrupt build cache entry; building the skill again",
                skill=skill, entry=str(entry), problem=problem)
    discard(entry)


def _verified(entry: Path, meta: object) -> tuple[str, bytes | None]:
    """(problem, the wheel's bytes if the entry is whole)."""
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        return "unknown format", None
    wheel, digest = meta.get("wheel"), meta.get("sha256")
    if not isinstance(wheel, str) or not wheel.endswith(".whl") or "/" in wheel \
            or os.sep in wheel or wheel.startswith(".") or not isinstance(digest, str):
        return "no wheel recorded", None
    try:
        data = read_state_file(entry / wheel)
    except OSError as e:
        return f"unreadable wheel: {e}", None
    if hashlib.sha256(data).hexdigest() != digest:
        return "the wheel does not match its recorded hash", None
    return "", data


def _touch(path: Path) -> None:
    # Last use, for `gc`; a cache we cannot write is still a cache we can read.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        os.close(fd)
        os.utime(path)


def discard(entry: Path) -> bool:
    """Remove an entry: renamed aside first, so that no reader sees it half removed."""
    aside = temp_name(entry, _TRASH)
    try:
        os.rename(entry, aside)
    except FileNotFoundError:
        return False
    except OSError:
        return remove_quietly(entry)
    return remove_quietly(aside)


def open_cache() -> Cache | None:
    """The build cache, made if needed; None when it cannot be (the builds still happen, in
    scratch space, as before there was a cache)."""
    path = root()
    try:
        places.make_dir(path)
        if not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, "not writable", str(path))
    except places.UntrustedPlace as e:
        log.warning("building in scratch space: " + places.refusal(e))
        return None
    except OSError as e:
        log.info("the build cache is unusable; building in scratch space", cache=str(path),
                 error=str(e))
        return None
    return Cache(path)


# -- gc -----------------------------------------------------------------------------------------

def prune(max_age_days: float = MAX_AGE_DAYS, now: float | None = None) -> list[str]:
    """Remove entries whose skill is gone or that nobody used for ``max_age_days``, and what
    dead builders left. Returns what was done, for ``gc`` to report."""
    cache = root()
    names = _listed(cache)
    cutoff = (time.time() if now is None else now) - max_age_days * 86400
    done: list[str] = []
    for name in sorted(names):
        path = cache / name
        if name.startswith("."):
            why = _leftover(name)
        elif name == _LOCKS:
            continue
        else:
            why = _stale_entry(path, cutoff)
        if why and (discard(path) if not name.startswith(".") else remove_quietly(path)):
            done.append(f"removed build cache entry {path} ({why})")
    done += _prune_locks(cache, cutoff)
    return done


def _leftover(name: str) -> str | None:
    for tag in (_BUILDING, _TRASH):
        pid = owner_pid(name, tag)
        if pid is not None and f".{tag}-{pid}-" in name and not pid_alive(pid):
            return f"left by pid {pid}, which is gone"
    return None


def _listed(directory: Path) -> list[str]:
    """The names in one of the cache's directories; none if it is absent, not ours (a link, a
    directory another user can write) or unreadable: gc then removes nothing there."""
    if not os.path.lexists(directory) or not _ours(directory):
        return []
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _ours(directory: Path) -> bool:
    """Whether ``gc`` may list and remove in ``directory`` (it warns when not)."""
    try:
        places.check_dir(directory)
    except places.UntrustedPlace as e:
        log.warning("gc leaves the build cache alone: " + places.refusal(e))
        return False
    return True


def _stale_entry(entry: Path, cutoff: float) -> str | None:
    untrusted = places.problem(entry)
    if untrusted is not None:
        return f"not an entry of ours: it {untrusted}"
    try:
        meta = json.loads(read_state_file(entry / ENTRY))
    except (OSError, ValueError, RecursionError):
        meta = None
    skill = meta.get("path") if isinstance(meta, dict) else None
    if not isinstance(skill, str) or not os.path.isfile(os.path.join(skill, "pyproject.toml")):
        return "its skill no longer exists" if isinstance(skill, str) else "unreadable"
    if _last_use(entry) < cutoff:
        return "unused for a long time"
    return None


def _last_use(entry: Path) -> float:
    for name in (USED, ENTRY):
        with contextlib.suppress(OSError):
            return os.stat(entry / name).st_mtime
    return 0.0


def _prune_locks(cache: Path, cutoff: float) -> list[str]:
    """Lock files of keys with no entry, untouched for long: at worst, removing one while a
    session holds it lets a second session build that key at the same time (once)."""
    locks = cache / _LOCKS
    names = _listed(locks)
    done: list[str] = []
    for name in names:
        k = name.split(".", 1)[0]
        path = locks / name
        with contextlib.suppress(OSError):
            if not (cache / k).exists() and os.lstat(path).st_mtime < cutoff:
                os.unlink(path)
                done.append(f"removed build cache lock {path}")
    return done


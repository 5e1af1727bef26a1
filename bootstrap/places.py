"""Our own directories: the build cache, the warm fingerprints, a local snapshot store, and
where a config that names no venv gets its own (:func:`default_venv`).

kernel-bootstrap often runs as root beside trees an agent can write. A directory of ours that
is really a symlink sends whatever we list, create or remove in it somewhere else: ``gc`` once
deleted a victim's files through a build cache whose ``locks`` was a link to them. So every
directory of these places is checked to be a real directory (``lstat``, never followed) before
anything is listed, created or removed in it. The caches, which only we write, must also be
ours and writable by nobody else (:func:`bootstrap.warm.untrusted`, the rule ssh's StrictModes
applies): a wheel or a fingerprint another user could plant there would be installed or
believed. A snapshot store may be shared by a team, so only its realness is checked; what it
holds is vetted archive by archive (``bootstrap.snapshots.archive``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Final

from bootstrap.warm import untrusted

# No write bit for group or others whatever the umask: a directory we would then refuse to
# trust must never be one we made.
_MODE: Final = 0o755


class UntrustedPlace(OSError):
    """A directory of ours that is a symlink, not a directory, or someone else's."""


def problem(path: Path, *, owned: bool = True) -> str | None:
    """Why ``path`` is not one of our directories, or None (a missing path is a problem too)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be examined ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link, not a directory"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    return untrusted(st) if owned else None


def check_dir(path: Path, *, owned: bool = True) -> Path:
    """``path`` if it is one of our directories; :class:`UntrustedPlace` naming why not."""
    why = problem(path, owned=owned)
    if why is not None:
        raise UntrustedPlace(errno.EPERM, why, str(path))
    return path


def make_dir(path: Path, *, owned: bool = True) -> Path:
    """``path``, created if missing (parents too), then checked with :func:`check_dir`."""
    with contextlib.suppress(FileExistsError):  # something else is there: check_dir names it
        os.makedirs(path, _MODE, exist_ok=True)
    return check_dir(path, owned=owned)


# The user data directory's venvs: one per config file that names no `venv`.
DEFAULT_VENVS: Final = "venvs"
# The one venv every such config shared before (issue 31: a second project's `ensure` rebuilt
# the first one's); left as it was, and named until a config's own venv exists.
LEGACY_DEFAULT: Final = "venv"


def data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("kernel-bootstrap"))


def default_venv(config_file: Path) -> Path:
    """The venv of a config that names none: its own, ``venvs/<dir>-<hash>`` in the user data
    directory, keyed by the config file's real path (a symlinked spelling is the same config).

    Under the user data directory rather than beside the config: a project or /etc directory
    may be read-only (a container's mounted code), and a venv inside a project is picked up by
    its tools. The name starts with the config's directory so a person can tell them apart."""
    import hashlib

    real = os.path.realpath(config_file)
    digest = hashlib.sha256(os.fsencode(real)).hexdigest()[:12]
    name = "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_"
                   for c in os.path.basename(os.path.dirname(real)))[:40]
    return data_dir() / DEFAULT_VENVS / f"{name or 'config'}-{digest}"


def legacy_default(venv: Path) -> Path | None:
    """The shared default venv of earlier releases while it exists and the config's own
    default ``venv`` does not yet: worth a warning saying how to keep using it."""
    legacy = data_dir() / LEGACY_DEFAULT
    return legacy if os.path.lexists(legacy) and not os.path.lexists(venv) else None


def refusal(e: UntrustedPlace) -> str:
    """What a warning says about a refused directory, with what to do about it."""
    return (f"{e.filename} {e.strerror}; not using it. Remove it, or make it a directory "
            "of this user that only this user can write (chmod go-w)")

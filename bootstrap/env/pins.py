"""The lock file: the runtime's pins with hashes, and what they were resolved from.

``kernel-bootstrap lock`` resolves the configured requirements through ``uv pip compile`` for the
configured interpreter and platform: a PEP 751 ``pylock.toml`` when the file name says so
(``pylock.toml``, ``pylock.NAME.toml``: uv accepts no other name for that format), a
requirements file with ``--hash`` lines otherwise. Two sandboxes built a day apart then hold the
same versions, which hashing the requirement *strings* into the runtime identity never ensured.

The file's first line records a digest of its inputs (requirements, the constraints file's
digest, the uv-args that steer resolution, the interpreter's Python version and the platform),
so whether it is stale is known without resolving: ``ensure`` refuses a lock made from other
inputs than today's config instead of silently installing pins the config no longer asks for.
It is a comment in both formats, so uv reads the file unchanged and no TOML parser runs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from bootstrap.config import Config, default_python
from bootstrap.env.identity import file_digest, normalise_requirement
from bootstrap.env.network import Network
from bootstrap.env.requirements import canonical, validate_requirements
from bootstrap.env.uv import Uv, environment, make_uv
from bootstrap.errors import ConfigError, UvError
from bootstrap.primitives import log, process
from bootstrap.primitives.fs import removed_on_exit

LockState = Literal["current", "stale", "missing"]
HEADER: Final = "# kernel-bootstrap lock: "
NOTE: Final = ("# Written by `kernel-bootstrap lock`: change the requirements in the config, "
               "then run it again.\n")
INPUTS_VERSION: Final = 1
_SOURCE: Final = "requirements.in"
# uv-args that change how packages are installed, not which versions resolve: they neither
# make a lock stale nor reach `uv pip compile`, which rejects some of them.
_INSTALL_FLAGS: Final = frozenset({"--compile-bytecode", "--reinstall", "--strict", "--quiet",
                                   "-q", "--verbose", "-v", "--no-progress"})
_INSTALL_VALUED: Final = frozenset({"--link-mode", "--reinstall-package", "--color"})


class LockfileError(ConfigError):
    """The lock is missing or stale: a usage error (exit 2); nothing was built."""


@dataclass(frozen=True)
class Resolution:
    """What a resolution is for: ``python`` as major.minor, ``platform`` as os-machine."""

    python: str
    platform: str


@dataclass(frozen=True)
class Recorded:
    """The header of a lock file: its inputs digest and the target it was resolved for."""

    inputs: str
    target: Resolution


@dataclass(frozen=True)
class LockResult:
    path: Path
    format: str
    changed: bool
    inputs: str
    packages: int


def is_pylock(path: Path) -> bool:
    name = path.name
    return name == "pylock.toml" or (name.startswith("pylock.") and name.endswith(".toml")
                                     and len(name) > len("pylock..toml"))


def lock_format(path: Path) -> str:
    return "pylock.toml" if is_pylock(path) else "requirements.txt"


def resolution_args(uv_args: Sequence[str]) -> list[str]:
    """``uv_args`` without the options that only affect installing."""
    kept: list[str] = []
    skip = False
    for arg in uv_args:
        if skip:
            skip = False
            continue
        name, sep, _ = arg.partition("=")
        if name in _INSTALL_VALUED:
            skip = not sep
        elif name not in _INSTALL_FLAGS:
            kept.append(arg)
    return kept


# -- the target: for which interpreter and platform the pins were resolved ----------------------
def resolution_of(config: Config, uv: Uv) -> Resolution:
    """The target of ``config.python`` (a child process only for another interpreter)."""
    from bootstrap.env.platform import platform_of

    found = platform_of(uv, config.python)
    return Resolution(_minor(found.python_version), f"{found.os}-{found.machine}")


def known_resolution(config: Config) -> Resolution | None:
    """The target without a child process (``status``): the interpreter running us, else the
    version the live venv runs; None when neither tells."""
    from bootstrap.env.platform import local_platform
    from bootstrap.env.venv import python_version

    version = python_version(config.venv)
    if version is None and config.python == default_python():
        import platform

        version = platform.python_version()
    if version is None:
        return None
    found = local_platform(version)
    return Resolution(_minor(version), f"{found.os}-{found.machine}")


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


# -- the inputs digest and the header ----------------------------------------------------------
def inputs_digest(config: Config, target: Resolution) -> str:
    inputs = {
        "version": INPUTS_VERSION,
        "requirements": sorted({normalise_requirement(r) for r in config.requirements}),
        "constraints": file_digest(config.constraints) if config.constraints else None,
        "uv_args": resolution_args(config.uv_args),
        "python": target.python,
        "platform": target.platform,
    }
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def header(digest: str, target: Resolution) -> str:
    return f"{HEADER}inputs={digest} python={target.python} platform={target.platform}\n"


def read_header(path: Path) -> Recorded | None:
    """The recorded inputs; None for a file without our header. OSError if unreadable."""
    if not path.is_file():  # a FIFO or a directory must not hang or crash the read
        raise FileNotFoundError(2, "not a file", str(path))
    with path.open("rb") as f:
        line = f.readline(4096).decode("utf-8", errors="replace")
    if not line.startswith(HEADER):
        return None
    fields = dict(part.partition("=")[::2] for part in line[len(HEADER):].split())
    if not all(fields.get(k) for k in ("inputs", "python", "platform")):
        return None
    return Recorded(fields["inputs"], Resolution(fields["python"], fields["platform"]))


def state(config: Config, target: Resolution | None) -> LockState:
    """Whether the lock matches today's config; with no ``target``, the recorded one counts."""
    lock = _configured(config)
    try:
        recorded = read_header(lock)
    except OSError:
        return "missing"
    if recorded is None:
        return "stale"
    digest = inputs_digest(config, target or recorded.target)
    return "current" if recorded.inputs == digest else "stale"


def require_current(config: Config) -> None:
    """Refuse (exit 2) a missing or stale lock, before anything is locked or built."""
    if config.lock is None:
        return
    lock = config.lock
    target = resolution_of(config, make_uv(config.constraints, config.uv_args))
    found = state(config, target)
    if found == "missing":
        raise LockfileError(f"lock file {lock} does not exist or cannot be read; run "
                            "`kernel-bootstrap lock` to create it")
    if found == "stale":
        raise LockfileError(f"lock file {lock} was made from other inputs than the config "
                            f"{config.path}{_target_change(lock, target)}; nothing was changed. "
                            "Run `kernel-bootstrap lock` to update it")


def _target_change(lock: Path, target: Resolution) -> str:
    try:
        recorded = read_header(lock)
    except OSError:
        return ""
    if recorded is None:
        return " (it has no kernel-bootstrap header)"
    if recorded.target != target:
        return (f" (it is for Python {recorded.target.python} on {recorded.target.platform}, "
                f"the config's interpreter is Python {target.python} on {target.platform})")
    return " (requirements, constraints or uv-args changed)"


def install_args(lock: Path) -> list[str]:
    """``uv pip install`` arguments that install exactly the lock's pins, hashes required."""
    # uv 0.13.9 reads a pylock.toml given to -r as a preview feature; naming it keeps uv's
    # "experimental" warning out of every install's output.
    preview = ["--preview-features", "pylock"] if is_pylock(lock) else []
    return [*preview, "-r", str(lock), "--require-hashes"]


def install_locked(uv: Uv, python: Path, lock: Path) -> None:
    log.info("installing the pinned runtime", lock=str(lock))
    # Offline first: the pins and hashes are exact, so a cached artifact is the one the index
    # would serve, and asking the index for each of them cost 0.8 s where the cache took 0.12.
    uv.install_exact(python, install_args(lock),
                     what=f"uv could not install the pins of {lock} (the live venv, if any, "
                          "is unchanged)")


def _configured(config: Config) -> Path:
    if config.lock is None:
        raise ConfigError(f"{config.path}: no `lock` is configured; add `lock = \"pylock.toml\"` "
                          "(or a requirements file name) to pin the runtime")
    return config.lock


# -- writing -----------------------------------------------------------------------------------
def write(config: Config, *, upgrade: bool = False) -> LockResult:
    """Resolve into the lock file; unchanged inputs without ``upgrade`` leave it untouched."""
    from bootstrap.primitives.atomic import write_atomic

    lock = _configured(config)
    validate_requirements(config)
    uv = make_uv(config.constraints, config.uv_args, Network(config.offline, config.uv_args))
    target = resolution_of(config, uv)
    digest = inputs_digest(config, target)
    if not upgrade and state(config, target) == "current":
        return LockResult(lock, lock_format(lock), False, digest, len(pins(lock)))
    body = _compile(config, uv, lock, upgrade)
    data = (header(digest, target) + NOTE + body).encode("utf-8")
    changed = _read_bytes(lock) != data
    if changed:
        write_atomic(lock, data)
        log.info("lock file written", lock=str(lock), inputs=digest)
    return LockResult(lock, lock_format(lock), changed, digest, len(pins(lock)))


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


def _compile(config: Config, uv: Uv, lock: Path, upgrade: bool) -> str:
    """``uv pip compile`` in a scratch directory, so that uv's notes read ``-r requirements.in``
    rather than a temp path, and the lock is only replaced once the whole result is known."""
    scratch = Path(tempfile.mkdtemp(prefix="kernel-bootstrap-lock-"))
    with removed_on_exit(scratch):
        (scratch / _SOURCE).write_text("".join(f"{r}\n" for r in config.requirements),
                                       encoding="utf-8")
        output = scratch / lock.name
        if not upgrade and lock.is_file():
            # uv keeps the pins of an existing output file where they still fit, so a changed
            # requirement moves only the packages it has to.
            shutil.copyfile(lock, output)
        args = ["pip", "compile", "--quiet", "--generate-hashes", "--no-header",
                "--format", lock_format(lock), "--python", config.python, "-o", lock.name]
        if config.constraints is not None:
            args += ["--constraints", str(config.constraints)]
        if upgrade:
            args.append("--upgrade")
        args += uv.network.args(config.uv_args)
        process.run(uv.exe, *args, *resolution_args(config.uv_args), _SOURCE, cwd=scratch,
                    env=environment(), error=UvError,
                    what=f"uv could not resolve the requirements into {lock}")
        return _without_header(output.read_text(encoding="utf-8"))


def _without_header(text: str) -> str:
    # A copied-in old lock keeps our header when uv has nothing to change; it is rewritten.
    lines = text.splitlines(keepends=True)
    while lines and (lines[0].startswith(HEADER) or lines[0] == NOTE):
        lines.pop(0)
    return "".join(lines)


# -- reading the pins --------------------------------------------------------------------------
def pins(lock: Path) -> dict[str, str]:
    """Normalised name -> pinned version, as the lock lists them (empty if unreadable)."""
    try:
        text = lock.read_text(encoding="utf-8") if lock.is_file() else ""
    except (OSError, UnicodeDecodeError):
        return {}
    return _pylock_pins(text) if is_pylock(lock) else _requirement_pins(text)


def _requirement_pins(text: str) -> dict[str, str]:
    import re

    found: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)", line)
        if match:
            found[canonical(match[1])] = match[2]
    return found


def _pylock_pins(text: str) -> dict[str, str]:
    import tomllib

    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError, RecursionError):
        return {}
    packages = data.get("packages")
    if not isinstance(packages, list):
        return {}
    return {canonical(str(p["name"])): str(p.get("version", "")) for p in packages
            if isinstance(p, dict) and "name" in p}



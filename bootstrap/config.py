"""The config file (TOML) → a frozen :class:`Config`, with env overrides and named-key errors.

Validation here is cheap on purpose (it runs on the warm path): types, unknown keys, skill
discovery. Requirements are checked against PEP 508 by :func:`validate_requirements`, which
the slow path calls before it creates or installs anything.
"""

from __future__ import annotations

import glob
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from bootstrap.config_file import (
    PYPROJECT,
    Reader,
    exists,
    find_config_file,
    missing_message,
    read_toml,
    refuse_missing,
    resolve,
    short,
    source_name,
    table_of,
)
from bootstrap.config_kernel import kernel_keys
from bootstrap.errors import ConfigError, SkillError
from bootstrap.places import default_venv, legacy_default
from bootstrap.trees.discovery import glob_dirs
from bootstrap.trees.skillmd import Checked, check_layout, checked

if TYPE_CHECKING:
    from bootstrap.sources.spec import GitSource

_KEYS: Final = frozenset(
    {"venv", "python", "requirements", "constraints", "uv-args", "skills", "ready-check",
     "snapshots", "lock", "offline", "skills-lock", "kernel-server", "kernel-preload",
     "kernel-idle-timeout", "kernel-preload-timeout", "kernel-spares", "git-timeout",
     "git-safe-directories", "compile-bytecode"}
)
# Environment variables that mean `offline = true` (uv's own among them).
OFFLINE_ENV: Final = ("KERNEL_BOOTSTRAP_OFFLINE", "UV_OFFLINE")


@dataclass(frozen=True)
class Skill:
    """A configured skill: a directory holding SKILL.md, a Python skill if it has a pyproject."""

    name: str
    path: Path

    @property
    def pyproject(self) -> Path:
        return self.path / PYPROJECT

    @property
    def is_python(self) -> bool:
        return self.pyproject.is_file()

    @property
    def spec(self) -> Checked:
        """Its SKILL.md under the Agent Skills spec (parsed on first use, never on the warm
        path): a skill with errors is a failed skill, not a config error."""
        return checked(self.path)


@dataclass(frozen=True)
class Config:
    """A validated config (see :func:`load_config`): absolute paths, env overrides applied."""

    path: Path | None
    venv: Path
    python: str
    requirements: tuple[str, ...] = ()
    constraints: Path | None = None
    uv_args: tuple[str, ...] = ()
    skills: tuple[Skill, ...] = ()
    ready_check: str | None = None
    snapshots: Path | Bucket | None = None
    # The lock file `kernel-bootstrap lock` writes: ensure installs exactly its pins.
    lock: Path | None = None
    # KERNEL_BOOTSTRAP_PYTHON: use this interpreter as it is; no venv is managed.
    override_python: Path | None = None
    # Directories skill discovery listed: a skill appearing in one changes its mtime, which is
    # how the warm path notices (see bootstrap.warm).
    watch: tuple[Path, ...] = ()
    # Never contact a package index: every uv call gets --offline (see bootstrap.env.network).
    offline: bool = False
    # Install with `uv pip install --compile-bytecode` (bootstrap.env.bytecode): a kernel start
    # under PYTHONDONTWRITEBYTECODE=1 (common in images) otherwise recompiles every import.
    compile_bytecode: bool = True
    # Where ``venv`` came from: "config" (the key), "KERNEL_BOOTSTRAP_VENV", or "default"
    # (this config's own, :func:`default_venv`); ``status`` says so.
    venv_from: str = "config"
    # The kernel server (bootstrap.kernels): `kernel-server` as configured (whether one runs is
    # bootstrap.kernels.enabled's answer: $KERNEL_BOOTSTRAP_KERNEL_SERVER and the platform too),
    # the modules it imports before any request, and how long it waits for one before it exits.
    kernel_server: bool = True
    kernel_preload: tuple[str, ...] = ()
    kernel_idle_timeout: float = 900.0
    kernel_preload_timeout: float = 60.0
    # Kernels the server keeps prepared, each claimed by one request (bootstrap.kernels.spare).
    kernel_spares: int = 1
    # `skills` entries that are inline tables (bootstrap.sources): ``skills`` holds only those
    # of their skills the skills lock names and the cache holds; ``prepare`` adds the rest.
    git_sources: tuple[GitSource, ...] = ()
    skills_lock: Path | None = None

    @property
    def python_skills(self) -> tuple[Skill, ...]:
        return tuple(s for s in self.skills if s.is_python)


# The object stores a ``snapshots`` URL may name (the ``cloud`` extra serves each).
SCHEMES: Final = ("s3", "gs", "az")


@dataclass(frozen=True)
class Bucket:
    """A snapshot store in object storage: ``s3://BUCKET/PREFIX`` (gs:// and az:// alike)."""

    url: str

    def __str__(self) -> str:
        return self.url


def bucket_url(value: str) -> Bucket | None:
    """The bucket ``value`` names, None if it is no URL (a directory); ValueError for a URL
    with another scheme or no bucket name (the prefix may be empty)."""
    if "://" not in value:
        return None
    scheme, _, rest = value.partition("://")
    if scheme not in SCHEMES or not rest.split("/", 1)[0]:
        raise ValueError(value)
    return Bucket(value.rstrip("/"))


def load_config(path: Path | str | None = None) -> Config:
    """Find (see :func:`find_config_file`), read, validate and resolve the config (the keys:
    docs/architecture.md, README). Anything wrong is a
    :class:`~bootstrap.errors.ConfigError` naming the file, and the key or table."""
    explicit = Path(path) if path is not None else None
    file = find_config_file(explicit).absolute()
    data = read_toml(file, missing_message(explicit))
    if file.name == PYPROJECT:
        data = table_of(data, file)
    return config_from_dict(data, file)


def config_from_dict(data: dict[str, Any], file: Path) -> Config:
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(
            f"{source_name(file)}: unknown key {short(unknown[0])} "
            f"(known: {', '.join(sorted(_KEYS))})")
    base = file.parent
    reader = Reader(file, data)
    venv, venv_from = _venv(reader, base, file)
    missing: list[str] = []  # every path named that does not exist: one error names them all
    constraints = reader.path("constraints", base)
    if constraints is not None and not exists(constraints, file, "constraints", "file"):
        missing.append(f"key 'constraints': file not found: {constraints}")
    snapshots_env = os.environ.get("KERNEL_BOOTSTRAP_SNAPSHOTS")
    snapshots = _snapshots(snapshots_env or reader.string("snapshots"), base,
                           "KERNEL_BOOTSTRAP_SNAPSHOTS" if snapshots_env
                           else f"{source_name(file)}: key 'snapshots'")
    override = os.environ.get("KERNEL_BOOTSTRAP_PYTHON")
    patterns, git_sources = _skill_entries(reader)
    if "git-timeout" in data or "git-safe-directories" in data:
        from bootstrap.sources.spec import with_transport

        git_sources = with_transport(reader, git_sources)
    skills, watch = discover_skills(patterns, base, file, missing)
    refuse_missing(file, missing, reader.path("lock", base))
    skills_lock = reader.path("skills-lock", base) or base / "skills-lock.toml"
    if git_sources:
        from bootstrap.sources.cached import cached_skills

        skills = _with_cached(skills, cached_skills(git_sources, skills_lock), file)
    return Config(
        path=file,
        venv=venv,
        python=reader.string("python") or default_python(),
        requirements=reader.strings("requirements"),
        constraints=constraints,
        uv_args=reader.strings("uv-args"),
        skills=skills,
        ready_check=reader.string("ready-check"),
        snapshots=snapshots,
        lock=reader.path("lock", base),
        override_python=Path(override) if override else None,
        watch=watch,
        offline=offline_from_env() is not None or reader.boolean("offline"),
        venv_from=venv_from,
        compile_bytecode=reader.boolean("compile-bytecode", default=True),
        git_sources=git_sources,
        skills_lock=skills_lock,
        **kernel_keys(reader),
    )


def _skill_entries(reader: Reader) -> tuple[tuple[str | None, ...], tuple[GitSource, ...]]:
    """``skills``: local patterns (None where an entry is a git source, so that indices stay
    those of the file) and the git sources (bootstrap.sources.spec checks them)."""
    entries = reader.data.get("skills", [])
    if not isinstance(entries, list) or not all(isinstance(e, (str, dict)) for e in entries):
        raise reader.bad("skills", "a list of strings (paths, globs) and inline tables "
                          "(git sources)")
    if all(isinstance(e, str) for e in entries):
        return reader.strings("skills"), ()
    from bootstrap.sources.spec import parse

    patterns = tuple(reader.check_text(f"skills[{i}]", e) if isinstance(e, str) else None
                     for i, e in enumerate(entries))
    sources = tuple(parse(i, e, reader.file) for i, e in enumerate(entries) if isinstance(e, dict))
    return patterns, sources


def _with_cached(skills: tuple[Skill, ...], cached: list[tuple[str, Path, str]],
                 file: Path) -> tuple[Skill, ...]:
    """The local skills plus the git ones already in the cache (name, tree, how to name its
    source); one name twice is an error naming both."""
    found = {s.name: (s, str(s.path)) for s in skills}
    for name, path, where in cached:
        skill = Skill(name, path)
        other, named = found.setdefault(name, (skill, where))
        if other is not skill:
            raise ConfigError(f"{source_name(file)}: two skills named {skill.name!r}: "
                              f"{named} and {where}")
    return tuple(s for s, _ in found.values())


def _venv(reader: Reader, base: Path, file: Path) -> tuple[Path, str]:
    """The venv path and where it came from (see :attr:`Config.venv_from`), checked."""
    venv_env = os.environ.get("KERNEL_BOOTSTRAP_VENV")
    if venv_env:
        venv, origin = resolve(base, venv_env), "KERNEL_BOOTSTRAP_VENV"
        where = origin
    elif (named := reader.path("venv", base)) is not None:
        venv, origin, where = named, "config", f"{source_name(file)}: key 'venv'"
    else:
        venv, origin, where = default_venv(file), "default", "the default venv"
        legacy = legacy_default(venv)
        if legacy is not None:
            from bootstrap.primitives import log

            log.warning(f"configs without `venv` no longer share {legacy}; this one uses {venv}, "
                        f"built at the next ensure (to keep the old one, set venv = \"{legacy}\" "
                        f"in {source_name(file)})")
    _check_venv_path(venv, where)
    return venv, origin


def offline_from_env() -> str | None:
    """The environment variable that asks for offline (set to 1, true, yes or on), if any."""
    for name in OFFLINE_ENV:
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return name
    return None


def _snapshots(value: str | None, base: Path, where: str) -> Path | Bucket | None:
    """A directory, or a bucket URL (``s3://BUCKET/PREFIX``)."""
    try:
        bucket = bucket_url(value) if value is not None else None
    except ValueError:
        raise ConfigError(f"{where}: {short(value)} is neither a directory nor a bucket URL "
                          "(s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://...)") from None
    return bucket if bucket is not None or value is None else resolve(base, value)


# A file name holds at most 255 bytes on every filesystem we run on, and the venv's siblings
# (lock, holder record, staging and scratch trees, temp files) add up to ~40 bytes to its name:
# a longer name was accepted and then failed at the lock with a bare "File name too long".
NAME_MAX: Final = 255
_SIBLING_ROOM: Final = 64
# PATH_MAX is 4096 on Linux; the venv's own tree (lib/pythonX.Y/site-packages/...) needs room.
_VENV_PATH_MAX: Final = 3072


def _check_venv_path(venv: Path, where: str) -> None:
    """The venv path must leave room for what we put beside it and inside it."""
    if not venv.name:  # "/", "//", "/.": there is nowhere beside it for a lock or a rebuild
        raise ConfigError(f"{where}: the venv cannot be the root directory {short(str(venv))}; "
                          "name a directory of its own, such as /opt/kernel-venv")
    raw = os.fsencode(venv)
    longest = max((len(part) for part in raw.split(os.fsencode(os.sep))), default=0)
    if len(os.fsencode(venv.name)) > NAME_MAX - _SIBLING_ROOM or longest > NAME_MAX:
        raise ConfigError(
            f"{where}: the venv's name is too long ({len(os.fsencode(venv.name))} bytes; at most "
            f"{NAME_MAX - _SIBLING_ROOM}, to leave room for its lock and staging siblings): "
            f"{short(str(venv))}")
    if len(raw) > _VENV_PATH_MAX:
        raise ConfigError(f"{where}: the venv's path is too long ({len(raw)} bytes; at most "
                          f"{_VENV_PATH_MAX}): {short(str(venv))}")


def default_python() -> str:
    # The interpreter running kernel-bootstrap; its base so that running us from one venv does
    # not make the managed venv depend on that venv.
    return str(getattr(sys, "_base_executable", None) or sys.executable)


def discover_skills(
    patterns: tuple[str | None, ...], base: Path, file: Path, missing: list[str]
) -> tuple[tuple[Skill, ...], tuple[Path, ...]]:
    """Expand ``skills`` entries: a glob keeps the matches holding SKILL.md; a plain path must
    be a skill (a missing one, or a glob's missing directory, goes into ``missing``). Two
    skills with the same name are an error naming both paths. Also returns the directories
    the expansion depended on."""
    found: dict[str, Skill] = {}
    watch: list[Path] = []
    for index, pattern in enumerate(patterns):
        if pattern is None:  # a git source (bootstrap.sources)
            continue
        if glob.has_magic(pattern):
            watch += glob_dirs(resolve(base, pattern))
        for path in _expand(pattern, base, file, index, missing):
            try:
                name = check_layout(path)
            except SkillError as e:
                raise SkillError(f"{source_name(file)}: skills[{index}]: {e}") from None
            other = found.get(name)
            if other is not None and other.path != path:
                raise ConfigError(
                    f"{source_name(file)}: two skills named {name!r}: {other.path} and {path}"
                )
            found[name] = Skill(name, path)
            _warn_special([path / PYPROJECT], f"skill {name!r} is taken as a plain skill")
    return tuple(found.values()), tuple(dict.fromkeys(watch))


def _warn_special(paths: list[Path], consequence: str) -> None:
    """A FIFO or device where a skill's file belongs used to make its directory silently not
    a skill (SKILL.md), or silently a plain one (pyproject.toml): say so, naming the file."""
    from bootstrap.primitives import log
    from bootstrap.primitives.fs import special_kind

    for path, kind in ((p, special_kind(p)) for p in paths):
        if kind is not None:
            log.warning(f"{path} is a {kind}, not a file; {consequence}", path=str(path))


def _expand(pattern: str, base: Path, file: Path, index: int, missing: list[str]) -> list[Path]:
    full = resolve(base, pattern)
    if glob.has_magic(pattern):
        matches = sorted(Path(m) for m in glob.glob(str(full)))
        # os.path.isfile: a match we cannot read is skipped, as glob itself skips those.
        skills = [m for m in matches if os.path.isfile(m / "SKILL.md")]
        _warn_special([m / "SKILL.md" for m in matches], "the directory is not a skill")
        if not skills:
            _matches_nothing(pattern, full, file, index, missing)
        return skills
    if not exists(full, file, f"skills[{index}]", "dir"):
        missing.append(f"skills[{index}]: not a directory: {full}")
        return []
    return [full]


def _matches_nothing(pattern: str, full: Path, file: Path, index: int,
                     missing: list[str]) -> None:
    """A typo in the fixed part (``skils/*``) is an error: it used to uninstall every skill and
    exit 0. An existing directory with no skill in it yet is only worth a warning."""
    root = glob_dirs(full)[0]
    if not exists(root, file, f"skills[{index}]", "dir"):
        missing.append(f"skills[{index}]: the pattern {pattern!r} matches nothing: {root} does "
                       "not exist (a typo?)")
        return
    from bootstrap.primitives import log
    log.warning("a skills pattern matches no skill", pattern=pattern, directory=str(root),
                config=source_name(file))

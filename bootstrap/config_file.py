"""Which file is the config, and reading it: ``--config``, ``$KERNEL_BOOTSTRAP_CONFIG``,
``./kernel-bootstrap.toml``, or the ``[tool.kernel-bootstrap]`` table of ``./pyproject.toml``;
TOML parsed with every way it can fail named; typed access to its keys (:class:`Reader`). What the
keys mean is ``config.py``'s.
"""

from __future__ import annotations

import os
import reprlib
from pathlib import Path
from typing import Any, Final

from bootstrap.errors import ConfigError

DEFAULT_FILE: Final = "kernel-bootstrap.toml"
PYPROJECT: Final = "pyproject.toml"
# The table of a pyproject.toml that configures us, as ruff's and pytest's do them.
TABLE: Final = "tool.kernel-bootstrap"
ENV_CONFIG: Final = "KERNEL_BOOTSTRAP_CONFIG"


def find_config_file(explicit: Path | None) -> Path:
    """``--config``, else ``$KERNEL_BOOTSTRAP_CONFIG``, else ``./kernel-bootstrap.toml``, else
    ``./pyproject.toml`` when it has a ``[tool.kernel-bootstrap]`` table (``bootstrap.warm``
    discovers the same file without reading TOML)."""
    if explicit is not None:
        return explicit
    env = os.environ.get(ENV_CONFIG)
    if env:
        return Path(env)
    if not os.path.exists(DEFAULT_FILE) and _has_table(Path(PYPROJECT)):
        return Path(PYPROJECT)
    return Path(DEFAULT_FILE)


def source_name(file: Path | None) -> str:
    """How messages name a config source: the file, and the table when it is a pyproject."""
    return f"{file} [{TABLE}]" if file is not None and file.name == PYPROJECT else f"{file}"


def missing_message(explicit: Path | None) -> str:
    """What to say when the chosen config file does not exist, by where its name came from."""
    if explicit is not None:
        return f"config file {explicit} does not exist"
    env = os.environ.get(ENV_CONFIG)
    if env:
        return f"config file {env} (from {ENV_CONFIG}) does not exist"
    return (f"no config file: ./{DEFAULT_FILE} does not exist and ./{PYPROJECT} has no "
            f"[{TABLE}] table; run `kernel-bootstrap init` to write one, or pass --config PATH")


def _has_table(pyproject: Path) -> bool:
    """Whether ``pyproject`` configures us; one we cannot parse does (its error is reported)."""
    import tomllib

    try:
        data = tomllib.loads(pyproject.read_bytes().decode("utf-8"))
    except OSError:
        return False
    except (ValueError, RecursionError):  # includes TOMLDecodeError and UnicodeDecodeError
        return True
    tool = data.get("tool")
    return isinstance(tool, dict) and "kernel-bootstrap" in tool


def table_of(data: dict[str, Any], file: Path) -> dict[str, Any]:
    tool = data.get("tool")
    table = tool.get("kernel-bootstrap") if isinstance(tool, dict) else None
    if table is None:
        raise ConfigError(f"{source_name(file)}: no [{TABLE}] table")
    if not isinstance(table, dict):
        raise ConfigError(f"{source_name(file)}: must be a table, got {type(table).__name__}")
    return table


def read_toml(file: Path, missing: str = "") -> dict[str, Any]:
    import tomllib

    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise ConfigError(missing or f"config file {file} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{source_name(file)}: cannot read config file: {e.strerror}") from None
    except ValueError:  # NUL or an unencodable character in the path itself
        raise ConfigError(f"{short(str(file))}: not a usable file name") from None
    try:
        text = raw.decode("utf-8")
        return tomllib.loads(text)
    except UnicodeDecodeError:
        raise ConfigError(f"{source_name(file)}: config file is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source_name(file)}: invalid TOML: {_located(str(e), text)}"
                          ) from None
    # Found by fuzzing: tomllib lets int()'s 4300-digit limit (ValueError) and deep arrays
    # (RecursionError) escape as themselves instead of as TOMLDecodeError.
    except ValueError as e:
        raise ConfigError(f"{source_name(file)}: invalid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{source_name(file)}: invalid TOML: values nested too deeply") from None


def exists(path: Path, file: Path, where: str, kind: str) -> bool:
    """Whether ``path`` is a directory (``kind`` "dir") or a file; an unreadable one is an
    error naming it, and ``where`` in ``file`` that names it."""
    try:
        return path.is_dir() if kind == "dir" else path.is_file()
    except OSError as e:  # e.g. ENAMETOOLONG or EACCES, which pathlib does not swallow
        raise ConfigError(f"{source_name(file)}: {where}: cannot read {short(str(path))}: "
                          f"{e.strerror}") from None


def refuse_missing(file: Path, missing: list[str], lock: Path | None) -> None:
    """One error naming every path in ``missing`` (the config's words for each), with the lock
    file when it is missing too (alone it is no error: `kernel-bootstrap lock` writes it).
    Named one at a time, a config copied from the README failed once per file."""
    if not missing:
        return
    if lock is not None and not os.path.isfile(lock):
        missing = [*missing, f"key 'lock': file not found: {lock} (`kernel-bootstrap lock` "
                             "writes it)"]
    if len(missing) == 1:
        raise ConfigError(f"{source_name(file)}: {missing[0]}")
    raise ConfigError(f"{source_name(file)}: {len(missing)} paths it names do not exist:\n"
                      + "\n".join(f"  {m}" for m in missing))


def _located(message: str, text: str) -> str:
    """tomllib's ``message`` with the line it names quoted under it; "at end of document" (an
    unclosed array, a key with no value) named no line: the last one that holds text."""
    lines = text.splitlines()
    number = None
    if message.endswith("(at end of document)"):
        number = max((i for i, line in enumerate(lines, 1) if line.strip()), default=None)
        message = message[:-1] + (f", after line {number})" if number else ")")
    elif "(at line " in message:
        digits = message.rpartition("(at line ")[2].partition(",")[0]
        number = int(digits) if digits.isdigit() else None
    if number is None or not 0 < number <= len(lines):
        return message
    quoted = lines[number - 1].strip()
    return f"{message}\n  line {number}: {quoted if len(quoted) <= 120 else quoted[:117] + '...'}"


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80


def short(value: object) -> str:
    """A bounded repr: a value in an error message may be anything TOML can hold."""
    text = _repr.repr(value)  # bounded depth and item counts, yet nested items add up
    return text if len(text) <= 160 else text[:157] + "..."


def resolve(base: Path, value: str) -> Path:
    # os.path.expanduser, not Path.expanduser: for an unknown "~user" the latter raises
    # RuntimeError (found by fuzzing); the former leaves the text as it is.
    return Path(os.path.normpath(base / os.path.expanduser(value)))


class Reader:
    """Typed access to config keys; every error names the file and the key."""

    def __init__(self, file: Path, data: dict[str, Any]) -> None:
        self.file = file
        self.data = data

    def bad(self, key: str, expected: str) -> ConfigError:
        value = self.data[key]
        return ConfigError(
            f"{source_name(self.file)}: key {key!r} must be {expected}, got {type(value).__name__} "
            f"{short(value)}"
        )

    def check_text(self, where: str, value: str) -> str:
        # Every string ends up as a path or a command-line argument: the OS takes neither with
        # a NUL, nor a lone surrogate outside the range that stands for undecodable bytes.
        if "\x00" in value:
            raise ConfigError(f"{source_name(self.file)}: {where} contains a NUL character: "
                              f"{short(value)}")
        try:
            os.fsencode(value)
        except UnicodeEncodeError:
            raise ConfigError(f"{source_name(self.file)}: {where} cannot be encoded for the "
                              "operating system: "
                              f"{short(value)}") from None
        return value

    def string(self, key: str) -> str | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.bad(key, "a non-empty string")
        return self.check_text(f"key {key!r}", value)

    def boolean(self, key: str, *, default: bool = False) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.bad(key, "true or false")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.bad(key, "a list of strings")
        return tuple(self.check_text(f"{key}[{i}]", v) for i, v in enumerate(value))

    def path(self, key: str, base: Path) -> Path | None:
        value = self.string(key)
        return resolve(base, value) if value is not None else None

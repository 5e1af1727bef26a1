"""The warm path: answer "ready" from a stat fingerprint, importing nothing but ``os``.

Agent kernels call ``ensure`` at every start, and a bare interpreter start costs ~11-14 ms here;
importing json, tomllib, hashlib, dataclasses or argparse would each add a few ms more. So
after a full check found everything ready, we record a fingerprint of every file and directory
that check depended on (config file, skill directories and glob parents, SKILL.md and
pyproject.toml files, constraints, pyvenv.cfg, the marker, the interpreter) in a small text file
under the user cache dir. The next start re-stats those paths; if all are identical (inode,
size, mtime and ctime, which no user can set), nothing the full check read has changed and it
would answer "ready" again. Any difference, or any doubt, falls through to the full check.

Nothing here writes on the warm path: the fingerprint is written only after a full check.
"""

from __future__ import annotations

import os
import stat  # already imported by os itself: free
import sys

# 2: generations. A format-1 fingerprint may vouch for a plain-directory venv of an earlier
# release, which the first full check converts into a generation: it must not answer "ready".
FORMAT = "kernel-bootstrap-warm 2"
# Environment that changes what the full check would conclude.
ENV_KEYS = ("KERNEL_BOOTSTRAP_VENV", "KERNEL_BOOTSTRAP_PYTHON", "KERNEL_BOOTSTRAP_SNAPSHOTS",
            "KERNEL_BOOTSTRAP_NO_GENERATIONS")
_MAX_NAME = 200
# A fingerprint of a config with 1,000 skills is ~300 KiB; anything bigger is not ours.
_MAX_FINGERPRINT = 4 * 1024 * 1024


def cache_dir() -> str:
    """Where fingerprints live: platformdirs' user cache dir for kernel-bootstrap (a test
    holds the two together), without platformdirs' import cost."""
    home = os.path.expanduser("~")
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
        return os.path.join(base, "kernel-bootstrap", "Cache")
    # platformdirs takes $XDG_CACHE_HOME on macOS too, and only when it is absolute.
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg.startswith("/"):
        return os.path.join(xdg, "kernel-bootstrap")
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "Caches", "kernel-bootstrap")
    return os.path.join(home, ".cache", "kernel-bootstrap")


def fingerprint_path(config_file: str) -> str | None:
    """One fingerprint per config file; None when its name would be unreasonably long."""
    name = config_file.replace("%", "%25").replace(os.sep, "%2F")
    if len(name) > _MAX_NAME:
        return None
    return os.path.join(cache_dir(), "warm", name)


def stamp(path: str) -> str:
    """What we compare: identity, size and both times; "-" for a path that does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def stamps(paths: list[str]) -> list[tuple[str, str]]:
    return [(p, stamp(p)) for p in paths]


def render(config_file: str, venv: str, python: str, stamped: list[tuple[str, str]]) -> str:
    """The fingerprint text; ``stamped`` were taken before the check that found us ready."""
    lines = [FORMAT, f"config\t{config_file}", f"venv\t{venv}", f"python\t{python}"]
    lines += [f"env\t{k}\t{os.environ.get(k, '')}" for k in ENV_KEYS]
    lines += [f"stat\t{p}\t{s}" for p, s in stamped]
    return "\n".join(lines) + "\n"


def save(config_file: str, venv: str, python: str, stamped: list[tuple[str, str]]) -> None:
    """Write the fingerprint (slow path only); a failure just means no warm path next time."""
    path = fingerprint_path(config_file)
    if path is None or any("\t" in p or "\n" in p for p, _ in stamped):
        return
    from pathlib import Path

    from bootstrap.primitives.atomic import write_atomic

    text = render(config_file, venv, python, stamped)
    # Every warm in-process ensure() lands here; rewriting identical bytes cost an fsync'd
    # replace (~1.3 ms, more than the rest of the call) and broke "the warm path writes nothing".
    if _read(path) == text:
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(path), text.encode("utf-8"))
    except OSError:
        pass


def forget(config_file: str) -> None:
    import contextlib

    path = fingerprint_path(config_file)
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _read(path: str) -> str | None:
    """The fingerprint's text, read as ``fs.read_state_file`` reads our state files
    (never through a symlink, never blocking on a FIFO, regular files only, capped), with
    ``os`` alone: importing bootstrap.primitives.fs costs more than the whole warm path."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_FINGERPRINT:
            return None
        data = os.read(fd, _MAX_FINGERPRINT + 1)
        return data.decode("utf-8") if len(data) <= _MAX_FINGERPRINT else None
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def check(config_file: str) -> tuple[str, str] | None:
    """(venv, interpreter) if the fingerprint for ``config_file`` still holds, else None."""
    path = fingerprint_path(config_file)
    text = _read(path) if path is not None else None
    if text is None:
        return None
    lines = text.split("\n")
    if len(lines) < 4 or lines[0] != FORMAT or lines[-1] != "":
        return None
    python = venv = None
    for line in lines[1:-1]:
        fields = line.split("\t")
        kind = fields[0]
        if kind == "config" and fields[1:] != [config_file]:
            return None
        elif kind == "python" and len(fields) == 2:
            python = fields[1]
        elif kind == "venv" and len(fields) == 2:
            venv = fields[1]
        elif kind == "env" and len(fields) == 3:
            if os.environ.get(fields[1], "") != fields[2]:
                return None
        elif kind == "stat" and len(fields) == 3:
            if stamp(fields[1]) != fields[2]:
                return None
        elif kind != "config":
            return None
    if python is None or venv is None:
        return None
    return venv, python


def config_file_for(explicit: str | None) -> str | None:
    """The config file the CLI would use, made absolute as bootstrap.config makes it
    (``Path.absolute()``); None for a spelling whose absolute form this could get wrong
    (``..``, ``.``, doubled separators): those go the long way.

    Without reading TOML, a ``./pyproject.toml`` beside no ``./kernel-bootstrap.toml`` is taken
    as the config even when it has no ``[tool.kernel-bootstrap]`` table: the full path never
    saved a fingerprint for such a file, so the check falls through to its answer.
    """
    chosen = explicit or os.environ.get("KERNEL_BOOTSTRAP_CONFIG") or _default_file()
    if os.path.normpath(chosen) != chosen:
        return None
    return chosen if os.path.isabs(chosen) else os.path.join(os.getcwd(), chosen)


def _default_file() -> str:
    if not os.path.exists("kernel-bootstrap.toml") and os.path.isfile("pyproject.toml"):
        return "pyproject.toml"
    return "kernel-bootstrap.toml"


def parse_seconds(text: str) -> float | None:
    """A ``--lock-timeout`` value as the CLI takes it (a number, 0 or more); None if invalid."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 else None  # also refuses NaN


# Global options (before or after the subcommand) that change nothing a warm "ready" prints.
_GLOBAL_FLAGS = ("-q", "-qq", "--quiet")
_WITH_VALUE = ("--config", "--log-format", "--lock-timeout")
_ENSURE_ONLY = ("--json", "--strict", "--lock-timeout")


def parse_args(argv: list[str]) -> tuple[str | None, bool] | None:
    """(``--config`` value, ``--json``) for the plain ``ensure`` forms; None for anything else.

    Only the forms the full parser (bootstrap.cli) reads the same way are answered here: before
    or after ``ensure``, ``--config PATH``, ``--config=PATH``, ``-q``, ``--quiet``,
    ``--log-format console|json``; after it, ``--json``, ``--strict`` and ``--lock-timeout
    SECONDS`` with a valid value. Anything else (``-v``, abbreviations, ``--lock-timeout abc``, a
    value that looks like an option) goes the long way, so it gets the full parser's answer.
    """
    config: str | None = None
    as_json = False
    seen_command = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "ensure" and not seen_command:
            seen_command = True
        elif arg in _WITH_VALUE:
            value = argv[i + 1] if i + 1 < len(argv) else ""
            if not _valid(arg, value, seen_command):
                return None
            config = value if arg == "--config" else config
            i += 1
        elif arg.startswith(("--config=", "--log-format=")):
            name, _, value = arg.partition("=")
            if not _valid(name, value, seen_command):
                return None
            config = value if name == "--config" else config
        elif arg in _ENSURE_ONLY and seen_command:
            as_json = as_json or arg == "--json"
        elif arg not in _GLOBAL_FLAGS:
            return None
        i += 1
    return (config, as_json) if seen_command else None


def _valid(option: str, value: str, after_command: bool) -> bool:
    if not value or value.startswith("-"):
        return False
    if option == "--log-format":
        return value in ("console", "json")
    if option == "--lock-timeout":
        return after_command and parse_seconds(value) is not None
    return True


def try_cli(argv: list[str]) -> int | None:
    """The whole warm ``kernel-bootstrap ensure``; None to fall through to the full CLI."""
    parsed = parse_args(argv)
    if parsed is None or os.environ.get("KERNEL_BOOTSTRAP_PYTHON"):
        return None
    config, as_json = parsed
    config_file = config_file_for(config)
    found = check(config_file) if config_file is not None else None
    if found is None:
        return None
    venv, python = found
    if as_json:
        import json

        print(json.dumps({"python": python, "venv": venv, "action": "ready", "installed": [],
                          "failed": [], "removed": []}))
    else:
        print(python)
    return 0

"""The warm path: answer "ready" from a stat fingerprint, importing nothing but ``os``.

Agent kernels call ``ensure`` at every start, and a bare interpreter start costs ~11-14 ms here;
importing json, tomllib, hashlib, dataclasses or argparse would each add a few ms more. So
after a full check found everything ready, we record a fingerprint of every file and directory
that check depended on (config file, skill directories and glob parents, SKILL.md and
pyproject.toml files, constraints, pyvenv.cfg, the marker, the interpreter) in a small text file
under the user cache dir. The next start re-stats those paths; if all are identical (inode,
size, mtime and ctime, which no user can set), nothing the full check read has changed and it
would answer "ready" again. Any difference, or any doubt, falls through to the full check.

A skill whose failure is backing off (bootstrap.skills.backoff) does not make the start slow: the
fingerprint then also records that failure and when it may be retried, holds only until then,
and the warm path repeats the full path's answer (the warning naming the skill, the skill in
``--json``'s ``failed``, exit 3 with ``--strict``), as for a skill whose SKILL.md is invalid
(held while that file is unchanged). Those records and words are ``bootstrap.warm_failures``.

Nothing here writes on the warm path: the fingerprint is written only after a full check.

One module, past the 400 lines we aim for, on purpose: every module the warm path loads is a
file to find, stat and unmarshal at each kernel start, and the command-line scan, the
fingerprint check and the exec are all of that path (the rarer answers, failures and the
kernel server's hook, are imported only when needed).
"""

from __future__ import annotations

import os
import stat  # already imported by os itself: free
import sys
import time  # built in, and imported by every interpreter's start: free

TYPE_CHECKING = False
if TYPE_CHECKING:  # try_cli's hook: (venv, interpreter, PYTHON-ARGS, config file, kernel-server)
    from collections.abc import Callable, Mapping
    Launch = Callable[[str, str, list[str], str, bool], None]

# 2: generations (a format-1 one may vouch for a plain venv the full check must convert).
# 3: invalid skills; errors as warm_failures.escape writes them (the warm path prints them).
# 4: `kernel-server\toff` when the config turns the kernel server off (the warm `run` reads no
#    TOML).
# 5: every entry of a git skill's tree is stamped, on one `tree` line per tree (a 4 vouched for
#    a tree by its root, SKILL.md and pyproject.toml alone: an edit of another file went unseen).
FORMAT = "kernel-bootstrap-warm 5"
# Environment that changes what the full check would conclude (offline: which failures back off).
ENV_KEYS = ("KERNEL_BOOTSTRAP_VENV", "KERNEL_BOOTSTRAP_PYTHON", "KERNEL_BOOTSTRAP_SNAPSHOTS",
            "KERNEL_BOOTSTRAP_NO_GENERATIONS", "KERNEL_BOOTSTRAP_OFFLINE", "UV_OFFLINE",
            "KERNEL_BOOTSTRAP_KERNEL_SERVER")
_MAX_NAME = 200
# A fingerprint of a config with 1,000 skills is ~300 KiB; anything bigger is not ours.
_MAX_FINGERPRINT = 4 * 1024 * 1024
# Tests move time with this (seconds since the epoch); see now().
CLOCK_ENV = "KERNEL_BOOTSTRAP_TEST_NOW"
# --log-format's value when the option is not given (primitives/log.py: FORMAT_ENV).
LOG_FORMAT_ENV = "KERNEL_BOOTSTRAP_LOG_FORMAT"


def now() -> float:
    """The clock every backoff decision reads, warm or not (bootstrap.skills.backoff uses this one):
    ``$KERNEL_BOOTSTRAP_TEST_NOW`` when set, so that tests control time in child processes."""
    fake = os.environ.get(CLOCK_ENV)
    if fake:
        try:
            return float(fake)
        except ValueError:
            pass
    return time.time()


# No failure waits longer than this from when it was recorded (bootstrap.skills.backoff).
LONGEST_DELAY = 3600.0


def believed(retry_at: float) -> float:
    """A recorded retry time as every backoff decision reads it, warm or not (the one rule):
    itself, or 0 (due) when it lies further ahead of now than :data:`LONGEST_DELAY`. Such a
    time was written by a clock that was ahead (a restored VM, an NTP step back), and its wait
    means nothing. Not capped at now + the longest delay: read again an hour later, that cap
    would be an hour later too, and would never come."""
    return 0.0 if retry_at > now() + LONGEST_DELAY else retry_at


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


def git_trees_dir() -> str:
    """Where git skills' materialised trees live (``bootstrap.sources.paths.trees_root``):
    the fingerprint's writer groups their stamps by tree without importing the sources."""
    return os.path.join(cache_dir(), "git", "trees")


def untrusted(st: os.stat_result) -> str | None:
    """Why a file or directory of our caches must not be believed, or None: owned by another
    user (root excepted: root can write anything anyway), or writable by group or others. The
    rule ssh's StrictModes applies; the one implementation (``bootstrap.places`` uses it), here
    because the warm path may import nothing more."""
    if sys.platform == "win32":  # no uids, and mode bits there say nothing about other users
        return None
    if st.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {st.st_uid}, not by this user"
    if st.st_mode & 0o022:
        return "is writable by group or others"
    return None


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


def _tree_holds(fields: list[str], stamped: set[str]) -> bool:
    """A ``tree`` line (``tree ROOT REL STAMP REL STAMP ...``, "" the root itself): whether
    every entry still has its :func:`stamp`. Each is stat'ed relative to the root's descriptor:
    the kernel then walks one or two names, not the ten of a path into the git cache (a tree
    of 25 files costs ~30% less). Each path joins ``stamped``, as a ``stat`` line's does."""
    root = fields[1]
    relative = os.stat in os.supports_dir_fd
    try:
        fd = os.open(root, os.O_RDONLY) if relative else -1
    except OSError:
        return False
    try:
        for i in range(2, len(fields) - 1, 2):
            rel = fields[i]
            path = f"{root}/{rel}" if rel else root
            if not relative:
                text = stamp(path)
            else:
                try:
                    st = os.stat(rel or ".", dir_fd=fd)
                    text = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
                except OSError:
                    text = "-"
            if text != fields[i + 1]:
                return False
            stamped.add(path)
    finally:
        if relative:
            os.close(fd)
    return True


def read_text(path: str) -> str | None:
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
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_FINGERPRINT or untrusted(st) \
                or not trusted_dir(os.path.dirname(path)):
            return None
        data = os.read(fd, _MAX_FINGERPRINT + 1)
        return data.decode("utf-8") if len(data) <= _MAX_FINGERPRINT else None
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def trusted_dir(path: str) -> bool:
    st = _lstat(path)
    return st is not None and stat.S_ISDIR(st.st_mode) and untrusted(st) is None


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (OSError, ValueError):
        return None


def venv_python(venv: str) -> str:
    """The interpreter of ``venv`` as ``bootstrap.env.venv.interpreter`` spells it."""
    if sys.platform == "win32":
        return os.path.join(venv, "Scripts", "python.exe")
    return os.path.join(venv, "bin", "python")


def check(config_file: str) -> tuple[str, str] | None:
    """(venv, interpreter) if the fingerprint for ``config_file`` still holds, else None."""
    found = holds(config_file)
    return None if found is None else (found[0], found[1])


# What a holding fingerprint says: venv, interpreter, the failures backing off and the invalid
# skills, the refused rebuild's error (all three: bootstrap.warm_failures), the paths stamped,
# and the config's `kernel-server` (False: the config turns the kernel server off).
Held = tuple[str, str, list[tuple[str, int, str, str]], list[tuple[str, str]], str | None,
             frozenset[str], bool]


def holds(config_file: str, environ: Mapping[str, str] | None = None) -> Held | None:
    """What the fingerprint for ``config_file`` says (see :data:`Held`) if it still holds,
    else None. ``environ``: the environment of the start it is asked for (the jupyter_client
    provisioner asks for a kernel's), ``os.environ`` by default."""
    environ = os.environ if environ is None else environ
    path = fingerprint_path(config_file)
    text = read_text(path) if path is not None else None
    if text is None:
        return None
    lines = text.split("\n")
    if len(lines) < 4 or lines[0] != FORMAT or lines[-1] != "":
        return None
    python = venv = None
    serve = True
    recorded: list[list[str]] = []
    stamped: set[str] = set()
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
            if environ.get(fields[1], "") != fields[2]:
                return None
        elif kind == "stat" and len(fields) == 3:
            if stamp(fields[1]) != fields[2]:
                return None
            stamped.add(fields[1])
        elif kind == "tree" and len(fields) % 2 == 0:
            if not _tree_holds(fields, stamped):
                return None
        elif kind == "until" and len(fields) == 2:
            if not _before(fields[1]):
                return None  # a failure is due: the full path retries it
        elif kind in ("failed", "invalid", "refused"):
            recorded.append(fields)
        elif kind == "kernel-server" and fields[1:] == ["off"]:
            serve = False
        elif kind != "config":
            return None
    # Only what the full check would print, and only when it stamped that interpreter and the
    # config: a fingerprint edited to name another program once had the kernel start it.
    if venv is None or python != venv_python(venv) or not {python, config_file} <= stamped:
        return None
    failures = ([], [], None) if not recorded else _failures(recorded)
    return None if failures is None else (venv, python, *failures, frozenset(stamped), serve)


def _failures(recorded: list[list[str]]) -> tuple[list[tuple[str, int, str, str]],
                                                  list[tuple[str, str]], str | None] | None:
    from bootstrap import warm_failures  # only for a fingerprint that records failures

    return warm_failures.parse(recorded)


def _before(deadline: str) -> bool:
    try:
        return now() < believed(float(deadline))
    except ValueError:
        return False


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
_GLOBAL_VALUES = ("--config", "--log-format")
_ENSURE_ONLY = ("--json", "--strict")
# `run --strict` is answered warm as `ensure --strict` is: a failure the fingerprint records
# (one backing off) exits 3 before anything starts, as the full path decides.
_RUN_ONLY = ("--strict",)


# What the warm path needs from the command line: --config's value, --json, --strict, how
# many -q, and --log-format's value (None: by whether stderr is a terminal).
Options = tuple[str | None, bool, bool, int, str | None]


def parse_args(argv: list[str]) -> Options | None:
    """The options of the plain ``ensure`` forms (see :data:`Options`); None for anything else.

    Only the forms the full parser (bootstrap.cli) reads the same way are answered here: before
    or after ``ensure``, ``--config PATH``, ``--config=PATH``, ``-q``, ``--quiet``,
    ``--log-format console|json``; after it, ``--json``, ``--strict`` and ``--lock-timeout
    SECONDS`` with a valid value. Anything else (``-v``, abbreviations, ``--lock-timeout abc``, a
    value that looks like an option, ``--retry``) goes the long way, so it gets the full
    parser's answer.
    """
    return _scan(argv, "ensure", _ENSURE_ONLY, ("--lock-timeout",))


def parse_run(argv: list[str]) -> tuple[Options, list[str]] | None:
    """The options (``--json`` never) and PYTHON-ARGS of the plain ``run [--strict] [--
    PYTHON-ARGS...]`` forms (the global options as :func:`parse_args` takes them); None for
    anything else."""
    cut = argv.index("--") if "--" in argv else len(argv)
    scanned = _scan(argv[:cut], "run", _RUN_ONLY, ())
    return None if scanned is None else (scanned, argv[cut + 1:])


def _scan(argv: list[str], command: str, flags: tuple[str, ...],
          valued: tuple[str, ...]) -> Options | None:
    """The options if ``argv`` is ``command`` with only those flags, the options in ``valued``
    (after it) and the global options; None for anything else."""
    values: dict[str, str | None] = {"--config": None, "--log-format": None}
    given: set[str] = set()
    quiet = 0
    seen_command = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == command and not seen_command:
            seen_command = True
        elif arg in _GLOBAL_VALUES or arg in valued:
            value = argv[i + 1] if i + 1 < len(argv) else ""
            if not _valid(arg, value, seen_command):
                return None
            values[arg] = value
            i += 1
        elif arg.startswith(("--config=", "--log-format=")):
            name, _, value = arg.partition("=")
            if not _valid(name, value, seen_command):
                return None
            values[name] = value
        elif arg in flags and seen_command:
            given.add(arg)
        elif arg in _GLOBAL_FLAGS:
            quiet += 2 if arg == "-qq" else 1
        else:
            return None
        i += 1
    if not seen_command:
        return None
    return (values["--config"], "--json" in given, "--strict" in given, quiet,
            values["--log-format"])


def _valid(option: str, value: str, after_command: bool) -> bool:
    if not value or value.startswith("-"):
        return False
    if option == "--log-format":
        return value in ("console", "json")
    if option == "--lock-timeout":
        return after_command and parse_seconds(value) is not None
    return True


def try_cli(argv: list[str], launch: Launch | None = None) -> int | None:
    """The whole warm ``kernel-bootstrap ensure`` (or ``run``, which execs the interpreter and
    never returns unless it must refuse); None to fall through to the full CLI. ``launch``: what
    ``run`` calls before its exec for an argv :func:`kernel_launch` accepts (the kernel server's
    hook, handed in by the CLI: those modules are a layer above this one)."""
    # An unknown log format in the environment is the full CLI's usage error (exit 2).
    if os.environ.get("KERNEL_BOOTSTRAP_PYTHON") \
            or os.environ.get(LOG_FORMAT_ENV, "") not in ("", "console", "json"):
        return None
    launched = parse_run(argv) if "run" in argv else None
    if launched is not None:
        return _try_exec(*launched, launch)
    parsed = parse_args(argv)
    if parsed is None:
        return None
    config, as_json, strict, quiet, log_format = parsed
    found = _found(config)
    if found is None:
        return None
    venv, python, failed, invalid, _, _, _ = found
    answered = _answer_failures(found, quiet, log_format)
    if answered is not None:
        return answered
    errors = [(f[0], f[3]) for f in failed] + invalid  # in the full path's order
    if as_json:
        import json

        print(json.dumps({"python": python, "venv": venv, "action": "ready", "installed": [],
                          "failed": [{"name": n, "error": e} for n, e in errors],
                          "removed": []}))
    else:
        print(python)
    return 3 if strict and errors else 0  # EXIT_SKILLS_FAILED, as the full path decides


def _found(config: str | None) -> Held | None:
    config_file = config_file_for(config)
    return holds(config_file) if config_file is not None else None


def _answer_failures(found: Held, quiet: int, log_format: str | None) -> int | None:
    """The full path's words for what ``found`` records; None: go on with the answer."""
    _, _, failed, invalid, refused, _, _ = found
    if not (failed or invalid or refused):
        return None
    from bootstrap import warm_failures

    as_json = (log_format or os.environ.get(LOG_FORMAT_ENV)) == "json"  # asked for, never by TTY
    return warm_failures.answer(failed, invalid, refused, quiet=quiet, as_json=as_json)


def _try_exec(options: Options, python_args: list[str], launch: Launch | None) -> int | None:
    """Become the interpreter (as ``process.replace`` does, with ``os`` alone) if the
    fingerprint holds, first offering a kernel launch to ``launch`` (see :func:`try_cli`); 3
    for ``--strict`` with a failed skill; None if it does not hold, if a rebuild backs off
    (the full path then starts the earlier runtime, with its warning), or if the exec fails
    (the full path says why)."""
    config, _, strict, quiet, log_format = options
    config_file = config_file_for(config)
    found = holds(config_file) if config_file is not None else None
    if config_file is None or found is None or found[4] is not None:
        return None
    _answer_failures(found, quiet, log_format)
    if strict and (found[2] or found[3]):
        from bootstrap import warm_failures

        # Nothing starts, as the full path decides.
        return warm_failures.refuse_strict([f[0] for f in found[2]] + [i[0] for i in found[3]])
    python = found[1]
    if launch is not None and kernel_launch(python_args):
        # May never return: the kernel server serves this kernel and we stay as its stand-in.
        launch(found[0], python, python_args, config_file, found[6])
    try:
        os.execv(python, [python, *python_args])
    except OSError:
        return None
    return None  # not reached: execv does not return


def kernel_launch(python_args: list[str]) -> bool:
    """Whether ``python_args`` may be an ipykernel launch (``-m ... -f FILE``), the only argv
    offered to a kernel server: ``run -- -c pass`` pays two list scans and imports nothing."""
    return "-m" in python_args and "-f" in python_args

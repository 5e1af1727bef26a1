"""The command line's grammar: every command, its options, and what is a usage error.

Built only when the warm path (bootstrap.warm) could not answer: argparse and the thirteen
parsers cost 10-30 ms. A command named plainly in argv is parsed by a parser of that command
alone; help and anything it refuses go to the full parser, whose words are the ones shown.
Global options may come before or after the subcommand, as uv's do. One module past the 400
lines we aim for: the grammar is one table, and split by command `-h`'s words would be too.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

DESCRIPTION = ("Keep a Jupyter kernel's venv and its agent skills ready: build it once, then "
               "start in milliseconds.")
EPILOG = """\
exit codes:
  0  ok
  1  failed: the environment could not be made ready, uv missing, lock timeout, push failed,
     verify found a changed, missing or extra file
  2  usage or config error, invalid skill; --locked: the skills lock does not match
  3  ensure --strict (run --strict): a skill failed; status: ready, but a skill failed
  130, 143, 129  stopped by ^C, SIGTERM, SIGHUP (children stopped, the lock released)
  run exits with its interpreter's exit code

environment:
  KERNEL_BOOTSTRAP_CONFIG    the config file when --config is not given
  KERNEL_BOOTSTRAP_VENV      overrides the config's `venv`
  KERNEL_BOOTSTRAP_PYTHON    use this interpreter as it is (no venv is managed)
  KERNEL_BOOTSTRAP_SNAPSHOTS overrides the config's `snapshots`
  KERNEL_BOOTSTRAP_UV        the uv executable (default: uv on PATH, else uv's bundled binary)
  KERNEL_BOOTSTRAP_BUILD_CACHE         where built skills are kept (default: the user cache dir)
  KERNEL_BOOTSTRAP_BATCH_BUILDS=0      let uv build every skill itself (no batching, no cache)
  KERNEL_BOOTSTRAP_SNAPSHOT_TIMEOUT    seconds a bucket may take to answer (default: 5)
  KERNEL_BOOTSTRAP_OFFLINE=1           never contact a package index (as UV_OFFLINE=1 does)
  KERNEL_BOOTSTRAP_NO_GENERATIONS=1    keep the venv a plain directory, swapped at each rebuild
  KERNEL_BOOTSTRAP_LOG_FORMAT=json     JSON log lines when --log-format is not given
  KERNEL_BOOTSTRAP_KERNEL_SERVER=0     no kernel server: every kernel starts the ordinary way
  NO_COLOR                   no colour on a terminal"""
# Global options may come before or after the subcommand (as uv's do). Each parser level keeps
# its own copy under its own name; _merge_globals adds the counts and lets the last value win.
_GLOBAL_VALUES = ("config", "log_format")
_GLOBAL_COUNTS = ("verbose", "quiet")
_DEPTHS = (0, 1, 2)


class UsageError(Exception):
    """Argv the CLI cannot run; its text is what the user is shown (exit 2)."""


def _parser_class() -> type[argparse.ArgumentParser]:
    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            # argparse exits 2 on its own; we keep the code but route the message through our
            # handler so it reads like every other usage error.
            raise UsageError(f"{self.prog}: {message}")

    return _Parser


def _globals(p: argparse.ArgumentParser, depth: int) -> None:
    prefix = f"g{depth}_" if depth else ""

    def default(value: object) -> object:
        return argparse.SUPPRESS if depth else value

    opts = p.add_argument_group("global options")
    opts.add_argument("--config", dest=prefix + "config", type=Path, metavar="PATH",
                      default=default(None),
                      help="the config file (default: $KERNEL_BOOTSTRAP_CONFIG, else "
                           "./kernel-bootstrap.toml, else [tool.kernel-bootstrap] in "
                           "./pyproject.toml)")
    opts.add_argument("-v", "--verbose", dest=prefix + "verbose", action="count",
                      default=default(0), help="say more: debug lines (default: info)")
    opts.add_argument("-q", "--quiet", dest=prefix + "quiet", action="count",
                      default=default(0), help="say less: -q warnings only, -qq errors only")
    opts.add_argument("--log-format", dest=prefix + "log_format", choices=("console", "json"),
                      default=default(None),
                      help="console or json (default: $KERNEL_BOOTSTRAP_LOG_FORMAT, else "
                           "console; colour and progress only on a terminal)")


def _positive(text: str) -> float:
    from bootstrap.warm import parse_seconds

    # One rule for both parsers: the warm path must accept exactly what this one does.
    value = parse_seconds(text)
    if value is None:
        try:
            float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def _jobs(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1: {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number: {text!r}")
    return int(text)


def _prefix(text: str) -> Path:
    # `--prefix "$CONDA_PREFIX"` with the variable unset used to write into the current directory.
    if not text:
        raise argparse.ArgumentTypeError("must not be empty (is $CONDA_PREFIX unset?)")
    return Path(text)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or with ``only`` the one command of that name (building all thirteen
    parsers costs 10-30 ms here, mostly argparse's gettext lookups); use :func:`parse_args` to
    read argv (it merges the global options)."""
    from bootstrap import __version__

    parser_class = _parser_class()
    parser = parser_class(prog="kernel-bootstrap", description=DESCRIPTION, epilog=EPILOG,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-V", "--version", action="version",
                        version=f"kernel-bootstrap {__version__}")
    _globals(parser, 0)
    sub = _subcommands(parser, "command", parser_class)
    for name, (about, add_arguments) in _COMMANDS.items():
        if only is None or name == only:
            add_arguments(_add(sub, name, about), parser_class)
    return parser


def _add(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, about: str,
         depth: int = 1) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=about, description=about)
    _globals(p, depth)
    return p


def _lock_timeout(p: argparse.ArgumentParser, default: float) -> None:
    p.add_argument("--lock-timeout", type=_positive, default=default, metavar="SECONDS",
                   help=f"how long to wait for another process's bootstrap (default: "
                        f"{default:g})")


def _json(p: argparse.ArgumentParser, help: str = "print one JSON object") -> None:
    p.add_argument("--json", action="store_true", help=help)


def _locked(p: argparse.ArgumentParser) -> None:
    p.add_argument("--locked", action="store_true",
                   help="exit 2, changing nothing, when the skills lock does not match the "
                        "configured git sources")


# -- the commands about the managed venv -------------------------------------------------------

def _ensure(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    _json(p, "print one JSON object, not the path")
    p.add_argument("--strict", action="store_true", help="exit 3 when any skill failed")
    p.add_argument("--retry", action="store_true",
                   help="retry every failed skill and a failed rebuild now, even while their "
                        "failures back off")
    _locked(p)
    _lock_timeout(p, 300.0)


def _run(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    p.usage = "%(prog)s [--config PATH] [--strict] [--locked] [-- PYTHON-ARGS...]"
    p.add_argument("--strict", action="store_true",
                   help="exit 3 instead of starting when any skill failed")
    _locked(p)
    p.epilog = ("Everything after -- goes to the interpreter, e.g. "
                "`kernel-bootstrap run -- -m ipykernel_launcher -f FILE`.")


def _serve(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    p.add_argument("--stop", action="store_true",
                   help="stop this config's kernel server instead (SIGTERM; its kernels run on "
                        "to their end); exit 0 whether one was running or not")
    _json(p, "with --stop: print one JSON object")
    p.epilog = ("Runs until SIGTERM, `kernel-idle-timeout` seconds without a request, or a "
                "rebuild (its generation is no longer current). Without it, the first kernel "
                "start runs a server in the background; `serve` takes over from that one, and "
                "waits for another `serve`. Off with `kernel-server = false` or "
                "KERNEL_BOOTSTRAP_KERNEL_SERVER=0; Linux only.")


def _status(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    _json(p)


def _repair(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    p.add_argument("--force", action="store_true", help="rebuild from scratch (staged)")
    _json(p)
    _lock_timeout(p, 300.0)


def _lock(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    p.add_argument("--upgrade", action="store_true", help="re-resolve even if nothing changed, "
                   "taking the newest versions allowed; git sources: every branch and tag "
                   "moves to its current commit")
    _json(p)


def _gc(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    p.add_argument("--root", dest="roots", action="append", type=Path, default=[],
                   metavar="ROOT", help="also clean the publish state of this skill root "
                                        "(repeatable)")
    p.add_argument("--grace", type=_positive, default=30.0, metavar="SECONDS",
                   help="leave leftovers younger than this alone (default: 30)")
    _lock_timeout(p, 10.0)
    _json(p)


def _verify(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    p.add_argument("--into", dest="roots", action="append", type=Path, default=[],
                   metavar="ROOT", help="also check the trees publish recorded in this skill "
                                        "root (repeatable)")
    _json(p)


def _init(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    p.add_argument("--force", action="store_true", help="overwrite an existing file")


# -- the commands that move skill trees --------------------------------------------------------

def _publish(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    _sources(p)
    p.add_argument("--into", type=Path, required=True, metavar="ROOT",
                   help="the skill root agents read (required)")
    p.add_argument("--grace", type=_positive, default=30.0, metavar="SECONDS",
                   help="how long a replaced tree stays for its readers (default: 30)")
    _prune(p, "ROOT")
    _json(p)


def _sources(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="*", type=Path, metavar="SRC",
                   help="a skill directory (none: the config's skills, git sources included)")


def _prune(p: argparse.ArgumentParser, where: str) -> None:
    p.add_argument("--prune", action="store_true",
                   help=f"then remove the skills this tool put into {where} earlier that are "
                        "not among SRC (others stay; default: off)")


def _push(p: argparse.ArgumentParser, _: type[argparse.ArgumentParser]) -> None:
    _sources(p)
    p.add_argument("--dest", required=True, metavar="DIR",
                   help="the skill root inside each runtime (required)")
    p.add_argument("--exec", dest="execs", action="append", default=[], metavar="PREFIX",
                   help='a runtime reached through this command, e.g. "docker exec -i CID" '
                        "(repeatable; default: DIR on this machine)")
    p.add_argument("--jobs", type=_jobs, default=8, metavar="N",
                   help="runtimes pushed at once (default: 8)")
    _prune(p, "DIR")
    _json(p)


# -- the kernelspec and snapshot families: a command with subcommands of its own ------------

def _subcommands(p: argparse.ArgumentParser, dest: str,
                 parser_class: type[argparse.ArgumentParser],
                 ) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    return p.add_subparsers(dest=dest, title="commands", metavar="COMMAND",
                            parser_class=parser_class)


def _kernelspec(p: argparse.ArgumentParser, parser_class: type[argparse.ArgumentParser]) -> None:
    ks = _subcommands(p, "kernelspec_command", parser_class)
    k = _add(ks, "install", "ensure, then write a kernelspec that starts the kernel through "
                            "`kernel-bootstrap run`", depth=2)
    k.add_argument("--name", default="kernel-bootstrap",
                   help="kernel name, its directory's name (default: kernel-bootstrap)")
    k.add_argument("--display-name", default=None,
                   help="the name Jupyter shows (default: derived from the name and Python)")
    where = k.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true",
                       help="the user's Jupyter data dir (the default)")
    where.add_argument("--prefix", type=_prefix, default=None,
                       help="PREFIX/share/jupyter/kernels, e.g. $CONDA_PREFIX (default: --user)")
    how = k.add_mutually_exclusive_group()
    how.add_argument("--direct", action="store_true",
                     help="start the venv's interpreter itself: no readiness check at kernel start")
    how.add_argument("--provisioner", action="store_true",
                     help="Jupyter gets kernels from the kernel server through kernel-bootstrap's "
                          "jupyter_client provisioner (installed in Jupyter's environment), "
                          "`kernel-bootstrap run` where it cannot")
    _json(k)


def _snapshot(p: argparse.ArgumentParser, parser_class: type[argparse.ArgumentParser]) -> None:
    snap = _subcommands(p, "snapshot_command", parser_class)
    _json(_add(snap, "list", "list the snapshots in the store", depth=2))
    s = _add(snap, "prune", "remove old snapshots: give --keep, --older-than or both", depth=2)
    s.add_argument("--keep", type=_count, default=None, metavar="N",
                   help="remove all but the newest N (default: none by count)")
    s.add_argument("--older-than", type=_positive, default=None, metavar="DAYS",
                   help="remove those older than DAYS (default: none by age)")
    _json(s)


# Every command in the order `-h` lists them: (its one-line description, its arguments).
_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser,
                                          type[argparse.ArgumentParser]], None]]] = {
    "ensure": ("make the environment ready; print the interpreter path", _ensure),
    "run": ("make the environment ready, then exec its interpreter with PYTHON-ARGS", _run),
    "serve": ("make the environment ready, then run its kernel server in the foreground "
              "(for a supervisor)", _serve),
    "status": ("say whether the environment is ready, and why not (read-only)", _status),
    "repair": ("verify the environment deeply and fix what is broken", _repair),
    "lock": ("pin the runtime's requirements with hashes in the lock file, and the git "
             "sources in the skills lock", _lock),
    "verify": ("check git skill trees, published trees and editables against their records "
               "(read-only)", _verify),
    "gc": ("remove leftovers, unused generations, old cache entries, stale kernel servers", _gc),
    "init": ("write a commented starter config (default: ./kernel-bootstrap.toml)", _init),
    "publish": ("install skill trees atomically into a skill root", _publish),
    "push": ("copy skill trees into runtimes as one tar stream", _push),
    "kernelspec": ("a Jupyter kernelspec for the managed interpreter", _kernelspec),
    "snapshot": ("the snapshot store of prebuilt environments", _snapshot),
}


_RUN_HINT = "; the interpreter's arguments go after `--`: `kernel-bootstrap run -- -c 'print(1)'`"
_FAMILIES = {"kernelspec": ("kernelspec_command", "install"),
             "snapshot": ("snapshot_command", "list, prune")}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """argv as the CLI reads it; raises UsageError (exit 2) for anything it cannot run.

    Parsed by a parser of the one command named, when argv names one plainly; anything that
    parser refuses, and every request for help, is parsed again by the full one, so messages
    and help are always the full parser's own.
    """
    argv, python_args = _split_python_args(argv)
    command = _command_named(argv)
    args: argparse.Namespace | None = None
    if command is not None:
        with contextlib.suppress(UsageError):
            args = _checked(build_parser(only=command), argv)
    args = args or _checked(build_parser(), argv, _RUN_HINT if command == "run" else "")
    if args.command == "run":
        args.python_args = python_args
    return args


def _split_python_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """For ``run``, what comes after the first ``--`` is the interpreter's, untouched (argparse
    would read options there, and drop a later ``--``); other commands get argv as it is."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        if _command_named(argv[:cut]) == "run":
            return argv[:cut], argv[cut + 1:]
    return argv, []


def _command_named(argv: Sequence[str]) -> str | None:
    """The command argv runs, read past the global options before it; None when unsure (or
    when help is asked for: only the full parser can give that)."""
    if any(t == "--help" or (t[:1] == "-" and t[1:2] != "-" and "h" in t) for t in argv):
        return None
    tokens = iter(argv)
    for token in tokens:
        if token in ("--config", "--log-format"):
            next(tokens, None)  # its value
        elif not token.startswith("-"):
            return token if token in _COMMANDS else None
    return None


def _checked(parser: argparse.ArgumentParser, argv: Sequence[str],
             hint: str = "") -> argparse.Namespace:
    try:
        args = parser.parse_args(list(argv))
    except UsageError as e:  # argparse's "unrecognized arguments: -c print(1)" says no more
        raise UsageError(f"{e}{hint}" if "unrecognized" in str(e) else str(e)) from None
    _merge_globals(args)
    if args.command is None:
        raise UsageError(parser.format_help().rstrip() + "\n\nerror: a command is required")
    family = _FAMILIES.get(args.command)
    if family is not None and getattr(args, family[0]) is None:
        raise UsageError(f"{args.command} needs a subcommand: {family[1]}")
    return args


def _merge_globals(args: argparse.Namespace) -> None:
    values = vars(args)
    for name in _GLOBAL_VALUES:
        for depth in _DEPTHS[1:]:
            if f"g{depth}_{name}" in values:
                values[name] = values.pop(f"g{depth}_{name}")
    for name in _GLOBAL_COUNTS:
        values[name] = sum(values.pop(f"g{d}_{name}", 0) or 0 for d in _DEPTHS[1:]) + values[name]

"""Command line: builds the parsers, dispatches, and decides exit codes in one place.

Each subcommand lives in ``bootstrap/commands/<name>.py`` and takes typed arguments. Modules
are imported only by the command that needs them: the warm ``ensure`` must cost about one
interpreter start.
"""

from __future__ import annotations

import sys

# Only sys at import time: the warm `ensure` is answered before argparse (~5 ms) is imported.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence


class _UsageError(Exception):
    pass


def _parser_class() -> type[argparse.ArgumentParser]:
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            # argparse exits 2 on its own; we keep the code but route the message through our
            # handler so it reads like every other usage error.
            raise _UsageError(f"{self.prog}: {message}")

    return _Parser


def _common(p: argparse.ArgumentParser, config: bool = True) -> None:
    from pathlib import Path

    if config:
        p.add_argument("--config", type=Path, metavar="PATH", help="the config file")
    p.add_argument("-v", "--verbose", action="count", default=0, help="say more (repeatable)")
    p.add_argument("-q", "--quiet", action="count", default=0, help="say less")
    p.add_argument("--log-format", choices=("console", "json"), default=None)


def _positive(text: str) -> float:
    import argparse

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
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1: {text!r}")
    return int(text)


def _count(text: str) -> int:
    import argparse

    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number: {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:

    from bootstrap import __version__

    parser_class = _parser_class()
    parser = parser_class(prog="kernel-bootstrap", description=(__doc__ or "").splitlines()[0])

    parser.add_argument("--version", action="version", version=f"kernel-bootstrap {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=parser_class)
    _environment_commands(sub)
    _tree_commands(sub, parser_class)
    return parser


def _environment_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands about the managed venv."""
    from pathlib import Path

    p = sub.add_parser("ensure", help="make the environment ready; print the interpreter path")
    _common(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--strict", action="store_true", help="exit 3 when any skill failed")
    p.add_argument("--lock-timeout", type=_positive, default=300.0, metavar="SECONDS")

    p = sub.add_parser("status", help="say whether the environment is ready, and why not")
    _common(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("repair", help="verify the environment deeply and fix what is broken")
    _common(p)
    p.add_argument("--force", action="store_true", help="rebuild from scratch (staged)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--lock-timeout", type=_positive, default=300.0, metavar="SECONDS")

    p = sub.add_parser("lock", help="pin the runtime's requirements with hashes in the lock file")
    _common(p)
    p.add_argument("--upgrade", action="store_true", help="re-resolve even if nothing changed, "
                   "taking the newest versions allowed")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("gc", help="remove leftovers of dead processes")
    _common(p)
    p.add_argument("--root", dest="roots", action="append", type=Path, default=[],
                   metavar="ROOT", help="also clean the publish state of this skill root")
    p.add_argument("--grace", type=_positive, default=30.0, metavar="SECONDS")
    p.add_argument("--lock-timeout", type=_positive, default=10.0, metavar="SECONDS")
    p.add_argument("--json", action="store_true")


def _tree_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                   parser_class: type[argparse.ArgumentParser]) -> None:
    """The commands that move skill trees, and the kernelspec and snapshot families."""
    from pathlib import Path

    p = sub.add_parser("publish", help="install skill trees atomically into a skill root")
    _common(p)
    p.add_argument("sources", nargs="+", type=Path, metavar="SRC")
    p.add_argument("--into", type=Path, required=True, metavar="ROOT")
    p.add_argument("--grace", type=_positive, default=30.0, metavar="SECONDS")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("push", help="copy skill trees into runtimes as one tar stream")
    _common(p)
    p.add_argument("sources", nargs="+", type=Path, metavar="SRC")
    p.add_argument("--dest", required=True, metavar="DIR")
    p.add_argument("--exec", dest="execs", action="append", default=[], metavar="PREFIX")
    p.add_argument("--jobs", type=_jobs, default=8, metavar="N")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("kernelspec", help="Jupyter kernelspec for the managed interpreter")
    ks = p.add_subparsers(dest="kernelspec_command", required=True, parser_class=parser_class)
    k = ks.add_parser("install", help="ensure, then write a kernelspec that runs the venv")
    _common(k)
    k.add_argument("--name", default="kernel-bootstrap", help="kernel name (directory name)")
    k.add_argument("--display-name", default=None)
    where = k.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="the user's Jupyter data dir")
    where.add_argument("--prefix", type=Path, default=None, help="PREFIX/share/jupyter/kernels")
    k.add_argument("--json", action="store_true")

    p = sub.add_parser("snapshot", help="the snapshot store of prebuilt environments")
    snap = p.add_subparsers(dest="snapshot_command", required=True, parser_class=parser_class)
    s = snap.add_parser("list", help="list the snapshots in the store")
    _common(s)
    s.add_argument("--json", action="store_true")
    s = snap.add_parser("prune", help="remove old snapshots")
    _common(s)
    s.add_argument("--keep", type=_count, default=None, metavar="N", help="keep the newest N")
    s.add_argument("--older-than", type=_positive, default=None, metavar="DAYS")
    s.add_argument("--json", action="store_true")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    from bootstrap.warm import try_cli

    warm_exit = try_cli(args_list)
    if warm_exit is not None:
        return warm_exit
    try:
        args = build_parser().parse_args(args_list)
    except _UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2  # EXIT_USAGE, spelled out to keep bootstrap.errors off the warm path
    _configure_logging(args)
    from bootstrap.errors import EXIT_FAILED, BootstrapError

    try:
        return _dispatch(args)
    except BootstrapError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        # An unexpected I/O failure (disk full, permission) is still the user's environment,
        # not our bug: one clear line, no traceback.
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED


def _configure_logging(args: argparse.Namespace) -> None:
    from bootstrap import log

    log.configure(verbosity=args.verbose - args.quiet, fmt=args.log_format)


def _dispatch(args: argparse.Namespace) -> int:
    cmd: str = args.command
    if cmd == "ensure":
        from bootstrap.commands.ensure import ensure

        return ensure(args.config, as_json=args.json, strict=args.strict,
                      lock_timeout=args.lock_timeout)
    if cmd == "status":
        from bootstrap.commands.status import status

        return status(args.config, as_json=args.json)
    if cmd == "repair":
        from bootstrap.commands.repair import repair

        return repair(args.config, force=args.force, as_json=args.json,
                      lock_timeout=args.lock_timeout)
    if cmd == "lock":
        from bootstrap.commands.lock import lock

        return lock(args.config, upgrade=args.upgrade, as_json=args.json)
    if cmd == "gc":
        from bootstrap.commands.gc import gc

        return gc(args.config, roots=args.roots, grace=args.grace, as_json=args.json,
                  lock_timeout=args.lock_timeout)
    if cmd == "publish":
        from bootstrap.commands.publish import publish

        return publish(args.sources, into=args.into, grace=args.grace, as_json=args.json)
    if cmd == "push":
        from bootstrap.commands.push import push

        return push(args.sources, dest=args.dest, execs=args.execs, jobs=args.jobs,
                    as_json=args.json)
    if cmd == "kernelspec":
        from bootstrap.commands.kernelspec import install

        return install(args.config, name=args.name, display_name=args.display_name,
                       user=args.user, prefix=args.prefix, as_json=args.json)
    if cmd == "snapshot":
        from bootstrap.commands import snapshot

        if args.snapshot_command == "list":
            return snapshot.list_(args.config, as_json=args.json)
        return snapshot.prune(args.config, keep=args.keep, older_than_days=args.older_than,
                              as_json=args.json)
    raise AssertionError(f"BUG: no handler for command {cmd!r}")

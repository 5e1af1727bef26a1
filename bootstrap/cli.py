"""Command line: dispatches, and decides exit codes in one place.

The grammar (every command, option and usage error) is bootstrap.arguments. Each subcommand
lives in ``bootstrap/commands/<name>.py`` and takes typed arguments. Modules are imported only
by the command that needs them: the warm ``ensure`` must cost about one interpreter start.
"""

from __future__ import annotations

import os
import sys

# Only os and sys (loaded by every interpreter's start) at import time: the warm `ensure` is
# answered before argparse (~5 ms) or even contextlib (~4 ms, with functools and collections)
# is imported.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import NoReturn


def run() -> NoReturn:
    """The console script (and ``python -m bootstrap``): :func:`main`, then exit at once.

    Tearing the interpreter down after a rebuild (every module's globals, filelock's exit
    hooks) cost ~45 ms, a quarter of our own time on that path. Nothing of ours needs it:
    locks, scratch trees and children are released by the code that took them before
    :func:`main` returns, so only the standard streams are left to flush.
    """
    code = main()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None: started with that descriptor closed
                stream.flush()
    except OSError:
        raise SystemExit(code) from None  # a closed pipe: let the interpreter report it
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    os._exit(code)


def lean_run(gate: list[str]) -> NoReturn:
    """The kernelspec's entry (``bootstrap.env.kernelspec.lean_argv``): an interpreter started
    ``-I -S`` (no site, no console-script wrapper: 16 ms of CPU here against 19) does the warm
    ``run`` of the gate argv ``gate`` (``[<kernel-bootstrap>, "run", "--config", F, "--",
    ...]``) as the console script would, its hand-off to the kernel server included. Whatever
    the warm path does not answer (a fingerprint that does not hold, a full check to run) execs
    ``gate`` itself: the full ``run``, which needs the site-packages this process has not."""
    offered = False

    def offer(venv: str, python: str, python_args: list[str], config_file: str,
              kernel_server: bool) -> None:
        nonlocal offered
        offered = True  # from here on a kernel may be forked: never a second request
        _offer_kernel(venv, python, python_args, config_file, kernel_server)

    code: int | None = None
    try:
        if "run" in gate:
            from bootstrap.warm import try_cli

            code = try_cli(gate[gate.index("run"):], offer)
    except Exception:
        if offered:
            raise
    if code is None:
        _exec_gate(gate)
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  # contextlib: an import this path does not pay
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def _exec_gate(gate: list[str]) -> NoReturn:
    try:
        os.execv(gate[0], gate)
    except (OSError, ValueError, IndexError) as e:
        os.write(2, f"kernel-bootstrap: error: cannot start {gate[:1]}: {e}\n".encode(
            errors="replace"))
        os._exit(127)  # what a shell reports for a command it could not start


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    from bootstrap.warm import try_cli

    warm_exit = try_cli(args_list, _offer_kernel)
    if warm_exit is not None:
        return warm_exit
    from bootstrap.arguments import UsageError, parse_args
    from bootstrap.primitives import log

    try:
        args = parse_args(args_list)
    except UsageError as e:
        text = str(e)
        # The help for a bare `kernel-bootstrap` is not an error message: only its last line is.
        head, sep, last = text.rpartition("\n\nerror: ")
        print(f"{head}\n\n{log.error_line(last)}" if sep else log.error_line(text),
              file=sys.stderr)
        return 2  # EXIT_USAGE, spelled out to keep bootstrap.errors off the warm path
    try:
        fmt = args.log_format or log.format_from_env()
    except ValueError as e:
        print(log.error_line(str(e)), file=sys.stderr)
        return 2
    log.configure(verbosity=args.verbose - args.quiet, fmt=fmt)
    from bootstrap.errors import EXIT_FAILED, BootstrapError
    from bootstrap.primitives.signals import Terminated, handle_termination

    handle_termination()
    try:
        return _run(args)
    except BootstrapError as e:
        print(log.error_line(str(e)), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    except OSError as e:
        # An unexpected I/O failure (disk full, permission) is still the user's environment,
        # not our bug: one clear line, no traceback.
        print(log.error_line(str(e)), file=sys.stderr)
        return EXIT_FAILED


def _offer_kernel(venv: str, python: str, python_args: list[str], config_file: str,
                  kernel_server: bool) -> None:
    """The warm ``run``'s hook for a kernel launch (the warm path may not import the kernel
    server's layer itself): ``bootstrap.commands.serve.offer``."""
    from bootstrap.commands.serve import offer

    offer(venv, python, python_args, config_file, kernel_server)


def _run(args: argparse.Namespace) -> int:
    try:
        return _dispatch(args)
    finally:
        progress = sys.modules.get("bootstrap.primitives.progress")
        if progress is not None:
            # A step cut short by an error or ^C: end its live line before the message.
            progress.stop()


def _dispatch(args: argparse.Namespace) -> int:
    # Split as the parsers are: the commands about the managed venv, then the rest.
    if args.command in ("ensure", "run", "serve", "status", "repair", "lock", "gc", "init",
                        "verify"):
        return _dispatch_environment(args)
    return _dispatch_trees(args)


def _dispatch_environment(args: argparse.Namespace) -> int:
    cmd: str = args.command
    if cmd == "ensure":
        from bootstrap.commands.ensure import ensure

        return ensure(args.config, as_json=args.json, strict=args.strict,
                      lock_timeout=args.lock_timeout, retry=args.retry, locked=args.locked)
    if cmd == "run":
        from bootstrap.commands.run import run

        return run(args.config, strict=args.strict, python_args=args.python_args,
                   locked=args.locked)
    if cmd == "serve":
        from bootstrap.commands.serve import serve

        return serve(args.config, stop=args.stop, as_json=args.json)
    if cmd == "status":
        from bootstrap.commands.status import status

        return status(args.config, as_json=args.json, verbose=args.verbose > 0)
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
    if cmd == "verify":
        from bootstrap.commands.verify import verify

        return verify(args.config, into=args.roots, as_json=args.json)
    if cmd == "init":
        from bootstrap.commands.init import init

        return init(args.config, force=args.force)
    raise AssertionError(f"BUG: no handler for command {cmd!r}")


def _dispatch_trees(args: argparse.Namespace) -> int:
    cmd: str = args.command
    if cmd == "publish":
        from bootstrap.commands.publish import publish

        return publish(args.sources, into=args.into, grace=args.grace, as_json=args.json,
                       prune=args.prune, config_path=args.config)
    if cmd == "push":
        from bootstrap.commands.push import push

        return push(args.sources, dest=args.dest, execs=args.execs, jobs=args.jobs,
                    as_json=args.json, prune=args.prune, config_path=args.config)
    if cmd == "kernelspec":
        from bootstrap.commands.kernelspec import install

        return install(args.config, name=args.name, display_name=args.display_name,
                       user=args.user, prefix=args.prefix, as_json=args.json,
                       direct=args.direct, provisioner=args.provisioner)
    if cmd == "snapshot":
        from bootstrap.commands import snapshot

        if args.snapshot_command == "list":
            return snapshot.list_(args.config, as_json=args.json)
        return snapshot.prune(args.config, keep=args.keep, older_than_days=args.older_than,
                              as_json=args.json)
    raise AssertionError(f"BUG: no handler for command {cmd!r}")

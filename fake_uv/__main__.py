"""`python -m fake_uv ARGS...`: log the call, then behave like the uv subset kernel-bootstrap uses.

Tests spawn this hundreds of times, so only os/sys/json/time are imported up front; each
command imports what it needs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

FAKE_VERSION = "uv 0.13.9 (fake)"
_USAGE = "Usage: uv [OPTIONS] <COMMAND>\n\nFor more information, try '--help'."
_HELP = f"""An extremely fast Python package manager (fake_uv: a simulator for tests).

{_USAGE.splitlines()[0]}

Commands:
  venv  Create a virtual environment
  pip   Manage Python packages with a pip-compatible interface (install, uninstall, list,
        freeze, show)
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    _log_invocation(args)
    from fake_uv.errors import UvExit

    try:
        return _dispatch(args)
    except UvExit as exc:
        if exc.message:
            sys.stderr.write(exc.message.rstrip("\n") + "\n")
        return exc.code


def _log_invocation(args: list[str]) -> None:
    """Append one JSON line to $FAKE_UV_LOG before doing anything else.

    One os.write on an O_APPEND descriptor: concurrent calls never interleave their lines, and a
    call that later hangs or is SIGKILLed has already been counted.
    """
    log_line({"argv": args, "pid": os.getpid(), "time": time.time()})


def log_line(entry: dict[str, object]) -> None:
    """Append ``entry`` as one JSON line to $FAKE_UV_LOG (see _log_invocation)."""
    log = os.environ.get("FAKE_UV_LOG")
    if not log:
        return
    line = json.dumps(entry) + "\n"
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)
    except OSError as exc:
        # Not fatal (uv itself would run), but a silently missing line makes call counts lie.
        sys.stderr.write(f"warning: fake_uv could not append to FAKE_UV_LOG={log}: {exc}\n")


def _dispatch(args: list[str]) -> int:
    from fake_uv import cli
    from fake_uv.errors import UvExit

    command, rest = cli.split_command(args)
    if command is None:
        top = cli.spec("uv [OPTIONS] <COMMAND>", flags={"--version", "--help"},
                       aliases={"-V": "--version", "-h": "--help"})
        opts = cli.parse(args, top)
        if opts.flag("--version") or opts.flag("--help"):
            print(FAKE_VERSION if opts.flag("--version") else _HELP)
            return 0
        raise UvExit(2, f"error: 'uv' requires a subcommand but one was not provided\n\n{_USAGE}")
    if command == "venv":
        from fake_uv.venvs import create

        return create(rest)
    if command == "python":
        sub, rest2 = cli.split_command(rest)
        if sub == "find":
            from fake_uv.venvs import find

            return find(rest2)
        raise UvExit(2, f"error: unrecognized subcommand '{sub}'\n\n{_USAGE}")
    if command == "pip":
        from fake_uv.pip import main as pip_main

        return pip_main(rest)
    raise UvExit(2, f"error: unrecognized subcommand '{command}'\n\n{_USAGE}")


if __name__ == "__main__":
    raise SystemExit(main())

"""``kernel-bootstrap serve``'s server: the command line of a venv's kernel server, and the exec
into it.

The server runs in the venv's interpreter (it imports the venv's ipykernel, and its kernels are
the venv's), started as ``<venv>/bin/python`` so that the generation pin pins it to the
generation that is current, like any process of the venv (docs/architecture.md, "Which
generation a process uses"). This process (the tool's interpreter) only builds that command and
execs it, so a supervisor's SIGTERM reaches the server itself.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import TYPE_CHECKING

from bootstrap.errors import BootstrapError, ConfigError
from bootstrap.kernels import places

if TYPE_CHECKING:
    from bootstrap.config import Config


def command(config: Config, *, detached: bool, after: int | None = None) -> list[str] | None:
    """The server's argv for ``config``'s venv; None when the venv's path is too long for a
    server directory. ``after``: a pid whose start the server's preload must not slow down."""
    from bootstrap.kernels.template import BOOT

    directory = places.server_dir(str(config.venv))
    if directory is None:
        return None
    settings = {"dir": directory, "venv": str(config.venv), "preload": list(config.kernel_preload),
                "idle": config.kernel_idle_timeout, "detached": detached, "after": after,
                "preload_timeout": config.kernel_preload_timeout, "spares": config.kernel_spares}
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    python = str(config.venv / "bin" / "python")
    return [python, "-c", BOOT, "serve", package, "--config", str(config.path or ""),
            json.dumps(settings)]


def serve(config: Config, *, detached: bool) -> int:
    """Become the venv's kernel server (exec); it exits 0 on its idle timeout, when what it
    serves is no longer current, or on SIGTERM."""
    argv = command(config, detached=detached)
    if argv is None:
        raise ConfigError(f"no kernel server: the venv's path is too long ({config.venv})")
    try:
        exec_neutral(argv)
    except OSError as e:
        raise BootstrapError(f"cannot start the kernel server ({argv[0]}): {e.strerror}") from e
    return 1  # not reached


def exec_neutral(argv: list[str]) -> None:
    """Exec the server with nothing of its launcher's but descriptors 0-2 and the context the
    launcher put it in: the first launcher's non-CLOEXEC descriptors (a pipe whose reader would
    never see EOF, an flock that would stay held) are closed, and it works in "/" (``BOOT``
    drops the directory from ``sys.path`` too). OSError when the exec fails."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor: closed already
                os.close(int(name))
    os.chdir("/")
    os.execv(argv[0], argv)

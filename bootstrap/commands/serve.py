"""``kernel-bootstrap serve [--config PATH]``: the venv's kernel server in the foreground, and
:func:`offer`, the hook through which ``run`` hands it an ipykernel launch.

Without a supervisor, the first kernel start that finds no server spawns a detached one itself
(``bootstrap.kernels.spawn``); ``serve`` is for a supervisor (systemd, a container's init, a
sidecar) that wants to own the process. Either serves the generation that is current when it
starts, so ``serve`` makes the environment ready first, as ``run`` does.

:func:`offer` runs on every warm kernel launch, right before the exec: this module imports, at
its top, only what the warm path has loaded already. The server's own modules are imported
only for an argv that may be a kernel launch (``run -- -c pass`` pays nothing).
"""

from __future__ import annotations

import os
import sys

from bootstrap.warm import kernel_launch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

    from bootstrap.config import Config


def serve(config_path: Path | None) -> int:
    """Make the environment ready, then serve kernels until the server stops (idle timeout,
    a generation that is no longer current, SIGTERM); exit 2 when the kernel server is off."""
    from bootstrap.config import load_config
    from bootstrap.engine.ensure import ensure

    config = load_config(config_path)
    refuse_when_off(config)
    ensure(config)
    from bootstrap.kernels import server

    return server.serve(config, detached=False)


def refuse_when_off(config: Config) -> None:
    """A :class:`~bootstrap.errors.ConfigError` (exit 2) saying what turned the kernel server
    off, when something did: the environment variable, the config, or the platform; or that
    ``KERNEL_BOOTSTRAP_PYTHON`` leaves no venv to serve."""
    from bootstrap.config import KERNEL_SERVER_ENV
    from bootstrap.config_file import source_name
    from bootstrap.errors import ConfigError
    from bootstrap.kernels import switch as serving

    if config.override_python is not None:
        raise ConfigError("no kernel server: KERNEL_BOOTSTRAP_PYTHON is set, so no venv is "
                          "managed (kernels start as that interpreter, the ordinary way)")
    if serving.enabled(config.kernel_server):
        return
    switch = os.environ.get(KERNEL_SERVER_ENV, "")
    if switch == "0":
        why = f"{KERNEL_SERVER_ENV}=0 turns it off"
    elif not config.kernel_server and switch != "1" and config.path is not None:
        why = f"`kernel-server = false` in {source_name(config.path)} turns it off"
    else:
        why = f"it runs on Linux only (this is {sys.platform})"
    raise ConfigError(f"no kernel server: {why}")


def offer(venv: str, python: str, python_args: list[str], config_file: str,
          kernel_server: bool) -> None:
    """Offer ``python_args`` to the venv's kernel server when serving is on: for an ipykernel
    launch that a server of the current generation takes, this process becomes the kernel's
    stand-in and never returns (``bootstrap.kernels.client.launch``); otherwise it returns
    (having spawned a server when none runs) and the caller execs as before.
    ``kernel_server``: the config's key."""
    if not kernel_launch(python_args):
        return
    from bootstrap.kernels import switch as serving

    if not serving.enabled(kernel_server):
        return  # turned off: the client is not even imported
    from bootstrap.kernels import client

    client.launch(venv, python, python_args, config_file)

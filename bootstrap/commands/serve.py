"""``kernel-bootstrap serve [--config PATH] [--stop [--json]]``: the venv's kernel server in the
foreground (or stopped), and :func:`offer`, the hook through which ``run`` hands it an ipykernel
launch.

Without a supervisor, the first kernel start that finds no server spawns a detached one itself
(``bootstrap.kernels.spawn``); ``serve`` is for a supervisor (systemd, a container's init, a
sidecar) that wants to own the process: it takes over from a detached server and waits for
another ``serve`` (``bootstrap.kernels.handover``), never exiting at once, which a
``Restart=always`` unit would turn into a restart storm. Either serves the generation that is
current when it starts, so ``serve`` makes the environment ready first, as ``run`` does.

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


def serve(config_path: Path | None, *, stop: bool = False, as_json: bool = False) -> int:
    """Make the environment ready, then serve kernels until the server stops (idle timeout,
    a generation that is no longer current, SIGTERM); exit 2 when the kernel server is off.
    ``stop``: stop the server that runs instead (:func:`stop_server`)."""
    from bootstrap.config import load_config
    from bootstrap.engine.ensure import ensure

    config = load_config(config_path)
    if stop:
        return stop_server(config, as_json=as_json)
    refuse_when_off(config)
    ensure(config)
    from bootstrap.kernels import server

    return server.serve(config, detached=False)


STOP_WAIT = 10.0  # for the server to stop answering: a retiring one does so at once


def stop_server(config: Config, *, as_json: bool) -> int:
    """SIGTERM to the venv's kernel server, by the pid its own info answer gives (never one
    read from a file), then wait until it no longer answers: it has let go of the venv's lock,
    and stays only until its running kernels end. Exit 0 whether one was running or not;
    whatever turned serving off, a server still running is stopped."""
    import json
    import signal
    import time

    from bootstrap.kernels import info

    answer = info.describe(config.venv)
    pid: int | None = None if answer is None else answer["pid"]
    if pid is not None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pid = None  # it ended since it answered
    deadline = time.monotonic() + STOP_WAIT
    while pid is not None and _answers(config, pid):
        if time.monotonic() > deadline:
            from bootstrap.errors import BootstrapError

            raise BootstrapError(f"the kernel server (pid {pid}) still serves "
                                 f"{STOP_WAIT:g} s after SIGTERM")
        time.sleep(0.05)
    kernels = [] if answer is None or pid is None else answer.get("kernels", [])
    if as_json:
        print(json.dumps({"stopped": pid is not None, "pid": pid, "kernels": kernels}))
    elif pid is None:
        print("no kernel server was running")
    else:
        running = (f"; it ends once its {len(kernels)} running kernel(s) have ended"
                   if kernels else "")
        print(f"stopped the kernel server (pid {pid}){running}")
    return 0


def _answers(config: Config, pid: int) -> bool:
    from bootstrap.kernels import info

    answer = info.describe(config.venv)
    return answer is not None and answer["pid"] == pid


def refuse_when_off(config: Config) -> None:
    """A :class:`~bootstrap.errors.ConfigError` (exit 2) saying what turned the kernel server
    off, when something did: the environment variable, the config, or the platform; or that
    ``KERNEL_BOOTSTRAP_PYTHON`` leaves no venv to serve."""
    from bootstrap.config_file import source_name
    from bootstrap.config_kernel import KERNEL_SERVER_ENV
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

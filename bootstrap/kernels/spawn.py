"""Starting a venv's kernel server in the background, from the first kernel start that found
none.

That start must not get slower (issue 29), so it waits for nothing: it ``posix_spawn``\\s this
module's :func:`main` in a new session with its stdio on /dev/null and goes on to start its own
kernel the ordinary way. :func:`main` reads the config (the warm path does not: it holds no
``kernel-preload``) and execs the server (:mod:`bootstrap.kernels.server`), whose preload does
not compete with that first kernel for the CPU until it settled (CoCalc #7139: a refill that
competes with the kernel being started doubled first starts): meanwhile, only with a core
idle, it imports in a thread of the lowest priority (:mod:`bootstrap.kernels.preload`). A lower
priority for the whole server process would not do: it could not be raised again, and kernels
inherit it.
"""

from __future__ import annotations

import os
import sys

_INITIAL_PID_NAMESPACE = 0xEFFFFFFC  # PROC_PID_INIT_INO: the inode of the initial namespace


def start(config_file: str, *, after: int) -> None:
    """Spawn the server of ``config_file``'s venv, detached; errors are the server's to log.

    Through ``sh -c '"$@" &'``, waited for (a millisecond): the caller execs the kernel next,
    and a server that were its child would stay its zombie once it exited; the shell's
    background child is reparented to init instead: none is spawned where no init would reap
    it (:func:`reaped`)."""
    if not reaped():
        return
    argv = ["sh", "-c", '"$@" &', "sh",
            sys.executable, "-P", "-m", "bootstrap.kernels.spawn", config_file, str(after)]
    actions = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
    try:
        pid = os.posix_spawn("/bin/sh", argv, os.environ, file_actions=actions, setsid=True)
        os.waitpid(pid, 0)
    except OSError:
        pass  # the ordinary start goes on; the next one tries again


def reaped() -> bool:
    """Whether a server we detach would be reaped when it exits: always in the initial PID
    namespace (its init is the host's business); in another one only when its PID 1 handles
    SIGCHLD (caught, ignored or blocked for a signalfd: tini, systemd, a shell). A launcher that
    is PID 1 of a namespace (``unshare --pid --fork jupyter ...``, a container without an init)
    reaps only its own children, so a server it inherited would stay its zombie."""
    try:
        if os.stat("/proc/self/ns/pid").st_ino == _INITIAL_PID_NAMESPACE:
            return True
        if os.getpid() == 1 or os.readlink("/proc/self") != str(os.getpid()):
            return False  # we are that PID 1, or /proc shows another namespace's PID 1
        with open("/proc/1/status", "rb") as f:
            status = f.read()
    except OSError:
        return False
    handled = 0
    for line in status.splitlines():
        if line.startswith((b"SigBlk:", b"SigIgn:", b"SigCgt:")):
            handled |= int(line.split()[1], 16)
    return bool(handled & 1 << (17 - 1))  # SIGCHLD, 17 on Linux


def main(argv: list[str]) -> int:
    """Read the config and exec its venv's server (detached); 1 when it cannot be served."""
    from pathlib import Path

    from bootstrap.config import load_config
    from bootstrap.errors import BootstrapError
    from bootstrap.kernels import server, switch

    try:
        config = load_config(Path(argv[0]))
        if not switch.enabled(config.kernel_server) or config.override_python is not None:
            return 1
        command = server.command(config, detached=True, after=int(argv[1]))
    except (BootstrapError, ValueError, IndexError):
        return 1
    if command is None:
        return 1
    try:
        server.exec_neutral(command)
    except OSError:
        return 1
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

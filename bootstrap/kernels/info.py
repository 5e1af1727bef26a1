"""What ``status`` and ``gc`` ask of kernel servers: :func:`describe` (the live server of a
venv, asked over its socket) and :func:`stop_stale` (SIGTERM to servers of generations that are
gone or no longer current; the directories of dead servers removed)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
from pathlib import Path
from typing import Any

from bootstrap.kernels import places, protocol

TIMEOUT = 1.0


def describe(venv: Path) -> dict[str, Any] | None:
    """``{"pid", "generation", "started", "kernels_started", "spares", "kernels", "detached",
    "serving", "not_serving", "spare_pids"}`` of the venv's live server (the last five absent
    when a server of an earlier version answers); None when none answers within a second."""
    directory = places.server_dir(str(venv))
    return None if directory is None else _ask(directory)


def _ask(directory: str) -> dict[str, Any] | None:
    try:
        dirfd = places.open_dir(directory, create=False)
    except OSError:
        return None
    try:
        return query(dirfd)
    finally:
        os.close(dirfd)


def query(dirfd: int) -> dict[str, Any] | None:
    """The info answer of the server whose directory is ``dirfd``; None without one."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect(places.connect_path(dirfd))
            sock.sendall(protocol.encode({"kind": "info"}))
            data = b""
            while not data.endswith(b"\n") and len(data) < 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    message = protocol.decode(data)
    return None if message is None else _checked(message)


# Fields of the info answer a server of an earlier version did not send (issue 35): checked
# when present, left out when absent.
_LATER: dict[str, tuple[type, ...]] = {"kernels": (list,), "detached": (bool,),
                                       "serving": (bool,), "not_serving": (str, type(None)),
                                       "spare_pids": (list,)}


def _checked(message: dict[str, object]) -> dict[str, Any] | None:
    """The info answer's fields, each of its type (a pid to signal must be one); else None."""
    types: dict[str, tuple[type, ...]] = {"pid": (int,), "generation": (str,),
                                          "started": (int, float), "kernels_started": (int,),
                                          "spares": (int,)}
    fields = {k: message.get(k) for k in types}
    for key, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, types[key]):
            return None
    for key, kinds in _LATER.items():
        if key in message:
            if not isinstance(message[key], kinds):
                return None
            fields[key] = message[key]
    for key in ("kernels", "spare_pids"):
        pids = fields.get(key, [])
        if not (isinstance(pids, list) and all(_is_pid(k) for k in pids)):
            return None
    return fields if _is_pid(fields["pid"]) else None


def _is_pid(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def stop_stale() -> list[dict[str, Any]]:
    """SIGTERM every server whose generation is gone or not its venv's current one; returns
    ``[{"pid", "generation", "venv"}]`` of those; removes the directories of dead servers.

    Through the checked ``kernels/`` directory's descriptor (:mod:`places`): an entry that is a
    symlink, or a directory that is not a server directory of ours, is left alone (``gc`` once
    deleted a victim's ``lock`` and ``log`` through a planted link)."""
    from bootstrap.warm import cache_dir

    try:
        kernels = places.open_kernels(cache_dir(), create=False)
    except places.Untrusted as e:
        from bootstrap.places import UntrustedPlace, refusal
        from bootstrap.primitives import log

        log.warning("gc leaves the kernel servers alone: "
                    + refusal(UntrustedPlace(e.errno, e.strerror, e.filename)))
        return []
    except OSError:
        return []
    try:
        found = [_stop_if_stale(kernels, name) for name in _server_names(kernels)]
    finally:
        os.close(kernels)
    return [s for s in found if s is not None]


def _server_names(kernels: int) -> list[str]:
    """The entries of ``kernels/`` that are directories themselves (never a symlink's target)."""
    try:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=kernels)
    except OSError:
        return []
    try:
        with os.scandir(fd) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    finally:
        os.close(fd)


def _stop_if_stale(kernels: int, name: str) -> dict[str, Any] | None:
    """SIGTERM to the server in ``kernels/name`` if it is stale (what was stopped), or the
    directory removed when no server holds it."""
    try:
        dirfd = places.open_server(kernels, name)
    except OSError:
        return None  # gone, or not a server directory of ours: not ours to touch
    try:
        if not places.server_running(places.LOCK, dir_fd=dirfd):
            _remove(kernels, name, dirfd)
            return None
        answer = query(dirfd)
    finally:
        os.close(dirfd)
    if answer is None:
        return None  # starting up, or busy: it checks its generation itself
    venv = name.replace("%2F", "/").replace("%25", "%")
    generation = answer["generation"]
    if os.path.isdir(generation) and os.path.realpath(venv) == generation:
        return None
    try:
        os.kill(answer["pid"], signal.SIGTERM)
    except OSError:
        return None
    return {"pid": answer["pid"], "generation": generation, "venv": venv}


# What a dead server leaves, removed by name in its directory (unlinkat: never followed, never
# opened). A FIFO too: in a directory that is ours and 0700 only this user can have put it, and
# left there it would refuse every later server its lock, so the venv would never be served
# again; removing its name cannot block (a FIFO's open would).
_LEFT = (stat.S_IFREG, stat.S_IFSOCK, stat.S_IFIFO)


def _remove(kernels: int, name: str, dirfd: int) -> None:
    """A dead server's directory ``kernels/name`` (``dirfd``): its socket, lock and log when
    each is one of ours (a symlink or a device stays, and so does the directory). Another server
    starting at this instant makes it again."""
    for entry in (places.SOCK, places.LOCK, places.LOG):
        if places.ours(dirfd, entry, _LEFT):
            with contextlib.suppress(OSError):
                os.unlink(entry, dir_fd=dirfd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=kernels)

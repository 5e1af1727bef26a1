"""What ``status`` and ``gc`` ask of kernel servers: :func:`describe` (the live server of a
venv, asked over its socket) and :func:`stop_stale` (SIGTERM to servers of generations that are
gone or no longer current; the directories of dead servers removed)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path
from typing import Any

from bootstrap.kernels import places, protocol

TIMEOUT = 1.0


def describe(venv: Path) -> dict[str, Any] | None:
    """``{"pid", "generation", "started", "kernels_started", "spares"}`` of the venv's live
    server; None when none answers within a second."""
    directory = places.server_dir(str(venv))
    return None if directory is None else _ask(directory)


def _ask(directory: str) -> dict[str, Any] | None:
    try:
        dirfd = places.open_dir(directory, create=False)
    except OSError:
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect(places.sock_path(dirfd))
            sock.sendall(protocol.encode({"kind": "info"}))
            data = b""
            while not data.endswith(b"\n") and len(data) < 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    finally:
        os.close(dirfd)
    message = protocol.decode(data)
    return None if message is None else _checked(message)


def _checked(message: dict[str, object]) -> dict[str, Any] | None:
    """The info answer's fields, each of its type (a pid to signal must be one); else None."""
    types: dict[str, tuple[type, ...]] = {"pid": (int,), "generation": (str,),
                                          "started": (int, float), "kernels_started": (int,),
                                          "spares": (int,)}
    fields = {k: message.get(k) for k in types}
    for key, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, types[key]):
            return None
    pid = fields["pid"]
    return fields if isinstance(pid, int) and pid > 0 else None


def stop_stale() -> list[dict[str, Any]]:
    """SIGTERM every server whose generation is gone or not its venv's current one; returns
    ``[{"pid", "generation", "venv"}]`` of those; removes the directories of dead servers."""
    from bootstrap.warm import cache_dir

    root = os.path.join(cache_dir(), "kernels")
    try:
        names = os.listdir(root)
    except OSError:
        return []
    stopped = []
    for name in names:
        directory = os.path.join(root, name)
        venv = name.replace("%2F", "/").replace("%25", "%")
        if not places.server_running(os.path.join(directory, places.LOCK)):
            _remove(directory)
            continue
        answer = _ask(directory)
        if answer is None:
            continue  # starting up, or busy: it checks its generation itself
        generation = answer["generation"]
        if not os.path.isdir(generation) or os.path.realpath(venv) != generation:
            with contextlib.suppress(OSError):
                os.kill(answer["pid"], signal.SIGTERM)
                stopped.append({"pid": answer["pid"], "generation": generation, "venv": venv})
    return stopped


def _remove(directory: str) -> None:
    """A dead server's directory (its socket, lock and log). Another server starting at this
    instant makes it again."""
    for name in (places.SOCK, places.LOCK, places.LOG):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))
    with contextlib.suppress(OSError):
        os.rmdir(directory)

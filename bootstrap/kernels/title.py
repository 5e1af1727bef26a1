"""What ``ps`` shows for a kernel server and for the kernels it forks (issue 35, item 9).

A forked kernel keeps its server's command line, and the server's is ``python -c "import sys;
m = ..."``: ``pgrep -f ipykernel_launcher`` found only stand-ins, and a ``pkill`` aimed at the
server killed every kernel. :func:`set_title` rewrites the process's argument area, as
setproctitle does, through ``/proc/self/mem`` at ``arg_start`` (``/proc/self/stat`` fields 48
and 49 bound it): the arguments NUL-separated, as exec lays them out, the rest of the area
NUL-padded (``/proc/PID/cmdline`` then ends in those NULs; ``ps``, ``pgrep -f`` and ``pkill -f``
ignore them). The area cannot grow (moving ``arg_end`` takes ``CAP_SYS_RESOURCE``): a title
longer than the argv the process was started with is cut at the area's end.

Standard library only: it runs in the server, in the venv's interpreter.
"""

from __future__ import annotations

import os

# /proc/PID/stat's fields, numbered from 1 as proc(5) does; the first after "pid (comm) " is 3.
_ARG_START, _ARG_END = 48, 49


def set_title(argv: list[str]) -> bool:
    """Make ``argv`` this process's command line, as far as its argument area holds it; False
    when it cannot be written (no /proc, a kernel that refuses writes to /proc/self/mem)."""
    area = _argument_area()
    if area is None:
        return False
    start, end = area
    size = end - start
    if size <= 0:
        return False
    title = b"".join(os.fsencode(a) + b"\0" for a in argv)
    # Cut to the area, always ending in a NUL: a non-NUL last byte would switch the kernel to
    # reading the title as one string (setproctitle's convention), hiding the arguments.
    title = title[:size - 1] + b"\0" if len(title) > size else title
    try:
        fd = os.open("/proc/self/mem", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.pwrite(fd, title.ljust(size, b"\0"), start) == size
    except OSError:
        return False
    finally:
        os.close(fd)


def _argument_area() -> tuple[int, int] | None:
    """``(arg_start, arg_end)`` of this process; None when /proc does not say."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[_ARG_START - 3]), int(fields[_ARG_END - 3])
    except (OSError, IndexError, ValueError):
        return None

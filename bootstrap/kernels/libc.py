"""The few C library calls the kernel server family needs and Python does not offer: ``prctl``
and the raw ``syscall`` (``ioprio_get``/``ioprio_set`` have no libc wrapper).

Through ``_ctypes`` alone: the stand-in asks ``PR_GET_SECUREBITS`` on the warm path, where
``import ctypes`` (about 4 ms measured here, most of it ``ctypes/__init__``'s type tables) would
cost more than the rest of the hand-off; ``_ctypes`` costs about 0.5 ms. Linux only, like the
server. Each call returns the C result and raises nothing: -1 means failure, as in C.
"""

from __future__ import annotations

import _ctypes
import os

PR_SET_TIMERSLACK = 29
PR_GET_SECUREBITS = 27

# ioprio_get / ioprio_set by machine; elsewhere the I/O priority is neither read nor applied
# (docs/architecture.md, "The kernel server": what a served kernel cannot match).
_IOPRIO = {"x86_64": (252, 251), "aarch64": (31, 30), "i686": (290, 289)}
IOPRIO_WHO_PROCESS = 1


class _Long(_ctypes._SimpleCData):  # type: ignore[type-arg]  # ctypes.c_long, without ctypes
    _type_ = "l"


class _Function(_ctypes.CFuncPtr):
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Long


class _Library:
    _handle = _ctypes.dlopen(None)  # type: ignore[arg-type]  # None: the program and libc


def _call(name: str, *args: int) -> int:
    try:
        function = _Function((name, _Library()))  # type: ignore[arg-type]  # a CDLL stand-in
        return int(function(*(_Long(a) for a in args)))
    except (AttributeError, OSError, TypeError, ValueError):
        return -1


def prctl(option: int, arg: int = 0) -> int:
    return _call("prctl", option, arg, 0, 0, 0)


def ioprio_get(pid: int) -> int | None:
    """The I/O priority of ``pid`` (0 for ourselves); None where it cannot be read."""
    numbers = _IOPRIO.get(os.uname().machine)
    if numbers is None:
        return None
    value = _call("syscall", numbers[0], IOPRIO_WHO_PROCESS, pid)
    return None if value < 0 else value


def ioprio_set(value: int) -> bool:
    """Set our own I/O priority; whether it worked."""
    numbers = _IOPRIO.get(os.uname().machine)
    return numbers is not None and _call("syscall", numbers[1], IOPRIO_WHO_PROCESS, 0, value) == 0

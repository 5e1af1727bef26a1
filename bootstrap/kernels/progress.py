"""How far a starting kernel server is, so that a kernel start that finds it not listening yet
waits for it only while that is faster than starting the ordinary way (issue 36).

The server writes ``progress`` in its directory (:func:`places.write_record`) as its preload
goes: its ``pid``; the ``phase`` (``kernel``: a kernel's own imports; ``extra``:
``kernel-preload``'s; ``ready``: imports done, listening within milliseconds); its CPU seconds
when the preload began (``cpu0``); when ``kernel-preload``'s imports began (``xbegan``); and what
the last preload of the venv took, the previous server's while this one has not measured its
own: a kernel's imports in CPU seconds (``kcpu``), ``kernel-preload``'s in wall seconds
(``xwall``), for which list of modules (``extras``).

Why CPU seconds for a kernel's imports: a loaded machine stretches the server's preload and an
ordinary start alike, while the work left is what it is. A start waits while the work left is
less than :data:`WORTH` of a whole preload's (an ordinary start does all of those imports, and
``IPKernelApp.initialize()`` on top, which pays for the served start's own), and the server
gets at least :data:`MIN_RATE` of a CPU (measured every :data:`RATE_WINDOW`): not while its
imports still yield to the first start (:mod:`preload`), and not when it stopped. Wall seconds
for ``kernel-preload``: what its modules wait for (a network, a sleep) is no CPU; without a
measure of the same list the start does not wait.

On the client's side, imported only by a start that found the server's lock held and no
socket: ``os``, ``time`` and ``places``, no more.
"""

from __future__ import annotations

import os
import time

from bootstrap.kernels import places

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

WORTH = 0.9  # wait only while what is left is under 9/10 of a whole preload's work
MIN_RATE = 0.3  # nor while the server gets less than this share of a CPU
DEFAULT_KCPU = 0.5  # a kernel's imports, CPU s (ipykernel 7, bytecode compiled: 0.35 here)
POLL = 0.01  # between connects
RATE_WINDOW = 0.1  # over which the server's share of a CPU is measured
MAX_WAIT = 30.0  # a bound whatever the records say
READY_WAIT = 2.0  # from imports done to listening takes milliseconds


def cpu_seconds(pid: int | str = "self") -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class Progress:
    """The server's side: the record, phase by phase."""

    def __init__(self, dirfd: int, extras: list[str]) -> None:
        last = places.read_record(places.PROGRESS, dirfd)
        self.dirfd, self.extras = dirfd, ",".join(extras) or "-"
        self.kcpu = _number(last.get("kcpu")) or DEFAULT_KCPU
        self.xwall = 0.0 if not extras else (
            _number(last.get("xwall")) if last.get("extras") == self.extras else None)
        self.cpu0 = cpu_seconds() or 0.0
        self.xbegan = 0.0
        self._write("kernel")

    def kernel_done(self) -> None:
        self.kcpu = max(0.01, (cpu_seconds() or 0.0) - self.cpu0)
        self.xbegan = time.time()
        self._write("extra")

    def done(self) -> None:
        if self.extras != "-":
            self.xwall = time.time() - self.xbegan
        self._write("ready")

    def _write(self, phase: str) -> None:
        xwall = "-" if self.xwall is None else f"{self.xwall:.3f}"
        places.write_record(places.PROGRESS, {
            "pid": os.getpid(), "phase": phase, "cpu0": f"{self.cpu0:.3f}",
            "kcpu": f"{self.kcpu:.3f}", "extras": self.extras, "xwall": xwall,
            "xbegan": f"{self.xbegan:.3f}"}, dir_fd=self.dirfd)


def left(record: dict[str, str], cpu: float, now: float) -> float | None:
    """What the server of ``record`` has left to import: CPU seconds of a kernel's imports (it
    used ``cpu`` by ``now``), plus wall seconds of ``kernel-preload``'s; None when unknown."""
    kcpu, cpu0 = _number(record.get("kcpu")), _number(record.get("cpu0"))
    xwall, xbegan = _number(record.get("xwall")), _number(record.get("xbegan"))
    phase = record.get("phase")
    if kcpu is None or cpu0 is None or xwall is None or xbegan is None:
        return None
    if phase == "ready":
        return 0.0
    if phase == "extra":
        return max(0.0, xbegan + xwall - now)
    if phase != "kernel":
        return None
    return max(0.0, kcpu - (cpu - cpu0)) + xwall


def wait(dirfd: int, connect: Callable[[], object | None]) -> object | None:
    """``connect()``'s connection to the server of ``dirfd`` once it listens, waiting only
    while that is faster than an ordinary start (module docstring); None: start that way."""
    record = places.read_record(places.PROGRESS, dirfd)
    pid, kcpu = record.get("pid", ""), _number(record.get("kcpu"))
    if not pid.isdigit() or kcpu is None:
        return None
    began = checked = time.monotonic()
    ready: float | None = None  # when the record first said "ready"
    cpu, rate = cpu_seconds(pid), 1.0  # until measured: as fast as an ordinary start would be
    while cpu is not None:
        estimate = left(record, cpu, time.time())
        if estimate is None or estimate >= WORTH * kcpu or checked - began > MAX_WAIT:
            return None
        phase = record.get("phase")
        if phase == "kernel" and rate < MIN_RATE:
            return None  # starved, or stopped (kernel-preload's imports may sleep; ours do not)
        if phase != "ready" or ready is None:
            ready = checked if phase == "ready" else None
        elif checked - ready > READY_WAIT:
            return None  # imports done long ago, and still not listening: something is wrong
        connection = connect()
        if connection is not None:
            return connection
        time.sleep(POLL)
        now = time.monotonic()
        if now - checked >= RATE_WINDOW:
            record = places.read_record(places.PROGRESS, dirfd) or record
            used = cpu_seconds(pid)
            if used is None:
                return None
            rate, cpu, checked = (used - cpu) / (now - checked), used, now
    return None

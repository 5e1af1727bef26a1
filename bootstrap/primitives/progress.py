"""Progress for a person at a terminal: a live line per step, then what the run changed.

A cold build takes tens of seconds; without a word the person at the shell cannot tell a slow
install from a hang. While a step runs, its line moves (a spinner and the time so far, redrawn a
few times a second by a small thread); when it ends, the line is replaced by its finished form
``[2/4] installing 8 skills (11.3s)``. Output only when the CLI talks to a person (stderr is a
TTY, not ``-q``, logs are not JSON, see :func:`log.on_terminal`): a kernel launcher
or CI pipes our stderr, and progress in its log is noise; a library caller gets none either.
Every call is a few microseconds when disabled and never raises: progress must never be the
reason a bootstrap fails. The engine calls it at its step boundaries::

    progress.start(4)
    progress.step("creating the venv")
    progress.note("waiting for pid 123")   # an aside within the current step
    progress.finish("ready")
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from bootstrap.primitives import log

# "A few times a second": enough to look alive, cheap enough to cost nothing (2 cores here).
_TICK: Final = 0.125
_FRAMES: Final = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_ASCII_FRAMES: Final = "-\\|/"
_CLEAR: Final = "\r\033[K"

_total = 0
_done = 0
_started: float | None = None
_lock = threading.Lock()


class _Live:
    """The current step's moving line, redrawn by a daemon thread until :meth:`end`."""

    def __init__(self, counter: str, text: str) -> None:
        self.counter, self.text, self.since = counter, text, time.monotonic()
        self.frame = 0
        self.frames = _ASCII_FRAMES if not _can_encode(_FRAMES) else _FRAMES
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kernel-bootstrap-progress",
                                       daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(_TICK):
            with _lock:
                self.draw()

    def draw(self) -> None:
        """Under ``_lock``: the spinner, the step and its time so far, on one rewritten line."""
        if self.stop.is_set():
            return
        self.frame = (self.frame + 1) % len(self.frames)
        spinner = _paint("\033[36m", self.frames[self.frame])
        _put(_CLEAR + _line(spinner, self.counter, self.text, self.elapsed()))

    def elapsed(self) -> float:
        return time.monotonic() - self.since

    def end(self) -> None:
        """Stop moving; replace the live line with the finished one."""
        self.stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()
        with _lock:
            _put(_CLEAR + _line("", self.counter, self.text, self.elapsed()) + "\n")


_live: _Live | None = None


def enabled() -> bool:
    return log.on_terminal()


def start(total_steps: int) -> None:
    """Begin a run of ``total_steps`` steps; the clock starts now."""
    global _total, _done, _started
    _end_step()
    _total, _done, _started = max(0, total_steps), 0, time.monotonic()
    if enabled():
        log.steps_shown(True, _around_live_line)


def step(text: str) -> None:
    """The next step begins: ``[N/M] text``; M grows if the engine finds more to do."""
    global _done, _total, _live
    _end_step()
    _done += 1
    _total = max(_total, _done)
    if not enabled():
        return
    _live = _Live(f"[{_done}/{_total}]", text)
    with _lock:
        _live.draw()
    # No thread to be had (RuntimeError): the line just does not move.
    with contextlib.suppress(RuntimeError):
        _live.thread.start()


def note(text: str) -> None:
    """Something worth saying within the current step (a wait, a retry), above its live line."""
    if not enabled():
        return
    indent = " " * len(f"[{_done}/{_total}]") if _done else ""
    with _around_live_line():
        _put(_line("", indent, text, _since_start()) + "\n")


def finish(text: str = "done") -> None:
    """The run is over: the last step's line, then ``text`` with the total time."""
    global _total, _done, _started
    _end_step()
    if _started is not None and enabled():
        with _lock:
            _put(_line("", "", text, _since_start()) + "\n")
    _total, _done, _started = 0, 0, None
    log.steps_shown(False)


def stop() -> None:
    """End a live line cut short (an error, ^C) so that what follows starts on its own line."""
    _end_step()
    log.steps_shown(False)


def _end_step() -> None:
    global _live
    live, _live = _live, None
    if live is not None:
        live.end()


@contextmanager
def _around_live_line() -> Iterator[None]:
    """Clear the live line, let the caller write whole lines, then redraw it below them."""
    with _lock:
        if _live is not None:
            _put(_CLEAR)
        try:
            yield
        finally:
            if _live is not None:
                _live.draw()


def _since_start() -> float:
    global _started
    if _started is None:  # a note before start(), such as waiting for the lock
        _started = time.monotonic()
    return time.monotonic() - _started


def _clock(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _line(spinner: str, counter: str, text: str, seconds: float) -> str:
    counter = _paint("\033[1m", counter) if counter.strip() else counter
    clock = _paint("\033[2m", f"({_clock(seconds)})")
    return " ".join(part for part in (spinner, counter, text, clock) if part)


def _paint(code: str, text: str) -> str:
    return f"{code}{text}\033[0m" if text and log.use_colour(sys.stderr) else text


def _can_encode(text: str) -> bool:
    try:
        text.encode(getattr(sys.stderr, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _put(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or broken stderr must not fail the bootstrap
        pass


def distributions(venv: str | None) -> dict[str, str]:
    """name -> version of what is installed in ``venv``, read from its ``*.dist-info``
    directory names (no child process, no import of the venv's packages); {} if unreadable."""
    import glob
    import os

    if venv is None:
        return {}
    found: dict[str, str] = {}
    posix = glob.glob(os.path.join(glob.escape(venv), "lib", "python*", "site-packages"))
    for site in [*posix, os.path.join(venv, "Lib", "site-packages")]:
        try:
            names = os.listdir(site)
        except OSError:
            continue
        for entry in names:
            stem, dot, kind = entry.rpartition(".")
            name, dash, version = stem.partition("-")
            if dot and kind == "dist-info" and dash and name:
                found[name.lower().replace("_", "-").replace(".", "-")] = version
    return found


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """uv's summary of a run: ``- name==old`` and ``+ name==new``, sorted by name."""
    lines: list[tuple[str, str]] = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is not None:
            lines.append((name, f"- {name}=={old}"))
        if new is not None:
            lines.append((name, f"+ {name}=={new}"))
    return [line for _, line in lines]


def summary(before: dict[str, str], after: dict[str, str]) -> None:
    """Print what this run changed in the venv, as uv does (on a terminal only)."""
    if not enabled():
        return
    colours = {"+": "\033[32m", "-": "\033[31m"}
    text = "".join(_paint(colours[line[0]], line[0]) + line[1:] + "\n"
                   for line in changes(before, after))
    with _lock:
        _put(text)

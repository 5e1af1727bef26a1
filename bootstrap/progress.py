"""Progress for a person at a terminal: ``[2/4] installing 8 skills`` with the time so far.

A cold build takes tens of seconds; without a word the person at the shell cannot tell a slow
install from a hang. Output only when stderr is a TTY, the log level shows info (not ``-q``) and
logs are not JSON: a kernel launcher or CI pipes our stderr, and progress in its log is noise.
Every call is a few microseconds when disabled and never raises: progress must never be the
reason a bootstrap fails. The engine calls it at its step boundaries::

    progress.start(4)
    progress.step("creating the venv")
    progress.note("waiting for pid 123")   # an aside within the current step
    progress.finish("ready")
"""

from __future__ import annotations

import sys
import time

from bootstrap import log

_total = 0
_done = 0
_started: float | None = None


def enabled() -> bool:
    return log.enabled(log.INFO) and not log.is_json() and log.isatty(sys.stderr)


def start(total_steps: int) -> None:
    """Begin a run of ``total_steps`` steps; the clock starts now."""
    global _total, _done, _started
    _total, _done, _started = max(0, total_steps), 0, time.monotonic()


def step(text: str) -> None:
    """The next step begins: ``[N/M] text``; M grows if the engine finds more to do."""
    global _done, _total
    _done += 1
    _total = max(_total, _done)
    _write(f"[{_done}/{_total}]", text)


def note(text: str) -> None:
    """Something worth saying within the current step (a wait, a retry), indented under it."""
    _write(" " * len(f"[{_done}/{_total}]") if _done else "", text)


def finish(text: str = "done") -> None:
    """The run is over: say so with the total time; the next ``start`` begins afresh."""
    global _total, _done, _started
    if _started is not None:
        _write("", text)
    _total, _done, _started = 0, 0, None


def _elapsed() -> str:
    global _started
    if _started is None:  # a note before start(), such as waiting for the lock
        _started = time.monotonic()
    seconds = time.monotonic() - _started
    if seconds < 60:
        return f"{seconds:.1f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _write(counter: str, text: str) -> None:
    if not enabled():
        return
    stream = sys.stderr
    clock = f"({_elapsed()})"
    if log.use_colour(stream):
        counter, clock = f"\033[1m{counter}\033[0m", f"\033[2m{clock}\033[0m"
    line = " ".join(part for part in (counter, text, clock) if part)
    try:
        stream.write(line + "\n")
        stream.flush()
    except (OSError, ValueError):  # a closed or broken stderr must not fail the bootstrap
        pass

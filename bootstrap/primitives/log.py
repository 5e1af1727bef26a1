"""Logging: console lines or JSON lines for the CLI, the standard ``logging`` module for a library.

Two destinations. Used as a library (``from bootstrap import ensure``), events go to the standard
``logging`` module under the logger ``kernel_bootstrap`` (structlog's stdlib integration) and
nothing is written to stderr by us: the host program decides where logs go. The CLI calls
:func:`configure` and gets its own output: console lines (colour and progress only on a TTY,
colour unless ``NO_COLOR``), or JSON lines when asked for (``--log-format json``, or
``KERNEL_BOOTSTRAP_LOG_FORMAT=json`` for every command of a launcher or a CI job). JSON used to
be the default whenever stderr was not a TTY; but CI logs and ``2> file`` are read by people,
beside uv's, pip's and pre-commit's human text, so only a log store that searches JSON asks.

The CLI renders its lines itself (primitives/logline.py): importing structlog costs
40-130 ms (it pulls in asyncio), which was a quarter of our own time in a rebuild whose uv work
takes well under a second. structlog is imported only for library use, and only when something
is logged.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final

# The lines themselves: one renderer, which the warm path (bootstrap.warm) uses too.
from bootstrap.primitives.logline import error_line as error_line
from bootstrap.primitives.logline import isatty as isatty
from bootstrap.primitives.logline import render_console as render_console
from bootstrap.primitives.logline import render_json
from bootstrap.primitives.logline import use_colour as use_colour

DEBUG: Final = 10
INFO: Final = 20
WARNING: Final = 30
ERROR: Final = 40

# The logger a library user configures (``logging.getLogger("kernel_bootstrap")``).
LOGGER_NAME: Final = "kernel_bootstrap"
# ``--log-format``'s value when the option is not given.
FORMAT_ENV: Final = "KERNEL_BOOTSTRAP_LOG_FORMAT"
FORMATS: Final = ("console", "json")

_level = INFO
_fmt: str | None = None
_logger: Any = None
# False until the CLI calls configure(): a library caller's stderr is not ours to write on.
_cli = False
# Set by primitives/progress.py while its step lines are on screen: they already tell the story the
# info events tell, and a person should not read every step twice (``-v`` shows both).
_steps_shown = False
# Set by primitives/progress.py: clears its live line around our write so the two do not interleave.
_guard: Callable[[], AbstractContextManager[object]] = nullcontext


def configure(verbosity: int = 0, fmt: str | None = None) -> None:
    """CLI output: the threshold (``-v`` lowers it, ``-q`` raises it), the format (None: by TTY).

    Until this is called, events go to the standard ``logging`` module instead (library use).
    """
    global _level, _fmt, _logger, _cli
    if verbosity > 0:
        _level = DEBUG
    elif verbosity == 0:
        _level = INFO
    else:
        _level = WARNING if verbosity == -1 else ERROR
    _fmt = fmt
    _logger = None
    _cli = True


def use_stdlib_logging() -> None:
    """Back to library use: events go to ``logging.getLogger("kernel_bootstrap")``."""
    global _level, _fmt, _logger, _cli
    _level, _fmt, _logger, _cli = INFO, None, None, False


def enabled(level: int) -> bool:
    if _cli:
        return level >= _level
    return bool(_stdlib_logger().isEnabledFor(level))


def format_from_env() -> str | None:
    """``$KERNEL_BOOTSTRAP_LOG_FORMAT`` (None when unset or empty); ValueError naming it when
    it is neither format."""
    value = os.environ.get(FORMAT_ENV, "")
    if value and value not in FORMATS:
        raise ValueError(f"{FORMAT_ENV}={value!r}: must be {' or '.join(FORMATS)}")
    return value or None


def is_json() -> bool:
    """Whether the CLI's log lines are JSON: only when asked for, by ``--log-format`` or else
    by the environment; never merely because stderr is not a terminal."""
    if _fmt is not None:
        return _fmt == "json"
    return os.environ.get(FORMAT_ENV) == "json"


def on_terminal() -> bool:
    """Whether the CLI talks to a person: console lines on a TTY at info level (not ``-q``)."""
    return _cli and enabled(INFO) and not is_json() and isatty(sys.stderr)


def steps_shown(shown: bool, guard: Callable[[], AbstractContextManager[object]] = nullcontext,
                ) -> None:
    """Progress says whether its step lines are on screen, and how to write around them."""
    global _steps_shown, _guard
    _steps_shown, _guard = shown, guard


def counted(count: int, noun: str) -> str:
    """``1 requirement``, ``2 requirements``: a message counts in words a person would use."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _stdlib_logger() -> Any:
    import logging

    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        # Without any handler, logging's "last resort" prints warnings to stderr; a library
        # writes nothing there by itself (the host configures logging, or hears nothing).
        logger.addHandler(logging.NullHandler())
    return logger


def _build_stdlib() -> Any:
    import structlog

    def message(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> str:
        # The record carries the level; the message is the event with its fields.
        return render_console({**event, "level": "info"})

    return structlog.wrap_logger(
        _stdlib_logger(),
        wrapper_class=structlog.stdlib.BoundLogger,
        processors=[structlog.stdlib.filter_by_level, message],
    )


def _build() -> Any:
    if not _cli:
        return _build_stdlib()
    return _CliLogger(is_json(), use_colour(sys.stderr))


class _CliLogger:
    """The CLI's lines, in the shape structlog's JSONRenderer gave them: the fields, then
    ``event``, ``level`` and an ISO UTC ``timestamp``.

    Written to whatever ``sys.stderr`` is when a line is written, not when the logger was
    built: a host that swaps stderr (a test runner's capture, a notebook) and closes the old
    one must not make the next warning fail with "I/O operation on closed file"."""

    def __init__(self, as_json: bool, colour: bool) -> None:
        self.as_json, self.colour = as_json, colour

    def debug(self, event: str, **kw: Any) -> None:
        self.write({**kw, "event": event, "level": "debug"})

    def info(self, event: str, **kw: Any) -> None:
        self.write({**kw, "event": event, "level": "info"})

    def warning(self, event: str, **kw: Any) -> None:
        self.write({**kw, "event": event, "level": "warning"})

    def error(self, event: str, **kw: Any) -> None:
        self.write({**kw, "event": event, "level": "error"})

    def write(self, fields: dict[str, Any]) -> None:
        line = render_json(fields) if self.as_json else render_console(fields, self.colour)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _emit(level: int, method: str, event: str, **kw: Any) -> None:
    global _logger
    if not enabled(level):
        return
    if level == INFO and _steps_shown and _cli and _level > DEBUG:
        return
    if _logger is None:
        _logger = _build()
    with _guard():
        getattr(_logger, method)(event, **kw)


def debug(event: str, **kw: Any) -> None:
    _emit(DEBUG, "debug", event, **kw)


def info(event: str, **kw: Any) -> None:
    _emit(INFO, "info", event, **kw)


def warning(event: str, **kw: Any) -> None:
    _emit(WARNING, "warning", event, **kw)


def error(event: str, **kw: Any) -> None:
    _emit(ERROR, "error", event, **kw)

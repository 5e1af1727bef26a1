"""Logging: console lines or JSON lines for the CLI, the standard ``logging`` module for a library.

Two destinations. Used as a library (``from bootstrap import ensure``), events go to the standard
``logging`` module under the logger ``kernel_bootstrap`` (structlog's stdlib integration) and
nothing is written to stderr by us: the host program decides where logs go. The CLI calls
:func:`configure` and gets its own output: console lines on a TTY (colour unless ``NO_COLOR``),
JSON lines when stderr is not a TTY or with ``--log-format json``: a kernel launcher or CI keeps
our stderr in its own log, and one JSON object per line is what such logs can search.

The CLI renders its lines itself (one dict, one ``json.dumps``): importing structlog costs
40-130 ms (it pulls in asyncio), which was a quarter of our own time in a rebuild whose uv work
takes well under a second. structlog is imported only for library use, and only when something
is logged.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from typing import IO, Any, Final

DEBUG: Final = 10
INFO: Final = 20
WARNING: Final = 30
ERROR: Final = 40

# A value longer than this, or holding a newline (a uv error tail), goes on lines of its own.
_INLINE_MAX: Final = 60
_PREFIX: Final = {"debug": "debug: ", "info": "", "warning": "warning: ", "error": "error: "}
_COLOUR: Final = {"debug": "\033[2m", "warning": "\033[33;1m", "error": "\033[31;1m"}
_DIM: Final = "\033[2m"
_RESET: Final = "\033[0m"
# The logger a library user configures (``logging.getLogger("kernel_bootstrap")``).
LOGGER_NAME: Final = "kernel_bootstrap"

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


def is_json() -> bool:
    """Whether the CLI's log lines are JSON (asked for, or stderr is not a terminal)."""
    return _fmt == "json" or (_fmt is None and not isatty(sys.stderr))


def on_terminal() -> bool:
    """Whether the CLI talks to a person: console lines on a TTY at info level (not ``-q``)."""
    return _cli and enabled(INFO) and not is_json() and isatty(sys.stderr)


def steps_shown(shown: bool, guard: Callable[[], AbstractContextManager[object]] = nullcontext,
                ) -> None:
    """Progress says whether its step lines are on screen, and how to write around them."""
    global _steps_shown, _guard
    _steps_shown, _guard = shown, guard


def error_line(message: str) -> str:
    """``error: message`` as the CLI prints it, the prefix coloured like a warning's."""
    prefix = "error:"
    if use_colour(sys.stderr):
        prefix = f"{_COLOUR['error']}{prefix}{_RESET}"
    return f"{prefix} {message}"


def use_colour(stream: IO[str]) -> bool:
    """Colour only for a person: a terminal, ``NO_COLOR`` unset or empty, a capable TERM."""
    return (isatty(stream) and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM") != "dumb")


def isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


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
        if self.as_json:
            import datetime
            import json

            now = datetime.datetime.now(tz=datetime.UTC)
            fields["timestamp"] = now.isoformat().replace("+00:00", "Z")
            line = json.dumps(fields, default=str)
        else:
            line = render_console(fields, self.colour)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def render_console(event_dict: Mapping[str, Any], colour: bool = False) -> str:
    """One event for a person: ``warning: what happened  key=value``, long values below it.

    uv's error tails are several lines; printed as a quoted repr on one line they would be
    unreadable, so they go under the event, indented, as uv printed them.
    """
    fields = dict(event_dict)
    level = str(fields.pop("level", "info"))
    event = str(fields.pop("event", ""))
    inline: list[str] = []
    below: list[str] = []
    for key, value in fields.items():
        text = _text(value)
        if "\n" in text or len(text) > _INLINE_MAX:
            below.append(f"  {key}:")
            below += [f"    {line}" for line in text.splitlines()]
        else:
            inline.append(f"{key}={_quoted(text)}")
    head = _PREFIX.get(level, f"{level}: ") + event
    if colour:
        start = _COLOUR.get(level, "")
        head = f"{start}{head}{_RESET}" if start else head
        inline = [f"{_DIM}{item}{_RESET}" for item in inline]
    return "\n".join([" ".join([head, *inline]) if inline else head, *below])


def _quoted(text: str) -> str:
    return f'"{text}"' if not text or any(c.isspace() for c in text) else text


def _text(value: Any) -> str:
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(str(v) for v in value)
    return str(value)


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

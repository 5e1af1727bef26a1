"""Logging, configured once; structlog is imported only when something is actually logged.

The warm ``ensure`` logs nothing (unless ``-v``), so it never pays structlog's import (~40-100 ms).
Console lines on a TTY (colour unless ``NO_COLOR``), JSON lines when stderr is not a TTY or with
``--log-format json``: a kernel launcher or CI keeps our stderr in its own log, and one JSON
object per line is what such logs can search.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
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

_level = INFO
_fmt: str | None = None
_logger: Any = None


def configure(verbosity: int = 0, fmt: str | None = None) -> None:
    """Set the threshold (``-v`` lowers it, ``-q`` raises it) and the format (None: by TTY)."""
    global _level, _fmt, _logger
    if verbosity > 0:
        _level = DEBUG
    elif verbosity == 0:
        _level = INFO
    else:
        _level = WARNING if verbosity == -1 else ERROR
    _fmt = fmt
    _logger = None


def enabled(level: int) -> bool:
    return level >= _level


def is_json() -> bool:
    """Whether log lines are JSON (asked for, or stderr is not a terminal)."""
    return _fmt == "json" or (_fmt is None and not isatty(sys.stderr))


def use_colour(stream: IO[str]) -> bool:
    """Colour only for a person: a terminal, ``NO_COLOR`` unset or empty, a capable TERM."""
    return (isatty(stream) and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM") != "dumb")


def isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def _build() -> Any:
    import structlog

    processors: list[Any] = [structlog.processors.add_log_level]
    if is_json():
        processors += [structlog.processors.TimeStamper(fmt="iso", utc=True),
                       structlog.processors.JSONRenderer(default=str)]
    else:
        colour = use_colour(sys.stderr)
        processors.append(lambda _logger, _name, event: render_console(event, colour))
    return structlog.wrap_logger(
        structlog.PrintLogger(file=sys.stderr),
        processors=processors,
        cache_logger_on_first_use=True,
    )


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
    if level < _level:
        return
    if _logger is None:
        _logger = _build()
    getattr(_logger, method)(event, **kw)


def debug(event: str, **kw: Any) -> None:
    _emit(DEBUG, "debug", event, **kw)


def info(event: str, **kw: Any) -> None:
    _emit(INFO, "info", event, **kw)


def warning(event: str, **kw: Any) -> None:
    _emit(WARNING, "warning", event, **kw)


def error(event: str, **kw: Any) -> None:
    _emit(ERROR, "error", event, **kw)

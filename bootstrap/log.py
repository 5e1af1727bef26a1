"""Logging, configured once; structlog is imported only when something is actually logged.

The warm ``ensure`` logs nothing (unless ``-v``), so it never pays structlog's import (~40-100 ms).
Console lines on a TTY (colour unless ``NO_COLOR``), JSON lines when stderr is not a TTY or with
``--log-format json``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Final

DEBUG: Final = 10
INFO: Final = 20
WARNING: Final = 30
ERROR: Final = 40

_level = INFO
_fmt: str | None = None
_logger: Any = None


def configure(verbosity: int = 0, fmt: str | None = None) -> None:
    """Set the threshold (``-v`` lowers it, ``-q`` raises it) and the output format."""
    global _level, _fmt, _logger
    _level = {1: DEBUG}.get(verbosity, DEBUG if verbosity > 1 else INFO) if verbosity > 0 else (
        INFO if verbosity == 0 else WARNING if verbosity == -1 else ERROR
    )
    _fmt = fmt
    _logger = None


def enabled(level: int) -> bool:
    return level >= _level


def _build() -> Any:
    import structlog

    use_json = _fmt == "json" or (_fmt is None and not sys.stderr.isatty())
    processors: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if use_json:
        processors.append(structlog.processors.JSONRenderer())
    else:
        colors = sys.stderr.isatty() and "NO_COLOR" not in os.environ
        processors.append(structlog.dev.ConsoleRenderer(colors=colors))
    return structlog.wrap_logger(
        structlog.PrintLogger(file=sys.stderr),
        processors=processors,
        cache_logger_on_first_use=True,
    )


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

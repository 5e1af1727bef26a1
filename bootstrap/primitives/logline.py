"""One log event as the CLI writes it: a console line or a JSON line, and whether in colour.

The one renderer of both paths: ``primitives/log.py`` (the full CLI) and ``bootstrap.warm``,
which repeats the warnings a fingerprint records (a skill backing off, an invalid SKILL.md).
The warm path used to render the two formats by hand, and its lines differed from the full
path's (no error, no hint).

Nothing here imports more than what every interpreter's start has loaded (``os``, ``sys``,
``time``) and the C half of ``json``: the warm path imports this module, and ``json`` (which
pulls in ``re``, ~12 ms) or ``typing`` (~5 ms) would cost as much as the rest of its answer.
"""

from __future__ import annotations

import os
import sys
import time

try:  # CPython's C encoder, the one json.dumps uses by default (ensure_ascii)
    from _json import encode_basestring_ascii as _string
except ImportError:  # pragma: no cover - an interpreter without it
    from json.encoder import py_encode_basestring_ascii as _string

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import IO, Any

# A value longer than this, or holding a newline (a uv error tail), goes on lines of its own.
_INLINE_MAX = 60
_PREFIX = {"debug": "debug: ", "info": "", "warning": "warning: ", "error": "error: "}
COLOUR = {"debug": "\033[2m", "warning": "\033[33;1m", "error": "\033[31;1m"}
_DIM = "\033[2m"
RESET = "\033[0m"


def use_colour(stream: IO[str]) -> bool:
    """Colour only for a person: a terminal, ``NO_COLOR`` unset or empty, a capable TERM."""
    return (isatty(stream) and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM") != "dumb")


def isatty(stream: IO[str] | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def error_line(message: str) -> str:
    """``error: message`` as the CLI prints it, the prefix coloured like a warning's."""
    prefix = "error:"
    if use_colour(sys.stderr):
        prefix = f"{COLOUR['error']}{prefix}{RESET}"
    return f"{prefix} {message}"


def render_console(event_dict: Mapping[str, Any], colour: bool = False) -> str:
    """One event for a person: ``warning: what happened  key=value``, long values below it.

    uv's error tails are several lines; printed as a quoted repr on one line they would be
    unreadable, so they go under the event, indented, as uv printed them. A long value of one
    line (a path) goes under it too, on its key's line: split from its key, ``venv:`` read as
    an empty value. An empty list says nothing: ``in_use=""`` read as an empty name.
    """
    fields = dict(event_dict)
    level = str(fields.pop("level", "info"))
    event = str(fields.pop("event", ""))
    inline: list[str] = []
    below: list[str] = []
    for key, value in fields.items():
        if isinstance(value, list | tuple | set | frozenset) and not value:
            continue
        text = _text(value)
        if "\n" in text:
            below.append(f"  {key}:")
            below += [f"    {line}" for line in text.splitlines()]
        elif len(text) > _INLINE_MAX:
            below.append(f"  {key}: {text}")
        else:
            inline.append(f"{key}={_quoted(text)}")
    head = _PREFIX.get(level, f"{level}: ") + event
    if colour:
        start = COLOUR.get(level, "")
        head = f"{start}{head}{RESET}" if start else head
        inline = [f"{_DIM}{item}{RESET}" for item in inline]
    return "\n".join([" ".join([head, *inline]) if inline else head, *below])


def render_json(fields: Mapping[str, Any], now_ns: int | None = None) -> str:
    """One event as one JSON object: the fields, then an ISO UTC ``timestamp`` to the
    microsecond; the bytes ``json.dumps(fields, default=str)`` writes for our fields."""
    return _json({**fields, "timestamp": timestamp(now_ns)})


def timestamp(now_ns: int | None = None) -> str:
    seconds, ns = divmod(time.time_ns() if now_ns is None else now_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns // 1000:06d}Z"


def write(line: str) -> None:
    """To whatever ``sys.stderr`` is now (a host may have swapped and closed the old one)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _json(value: object) -> str:
    # json.dumps's encoding of what events carry (str, numbers, None, lists, dicts), with its
    # separators; anything else as its str(), as default=str does.
    if isinstance(value, str):
        return str(_string(value))
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)}: {_json(v)}" for k, v in value.items()) + "}"
    return str(_string(str(value)))


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


def _key(key: object) -> str:
    if isinstance(key, str):
        return str(_string(key))
    if key is None or isinstance(key, bool | float):  # json.dumps spells these as strings
        return '"' + _json(key) + '"'
    return '"' + str(key) + '"'


def _quoted(text: str) -> str:
    return f'"{text}"' if not text or any(c.isspace() for c in text) else text


def _text(value: Any) -> str:
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(str(v) for v in value)
    return str(value)

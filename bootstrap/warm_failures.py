"""The failures a warm fingerprint records: how they are written and read, and what is said.

A skill backing off and a skill whose SKILL.md is invalid are warned about at every start, and
a rebuild backing off is refused with its error. The warm path repeats each as the full path
says it: the same event and fields (the words are here, and the full path logs these very
ones), rendered by the same renderer (``primitives/logline.py``). Imported only when there is
something to say: a start without failures pays nothing for it.

Their errors are written escaped as Python's ``unicode_escape`` does (one line, no tab), which
the warm path decodes without importing ``json`` (and ``re``: ~12 ms). A line not as
:func:`escape` and ``fingerprint.render`` write it (a count ``int()`` refuses, an escape that
does not decode) makes the fingerprint one that does not hold: the full path answers.
"""

from __future__ import annotations

import sys

from bootstrap.primitives import logline

BACKED_OFF = "skill failed to install earlier; not retried before retry_at"
RETRY_HINT = "`kernel-bootstrap ensure --retry` retries now"
INVALID = "skill is invalid: agents cannot load it, so it is skipped"
INVALID_HINT = "fix its SKILL.md and run `kernel-bootstrap ensure` again"


def escape(text: str) -> str:
    return text.encode("unicode_escape").decode("ascii")


def parse(lines: list[list[str]]) -> tuple[list[tuple[str, int, str, str]],
                                           list[tuple[str, str]], str | None] | None:
    """The ``failed`` lines' (name, count, retry time, error), the ``invalid`` lines' (name,
    error) and the ``refused`` line's error, each line split at its tabs; None if any is not
    as we write it."""
    failed: list[tuple[str, int, str, str]] = []
    invalid: list[tuple[str, str]] = []
    refused = None
    for fields in lines:
        error = _unescape(fields[-1])
        if error is None:
            return None
        if fields[0] == "failed" and len(fields) == 5 and _count(fields[2]):
            failed.append((fields[1], int(fields[2]), fields[3], error))
        elif fields[0] == "invalid" and len(fields) == 3:
            invalid.append((fields[1], error))
        elif fields[0] == "refused" and len(fields) == 2:
            refused = error
        else:
            return None
    return failed, invalid, refused


def _unescape(text: str) -> str | None:
    try:
        return text.encode("ascii").decode("unicode_escape")
    except UnicodeError:
        return None


def _count(text: str) -> bool:
    # isdigit() alone takes "²" (which int() refuses) and 5,000 digits (which it refuses too).
    return text.isascii() and text.isdigit() and len(text) <= 9


def answer(failed: list[tuple[str, int, str, str]], invalid: list[tuple[str, str]],
           refused: str | None, *, quiet: int, as_json: bool) -> int | None:
    """A rebuild backing off (``refused``: its error) is answered with that error: 1, as the
    full path answers it. Each invalid skill (name, error), then each skill backing
    off (name, count, retry time, error) is warned about, as the full path warns in that
    order. None: go on with the answer."""
    if refused is not None:
        print(logline.error_line(refused), file=sys.stderr)
        return 1  # EXIT_FAILED
    if quiet < 2:  # -qq shows errors only
        for name, error in invalid:
            _warn(as_json, skill=name, error=error, hint=INVALID_HINT, event=INVALID)
        for name, count, retry_at, error in failed:
            _warn(as_json, skill=name, failures=count, retry_at=retry_at, error=error,
                  hint=RETRY_HINT, event=BACKED_OFF)
    return None


def refuse_strict(names: list[str]) -> int:
    """``run --strict`` with failed skills: what ``commands/run.py`` prints, and its exit."""
    print(logline.error_line(f"skill(s) failed: {', '.join(sorted(names))}; not starting the "
                             "interpreter (--strict)"), file=sys.stderr)
    return 3  # EXIT_SKILLS_FAILED


def _warn(as_json: bool, **fields: object) -> None:
    fields["level"] = "warning"
    logline.write(logline.render_json(fields) if as_json
                  else logline.render_console(fields, logline.use_colour(sys.stderr)))

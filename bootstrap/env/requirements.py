"""Requirements as the runtime lists them: each must be PEP 508, checked before anything is
built (the config loader leaves this to the slow path: packaging costs ~40 ms to import)."""

from __future__ import annotations

import re
from typing import Final

from bootstrap.config import Config
from bootstrap.config_file import source_name
from bootstrap.errors import ConfigError

# A name, extras and plain version bounds (``ipykernel>=6``): surely PEP 508, so such a
# requirement is accepted without importing packaging (~40 ms, a tenth of our own time in a
# rebuild). Anything else (markers, URLs, pre-releases) is parsed by packaging.
_NAME: Final = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION: Final = r"\d+(?:\.\d+)*"
_BOUND: Final = (rf"(?:(?:==|!=)\s*{_VERSION}(?:\.\*)?|(?:<=|>=|<|>)\s*{_VERSION}"
                 r"|~=\s*\d+(?:\.\d+)+)")
_SIMPLE_REQUIREMENT: Final = (rf"\s*{_NAME}\s*(?:\[\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\])?"
                              rf"\s*(?:{_BOUND}(?:\s*,\s*{_BOUND})*)?\s*")


_NAME_SEP: Final = re.compile(r"[-_.]+")
_LEADING_NAME: Final = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return _NAME_SEP.sub("-", name).lower()


def requirement_name(text: str) -> str | None:
    """The canonical name a requirement starts with (``Foo_Bar[x]>=1`` -> ``foo-bar``); None for
    text that starts with none. No packaging import: every caller is on a path that avoids it."""
    match = _LEADING_NAME.match(text)
    return canonical(match[1]) if match else None


def validate_requirements(config: Config) -> None:
    """Every requirement must be PEP 508; the error quotes the bad one."""
    simple = re.compile(_SIMPLE_REQUIREMENT)
    if all(simple.fullmatch(text) for text in config.requirements):
        return
    from packaging.requirements import InvalidRequirement, Requirement

    for index, text in enumerate(config.requirements):
        try:
            Requirement(text)
        except InvalidRequirement as e:
            raise ConfigError(
                f"{source_name(config.path)}: requirements[{index}]: invalid requirement "
                f"{text!r}: {e}"
            ) from None

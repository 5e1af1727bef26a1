"""YAML 1.2's core schema on PyYAML, which implements YAML 1.1.

Agents' loaders read SKILL.md's front matter as YAML 1.2, where ``name: no`` is the string
"no" and ``description: 2024-02-30`` a string, not a boolean and an impossible date (YAML 1.1
refused a skill agents load). Here a plain scalar is null, a boolean, an integer or a float only
in the core schema's forms; everything else is a string. A key given twice is an error: YAML
forbids it, and PyYAML kept the last one, so an invalid first ``name`` was never looked at.

PyYAML costs ~20 ms to import: import this module only where a front matter is parsed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable
from typing import Any, Final

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode

try:  # libyaml's parser when it is there: ~5x PyYAML's own
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # pragma: no cover - a PyYAML built without libyaml
    # the two loaders share no base that mypy sees, yet take the same subclassing
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

_NULL: Final = "tag:yaml.org,2002:null"
_BOOL: Final = "tag:yaml.org,2002:bool"
_INT: Final = "tag:yaml.org,2002:int"
_FLOAT: Final = "tag:yaml.org,2002:float"

# The core schema's tag resolution (YAML 1.2.2, 10.3.2), each with the first characters it
# can start with (PyYAML's index); tried in this order, so "12" is an int, not a float.
_NULL_RE: Final = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL_RE: Final = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT_RE: Final = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_RE: Final = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                              r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_RESOLVERS: Final = (
    (_NULL, _NULL_RE, ["~", "n", "N", ""]),
    (_BOOL, _BOOL_RE, list("tTfF")),
    (_INT, _INT_RE, list("-+0123456789")),
    (_FLOAT, _FLOAT_RE, list("-+0123456789.")),
)


class DuplicateKeyError(ConstructorError):
    """A mapping gives ``key`` twice: on ``first_line`` and ``line`` of the YAML (0-based)."""

    def __init__(self, key: Hashable, first_line: int, node: Node) -> None:
        super().__init__(None, None, f"duplicate key {key!r:.80}", node.start_mark)
        self.key = key
        self.first_line = first_line
        self.line = node.start_mark.line


class Loader(_SafeLoader):
    """PyYAML's safe loader reading YAML 1.2's core schema and refusing duplicate keys.

    A subclass: ``yaml.SafeLoader``'s resolvers and constructors stay as they are for every
    other user of PyYAML in the process.
    """

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, MappingNode):
            seen: dict[tuple[type, Hashable], int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)  # cached: built once
                ident = (type(key), key)  # by type too: 1 and true are two YAML keys
                try:
                    first = seen.get(ident)
                except TypeError:
                    continue  # an unhashable key: the base class refuses it by name
                if first is not None:
                    raise DuplicateKeyError(key, first, key_node)
                seen[ident] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _scalar(loader: Loader, node: Node, pattern: re.Pattern[str], kind: str) -> str:
    """The scalar's text when it has the core schema's form of ``kind``: an explicit tag
    (``!!bool yes``) is checked too, and PyYAML's own constructors crashed on some."""
    value = loader.construct_scalar(node) if isinstance(node, ScalarNode) else None
    if not isinstance(value, str) or not pattern.match(value):
        raise ConstructorError(None, None, f"{value!r:.80} is not {kind} in YAML 1.2",
                               node.start_mark)
    return value


def _construct_null(loader: Loader, node: Node) -> None:
    _scalar(loader, node, _NULL_RE, "null")


def _construct_bool(loader: Loader, node: Node) -> bool:
    return _scalar(loader, node, _BOOL_RE, "a boolean").lower() == "true"


def _construct_int(loader: Loader, node: Node) -> int:
    value = _scalar(loader, node, _INT_RE, "an integer")
    if value.startswith(("0o", "0x")):
        return int(value[2:], 8 if value[1] == "o" else 16)
    return int(value)  # "0777" is 777: a leading zero means nothing in YAML 1.2


def _construct_float(loader: Loader, node: Node) -> float:
    value = _scalar(loader, node, _FLOAT_RE, "a float").lower()
    if value.endswith(".inf"):
        return -math.inf if value.startswith("-") else math.inf
    return math.nan if value == ".nan" else float(value)


def _construct_timestamp(loader: Loader, node: Node) -> Any:
    # Not in the core schema: only an explicit !!timestamp gets here. PyYAML's own constructor
    # dies with an AttributeError on text that is no timestamp at all.
    if not isinstance(node, ScalarNode) or not loader.timestamp_regexp.match(node.value):
        raise ConstructorError(None, None, "not a timestamp", node.start_mark)
    return loader.construct_yaml_timestamp(node)


# Its own table, empty, then the core schema's: none of YAML 1.1's implicit types (dates,
# yes/no/on/off, 0777 octal, 1_000, 1:20 sexagesimal, "<<" merges, "=") is resolved.
Loader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in _RESOLVERS:
    Loader.add_implicit_resolver(_tag, _pattern, _first)
Loader.add_constructor(_NULL, _construct_null)
Loader.add_constructor(_BOOL, _construct_bool)
Loader.add_constructor(_INT, _construct_int)
Loader.add_constructor(_FLOAT, _construct_float)
Loader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)


def load(text: str) -> Any:
    """The YAML document ``text`` under the core schema; raises ``yaml.YAMLError`` (a
    :class:`DuplicateKeyError` for a key given twice), ValueError or RecursionError."""
    return yaml.load(text, Loader=Loader)

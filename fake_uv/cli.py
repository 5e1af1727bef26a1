"""A tiny clap-like option parser: uv's exact error wording, and no argparse import cost.

argparse would cost a few milliseconds per start and word its errors differently from uv; tests
spawn fake_uv hundreds of times and assert on uv's wording (`unexpected argument`), so we parse
by table instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, NamedTuple

from fake_uv.errors import UvExit

# Options uv accepts before or after any subcommand.
GLOBAL_FLAGS: Final = frozenset(
    {"--quiet", "--verbose", "--no-progress", "--offline", "--no-cache", "--native-tls",
     "--no-config", "--preview", "--no-python-downloads"}
)
GLOBAL_VALUED: Final = frozenset({"--cache-dir", "--color", "--config-file"})
GLOBAL_ALIASES: Final = {"-q": "--quiet", "-v": "--verbose", "-n": "--no-cache"}


class Spec(NamedTuple):
    """What one subcommand accepts; `aliases` maps short (or alternative) spellings to long."""

    usage: str
    flags: frozenset[str]
    valued: frozenset[str]
    aliases: Mapping[str, str]


class Parsed(NamedTuple):
    """Options by canonical long name (each occurrence's value, `""` for flags) + positionals."""

    options: Mapping[str, Sequence[str]]
    positionals: Sequence[str]

    def flag(self, name: str) -> bool:
        return name in self.options

    def value(self, name: str) -> str | None:
        values = self.options.get(name)
        return values[-1] if values else None

    def values(self, name: str) -> list[str]:
        return list(self.options.get(name, ()))


def spec(
    usage: str,
    flags: Iterable[str] = (),
    valued: Iterable[str] = (),
    aliases: Mapping[str, str] | None = None,
) -> Spec:
    """A subcommand's table, with uv's global options merged in."""
    return Spec(
        usage,
        GLOBAL_FLAGS | frozenset(flags),
        GLOBAL_VALUED | frozenset(valued),
        {**GLOBAL_ALIASES, **(aliases or {})},
    )


def split_command(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """The first subcommand word, and the other arguments (global options stay, in order)."""
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("-") or arg == "-":
            return arg, [*args[:index], *args[index + 1:]]
        index += 2 if GLOBAL_ALIASES.get(arg, arg) in GLOBAL_VALUED else 1
    return None, list(args)


def parse(args: Sequence[str], table: Spec) -> Parsed:
    """Parse `args` against `table`; raise `UvExit(2)` with uv's wording on misuse."""
    options: dict[str, list[str]] = {}
    positionals: list[str] = []
    queue = list(args)
    while queue:
        arg = queue.pop(0)
        if arg == "--":
            positionals += queue
            break
        if not arg.startswith("-") or arg == "-":
            positionals.append(arg)
            continue
        name, attached = _split(arg, table)
        if name in table.flags:
            if attached is not None:
                raise _usage(f"unexpected value '{attached}' for '{name}' found; "
                             "no more were expected", table)
            options.setdefault(name, []).append("")
        elif name in table.valued:
            if attached is None:
                if not queue:
                    raise _usage(f"a value is required for '{name} <VALUE>' but none was "
                                 "supplied", table)
                attached = queue.pop(0)
            options.setdefault(name, []).append(attached)
        else:
            raise _usage(f"unexpected argument '{arg}' found\n\n  tip: to pass '{arg}' as a "
                         f"value, use '-- {arg}'", table)
    return Parsed(options, positionals)


def _split(arg: str, table: Spec) -> tuple[str, str | None]:
    """Canonical name and attached value of `--opt=v`, `-ov`, or `-qq` (a repeated short flag)."""
    if arg.startswith("--"):
        name, sep, value = arg.partition("=")
        return table.aliases.get(name, name), (value if sep else None)
    short = arg[:2]
    name = table.aliases.get(short, short)
    rest = arg[2:]
    if not rest:
        return name, None
    if name in table.flags and rest == short[1] * len(rest):
        return name, None  # -qq: uv counts repeats; being quiet once is enough here
    return name, rest.removeprefix("=")


def _usage(message: str, table: Spec) -> UvExit:
    return UvExit(2, f"error: {message}\n\nUsage: {table.usage}\n\n"
                     "For more information, try '--help'.")

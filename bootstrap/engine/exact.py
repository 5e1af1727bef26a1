"""A locked venv holds exactly the lock's pins, plus the configured skills and what they need.

``repair`` checks and restores this when a ``lock`` is configured: a package installed by hand
(``pip install`` in a kernel, or left behind by a skill no longer configured) is removed, and a
pinned package whose version drifted is put back to its pin. What a configured skill requires
stays, pinned or not: skills are installed on top of the pins by design.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap.config import Config
from bootstrap.env import pins
from bootstrap.env.network import Network
from bootstrap.env.probe import probe
from bootstrap.env.requirements import canonical, requirement_name
from bootstrap.env.uv import make_uv
from bootstrap.env.venv import Venv
from bootstrap.errors import ProcessError
from bootstrap.primitives import lock


@dataclass(frozen=True)
class Inexact:
    lock: Path
    extra: dict[str, str] = field(default_factory=dict)  # name -> installed version
    drifted: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # (have, pin)

    @property
    def exact(self) -> bool:
        return not self.extra and not self.drifted

    def lines(self) -> list[str]:
        return ([f"package {n} {v}: neither pinned in {self.lock.name} nor required by a skill"
                 for n, v in sorted(self.extra.items())]
                + [f"package {n}: {have or 'not installed'}, pinned to {pin} in {self.lock.name}"
                   for n, (have, pin) in sorted(self.drifted.items())])


def installed(python: Path) -> dict[str, tuple[str, list[str]]]:
    """Every distribution in ``python``'s environment: name -> (version, requirements)."""
    return probe(python, everything=True).everything


def inspect(config: Config, python: Path, skill_projects: Iterable[str]) -> Inexact:
    """What keeps the venv from holding exactly the pins plus the skills' needs."""
    assert config.lock is not None, "BUG: exactness without a lock"
    pinned = pins.pins(config.lock)
    dists = installed(python)
    needed = _needed(skill_projects, dists)
    extra = {n: v for n, (v, _) in dists.items() if n not in pinned and n not in needed}
    drifted = {n: (dists[n][0] if n in dists else None, pin) for n, pin in pinned.items()
               if n not in dists or not _same_version(dists[n][0], pin)}
    return Inexact(config.lock, extra, drifted)


def _needed(roots: Iterable[str], dists: dict[str, tuple[str, list[str]]]) -> set[str]:
    """The skills' projects and everything they require, transitively, as installed.

    Markers and extras are not evaluated: keeping a package a skill might need is the safe
    mistake; removing one it needs is not.
    """
    needed: set[str] = set()
    todo = [canonical(r) for r in roots if r]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        for requirement in dists.get(name, ("", []))[1]:
            if name_of := requirement_name(requirement):
                todo.append(name_of)
    return needed


def _same_version(have: str, pin: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(have) == Version(pin)
    except InvalidVersion:
        return have == pin


def repair(config: Config, skill_projects: Iterable[str], lock_timeout: float) -> list[str]:
    """Remove what is neither pinned nor needed, reinstall drifted pins; say what was done."""
    python = Venv.at(config.venv).python
    with lock.hold(lock.lock_path(config.venv), lock_timeout, purpose="repair"):
        # Another process may have changed the venv since repair looked.
        found = inspect(config, python, skill_projects) if python.exists() else None
        if found is None or found.exact:
            return []
        uv = make_uv(config.constraints, config.uv_args,
                     Network(config.offline, config.uv_args),
                     compile_bytecode=config.compile_bytecode)
        done: list[str] = []
        try:
            if found.extra:
                uv.uninstall(python, sorted(found.extra))
                done += [f"removed {n} {v} (neither pinned nor required by a skill)"
                         for n, v in sorted(found.extra.items())]
            if found.drifted:
                pins.install_locked(uv, python, found.lock)
                done += [f"reinstalled {n} {pin} (was {have or 'not installed'})"
                         for n, (have, pin) in sorted(found.drifted.items())]
        except ProcessError as e:
            done.append(f"making the venv exact failed: {e}")
    return done

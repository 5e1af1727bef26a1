"""ipykernel worlds for the kernel tests, each built once per worker and copied for each test.

A world whose runtime is ipykernel costs a real ``uv venv``, the install of ipykernel and its
twenty-odd dependencies (9,000 files) and, with a skill, a build environment and a build: about
2 s on a quiet 2-core machine, for each of some 70 kernel tests. Each recipe (its skills and the
``kernelspec install`` options) is now built once per worker, by kernel-bootstrap as a test
would, and each test gets a copy of it at the one path it was built at: the venv's marker, the
kernelspec and the skills' editable installs name that path, so a copy anywhere else would be
another world, which ``ensure`` would rebuild.

A test's world is a copy, never the template itself: a test may add skills, rebuild, break the
venv. The copy's venv files are hard links to the template's, as uv's own are links into its
cache; everything else is copied. A file rewritten in place would reach the template through
its link, so each copy first checks that the template's venv files are as they were built, and
fails naming the changed file if not (nothing of the product rewrites one: it replaces files).
The build runs with a home of its own; each test then installs the kernelspec again, with its
own home, as it did when it built its world: the venv is ready, so that install runs no uv and
leaves in the test's home what an install leaves (the warm fingerprint). What a build leaves
there too (the build cache of its skills) is not in the copy's home: a test that rebuilds a
skill of its world builds it again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, Generic, TypeVar

from testing import kernels
from testing.world import World

W = TypeVar("W", bound=World)
_GENERATION: Final = ".venv.gen-"  # the runtime venv's generations (bootstrap.env.generations)
_HOME_VARS: Final = ("HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                     "XDG_STATE_HOME")
Stamp = dict[str, tuple[int, int, int]]


class KernelWorlds(Generic[W]):
    """The templates of one worker under ``base``; the test's world is always ``base/world``,
    the object ``make`` builds on that directory."""

    def __init__(self, base: Path, make: Callable[[Path], W]) -> None:
        self.base = base
        self.live = base / "world"
        self._make = make
        self._built: dict[str, Stamp] = {}

    def world(self, skills: Sequence[str] = (), options: Sequence[str] = ("--json",)) -> W:
        """A fresh copy of the world of ``skills`` (each a default skill) and ipykernel with
        its kernelspec installed by ``kernelspec install OPTIONS`` into ``world/jupyter-data``
        (``JUPYTER_DATA_DIR`` in the world's environment); its environment is this test's."""
        key = hashlib.sha256(repr((tuple(skills), tuple(options))).encode()).hexdigest()[:12]
        template = self.base / f"template-{key}"
        if key not in self._built:
            self._built[key] = self._build(template, skills, options)
        _check(template, self._built[key])
        _remove(self.live)  # the last test's world: its processes ended with it (no_kernel_left)
        world = self._make(self.live)
        _copy(template, self.live)
        world.env["JUPYTER_DATA_DIR"] = str(self.live / "jupyter-data")
        # Installed again, as the test's own: its home then holds what an install leaves there
        # (the warm fingerprint); the venv is built, so no uv runs.
        result = world.run("kernelspec", "install", *options, timeout=600)
        assert result.returncode == 0, result.stderr
        return world

    def _build(self, template: Path, skills: Sequence[str], options: Sequence[str]) -> Stamp:
        _remove(self.live)
        world = self._make(self.live)
        home = self.base / f"home-{template.name}"
        home.mkdir(exist_ok=True)
        world.env.update(_home(home))
        world.env["JUPYTER_DATA_DIR"] = str(self.live / "jupyter-data")
        world.write_config(requirements=["ipykernel>=6"])
        for name in skills:
            world.skill(name)
        result = world.run("kernelspec", "install", *options, timeout=600)
        assert result.returncode == 0, result.stderr
        left = [p.line for p in kernels.of_test(None, [self.live])]
        assert not left, f"building a kernel world left processes running: {left}"
        _refuse_home(self.live, home)
        os.rename(self.live, template)
        return _stamp(template)


def _home(home: Path) -> Mapping[str, str]:
    subs = ("", ".local/share", ".cache", ".config", ".local/state")
    return {var: str(home / sub) for var, sub in zip(_HOME_VARS, subs, strict=True)}


def _refuse_home(world: Path, home: Path) -> None:
    """A world that names its builder's home would lead every copy there: refuse it."""
    found = subprocess.run(["grep", "-rlF", "--exclude-dir=site-packages", str(home), str(world)],
                           capture_output=True, text=True, check=False).stdout.split()
    assert not found, f"a kernel world names the home it was built with: {found}"


def _stamp(template: Path) -> Stamp:
    """Inode, size and mtime of each file of the template's venvs."""
    stamp: Stamp = {}
    for venv in template.glob(f"{_GENERATION}*"):
        for top, _dirs, files in os.walk(venv):
            for name in files:
                path = os.path.join(top, name)
                st = os.lstat(path)
                stamp[path] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return stamp


def _check(template: Path, built: Stamp) -> None:
    now = _stamp(template)
    if now != built:
        changed = sorted(p for p in built.keys() | now.keys() if built.get(p) != now.get(p))
        raise AssertionError("a test rewrote a file of a kernel world's venv in place (its "
                             f"template shares it): {changed[:5]}")


def _copy(template: Path, live: Path) -> None:
    """``template``'s entries into ``live``: venvs as hard links, the rest copied (``cp -a``
    keeps modes, times and relative symlinks, as the world was left)."""
    entries = list(template.iterdir())
    venvs = [str(e) for e in entries if e.name.startswith(_GENERATION) and not e.is_symlink()]
    rest = [str(e) for e in entries if str(e) not in venvs]
    for link, chosen in ((True, venvs), (False, rest)):
        if chosen:
            subprocess.run(["cp", "-a", *(["-l"] if link else []), *chosen, str(live)],
                           check=True)


def _remove(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)

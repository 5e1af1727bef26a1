"""Finding uv and running it. Every failure is a :class:`~bootstrap.errors.UvError`."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bootstrap.env.network import ONLINE, Network
from bootstrap.errors import BootstrapError, UvError
from bootstrap.primitives import log, process


class UvNotFound(BootstrapError):
    pass


def find_uv() -> Path:
    """``$KERNEL_BOOTSTRAP_UV``, else ``uv`` on PATH, else the binary the ``uv`` package ships."""
    explicit = os.environ.get("KERNEL_BOOTSTRAP_UV")
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UvNotFound(
                f"KERNEL_BOOTSTRAP_UV={explicit} is not an executable file: point it at uv, or "
                "unset it to use uv from PATH or the bundled one (pip install uv)"
            )
        return path
    on_path = shutil.which("uv")
    if on_path:
        return Path(on_path)
    try:
        import uv as uv_package

        return Path(uv_package.find_uv_bin())
    except (ImportError, FileNotFoundError):
        raise UvNotFound(
            "uv not found: install it (`pip install uv`, or see https://docs.astral.sh/uv/) "
            "or set KERNEL_BOOTSTRAP_UV to its path"
        ) from None


def environment() -> dict[str, str]:
    """The environment every uv child (and every child that runs uv) gets."""
    extra = {"UV_NO_PROGRESS": "1"}
    # No network for interpreters on the machines we run on: a missing Python must fail fast
    # with uv's clear message, not hang on a download. The user's own setting wins.
    if "UV_PYTHON_DOWNLOADS" not in os.environ:
        extra["UV_PYTHON_DOWNLOADS"] = "never"
    return process.child_env(extra)


@dataclass(frozen=True)
class Uv:
    """A located uv plus the per-config arguments of every ``uv pip install``."""

    exe: Path
    install_args: tuple[str, ...] = ()
    # The user's uv arguments alone (index settings), without the runtime's constraints: for
    # build environments, which uv itself never constrains with --constraint either.
    build_args: tuple[str, ...] = ()
    # Whether uv may contact an index (bootstrap.env.network): asked by the calls that would.
    network: Network = ONLINE
    # `compile-bytecode`: every install into the venv compiles what it installs (see
    # bootstrap.env.bytecode); build environments are thrown away, so they never do.
    compile_bytecode: bool = True

    def run(self, *args: str | Path, what: str, index: bool = True,
            cwd: Path | None = None, env: Mapping[str, str] | None = None) -> process.Result:
        """``uv ARGS``; ``index``: the call may need an index, so it is made ``--offline``
        when the session is (a call that never needs one is, only when configured so);
        ``env``: added to :func:`environment`."""
        argv, what = self._offline(args, what, index)
        log.debug("uv", argv=[str(a) for a in argv])
        return process.run(self.exe, *argv, env={**environment(), **(env or {})}, what=what,
                           error=UvError, cwd=cwd)

    def _offline(self, args: Sequence[str | Path], what: str,
                 index: bool) -> tuple[list[str | Path], str]:
        if not (self.network.offline if index else self.network.configured):
            return list(args), what
        return [*args, *_once(args)], f"{what} (offline: nothing it lacks is in the cache)"

    def cached_first(self, *args: str | Path, what: str) -> process.Result:
        """``uv ARGS`` from the caches alone first, then, if they lack something and the
        session is not offline, from the index: for exact pins (a lock) and build
        requirements, any cached artifact that fits is the one the index would give."""
        if self.network.offline:
            return self.run(*args, what=what)
        try:
            return self.run(*args, *_once(args), what=what, index=False)
        except UvError as e:
            if self.network.offline:  # the check found no network: the index cannot help
                raise
            log.debug("the caches lack something; asking the index", error=e.tail)
        return self.run(*args, what=what)

    def create_venv(self, path: Path, python: str) -> None:
        # --relocatable: the venv is built beside the live one and renamed into place, so its
        # scripts must not embed the staging path.
        self.run("venv", "--quiet", "--relocatable", "--python", python, path,
                 what=f"uv could not create the venv at {path}", index=False)

    def install(self, python: Path, args: Sequence[str | Path], what: str,
                cwd: Path | None = None, env: Mapping[str, str] | None = None
                ) -> process.Result:
        """``cwd``: where uv runs, for skills it reaches only from beside them (a ``#``)."""
        return self.run(*self._install(python, args), what=what, cwd=cwd, env=env)

    def installing(self, python: Path, args: Sequence[str | Path],
                   what: str) -> contextlib.AbstractContextManager[None]:
        """:meth:`install` in the background, while the block runs (see process.background)."""
        argv, what = self._offline(self._install(python, args), what, True)
        log.debug("uv", argv=[str(a) for a in argv])
        return process.background(self.exe, *argv, env=environment(), what=what,
                                  error=UvError)

    def install_exact(self, python: Path, args: Sequence[str | Path], what: str) -> None:
        """:meth:`install` of exact pins with hashes: from the caches first (see
        :meth:`cached_first`), and without the constraints file, whose resolution is in the
        pins already (uv refuses unpinned constraint lines when hashes are required)."""
        self.cached_first(*self._install(python, args, constrained=False), what=what)

    def _install(self, python: Path, args: Sequence[str | Path], *,
                 constrained: bool = True) -> list[str | Path]:
        """The one ``uv pip install`` into a venv: every install gets ``--compile-bytecode``
        from here, unless the config turned it off (uv refuses it twice, so one in uv-args
        stands)."""
        options = self.install_args if constrained else self.build_args
        bytecode = ["--compile-bytecode"] if (
            self.compile_bytecode and "--compile-bytecode" not in options) else []
        return ["pip", "install", "--python", target(python), *bytecode, *options, *args]

    def uninstall(self, python: Path, projects: Sequence[str]) -> None:
        self.run("pip", "uninstall", "--python", target(python), *projects,
                 what=f"uv could not uninstall {', '.join(projects)}", index=False)


def target(python: Path) -> Path:
    """A venv's interpreter as uv must be told it: through the venv's real directory.

    uv caches what an interpreter reports (its prefix) under the path it was given. A
    generation's pin makes its interpreter report the generation's real path, so the stable
    ``<venv>/bin/python`` would stay cached with the previous generation's prefix after a
    flip, and uv would install there (recreating a removed generation's directories). Only
    the directory is resolved: ``bin/python`` itself links to the base interpreter.
    """
    return Path(os.path.realpath(python.parent)) / python.name


def _once(args: Sequence[str | Path]) -> tuple[str, ...]:
    """``--offline``, unless ``args`` has it already (from uv-args): uv refuses it twice."""
    return () if "--offline" in args else ("--offline",)


def make_uv(constraints: Path | None, uv_args: Sequence[str],
            network: Network = ONLINE, *, compile_bytecode: bool = True) -> Uv:
    args: list[str] = []
    if constraints is not None:
        args += ["--constraint", str(constraints)]
    return Uv(find_uv(), (*args, *uv_args), tuple(uv_args), network, compile_bytecode)

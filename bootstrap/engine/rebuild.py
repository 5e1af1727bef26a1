"""A rebuild: the runtime built beside the live venv, in a new generation (or a complete one a
killed session left adopted, or a snapshot of the same runtime restored), validated, its base
marker written, then put in place. ``ensure`` (``engine/ensure.py``) decides when.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Final

from bootstrap.config import Config
from bootstrap.env import generations, ready_check, record
from bootstrap.env.identity import identity_of, runtime_inputs
from bootstrap.env.marker import RuntimeRecord, SkillRecord, base_marker, write_marker
from bootstrap.env.uv import Uv
from bootstrap.env.venv import Venv, interpreter, is_venv, staging_path
from bootstrap.errors import BootstrapError, ConfigError, UvError
from bootstrap.primitives import log, process, progress
from bootstrap.primitives.atomic import DiskError
from bootstrap.primitives.fs import remove_quietly, remove_tree, removed_on_failure
from bootstrap.skills.sync import Riders, build_ahead, cached_riders

if TYPE_CHECKING:
    from bootstrap.engine import restore

CHECK_TIMEOUT: Final = ready_check.TIMEOUT


def rebuild(config: Config, uv: Uv, snapshots: restore.Plan | None = None, *,
            with_skills: bool = True, adopt: bool = True) -> tuple[RuntimeRecord, bool, list[str]]:
    """Build a new generation (or, without generations, a staged venv) beside the live one,
    validate it, write its base marker, put it in place (``env/generations.place``).

    ``adopt``: a complete generation of this runtime already beside the venv (a killed
    session's) is put in place instead. Restores the snapshot instead when the store has a
    usable one; the flag says which. ``with_skills``: skills may be built and installed along
    with the runtime (see :func:`_install_runtime`); the list names those installed (the base
    marker records them).
    """
    live = config.venv
    _refuse_foreign_directory(live)
    generations.convert(live)
    adopted = _adopted(config) if adopt else None
    if adopted is not None:
        return adopted, False, []
    if snapshots is not None and snapshots.available:
        progress.note("restoring a snapshot")
        restored = _restore(config, snapshots)
        if restored is not None:
            return restored, True, []
    staged = Venv.at(generations.build_path(live))
    skills: dict[str, SkillRecord] = {}
    with generations.removed_unless_current(live, staged.path):
        progress.step("creating the venv")
        uv.create_venv(staged.path, config.python)
        if config.lock is not None:
            progress.step(f"installing the pinned runtime from {config.lock.name}")
            from bootstrap.env import pins

            pins.install_locked(uv, staged.python, config.lock)
        elif config.requirements:
            skills = _install_runtime(config, uv, staged, with_skills)
        runtime = _checked(config, staged)
        # The base marker lands with the venv: a session killed during the skill sync leaves
        # a marker that says "runtime done", so the next one never rebuilds it.
        write_marker(staged.path, base_marker(runtime, skills, bytecode=uv.compile_bytecode))
        method = generations.place(live, staged.path)
    generations.remove_unused(live)
    log.info("runtime ready", venv=str(live), swap=method)
    return runtime, False, sorted(skills)


def _checked(config: Config, staged: Venv) -> RuntimeRecord:
    """The built generation pinned and validated: the runtime record its base marker gets."""
    progress.step("checking the new venv")
    # The RECORD check runs while the pin is installed (see record.checking); both are done
    # before validation's other checks, and all before the base marker.
    complete = record.checking(staged.path)
    generations.prepare(staged.path)
    found = complete()
    # uv cannot install into an interpreter without running it (it asks the interpreter for
    # its paths and markers): after the requirements landed, the bare "does it run" child
    # would only repeat that (15-60 ms, by load). A locked install runs it as well.
    ran = config.lock is not None or bool(config.requirements)
    return _runtime_record(config, _validate(staged, config, ran=ran, found=found))


def _adopted(config: Config) -> RuntimeRecord | None:
    """A complete generation of this runtime that a killed session left, put in place."""
    found = generations.adoptable(config)
    if found is None:
        return None
    log.info("adopting a complete generation left by an earlier session",
             generation=str(found[0]))
    generations.place(config.venv, found[0])
    generations.remove_unused(config.venv)
    return found[1]


def _install_runtime(config: Config, uv: Uv, staged: Venv,
                     with_skills: bool) -> dict[str, SkillRecord]:
    """Install the runtime's requirements; return the marker records of skills installed
    with them.

    ``with_skills``: the skills the build cache holds go into the same uv call, and the others
    are built (into that cache) while it runs; the sync then installs those without building.
    If the call with skills fails, the runtime is installed alone (its own error is then the
    one shown) and the skills are left to the sync, which finds the bad ones.
    """
    python = staged.python
    what = "uv could not install the requirements"
    log.info("installing the runtime", requirements=list(config.requirements))
    riders = cached_riders(config, uv, python) if with_skills else nullcontext(Riders())
    with riders as cached:
        progress.step(_runtime_step(config, cached))
        try:
            with uv.installing(python, [*config.requirements, *cached.args()], what=what):
                build_ahead(config, uv, python, cached.rest)
            return cached.landed(staged.path)
        except UvError as e:
            if not cached.skills:
                raise
            log.info("the runtime and the cached skills failed together; installing the "
                     "runtime alone", error=e.tail)
        _emptied(uv, staged, config.python)
        uv.install(python, list(config.requirements), what=what)
    return {}


def _emptied(uv: Uv, staged: Venv, python: str) -> None:
    """``staged`` made a new, empty venv again.

    A uv call that failed half-way through a package (a full disk) can leave its dist-info
    without its files, and uv takes a dist-info for "installed": the runtime-alone call that
    followed in the same venv skipped numpy, and a runtime without numpy's files was put in
    place (issue 31). The new venv costs one ``uv venv``, on this failure path only.
    """
    try:
        remove_tree(staged.path)
    except OSError as e:
        raise DiskError(f"could not empty the staged venv {staged.path} for a second attempt: "
                        f"{e.strerror or e}; the old venv is unchanged", e) from e
    uv.create_venv(staged.path, python)


def _runtime_step(config: Config, cached: Riders) -> str:
    text = f"installing the runtime ({log.counted(len(config.requirements), 'requirement')})"
    if cached.skills:
        text += f" and {log.counted(len(cached.skills), 'skill')} from the build cache"
    return text + (f"; building {log.counted(len(cached.rest), 'skill')}" if cached.rest else "")


def _runtime_record(config: Config, version: str) -> RuntimeRecord:
    inputs = runtime_inputs(config, version)
    return {"identity": identity_of(inputs), "inputs": dict(inputs),
            "python": str(interpreter(config.venv))}


def _restore(config: Config, snapshots: restore.Plan) -> RuntimeRecord | None:
    """Restore the snapshot into a new generation (through staging), validate it like a fresh
    build, put it in place.

    Anything wrong with it is a warning naming the archive and None: the caller builds.
    """
    from bootstrap.primitives.tar import BadArchive

    staging = staging_path(config.venv)
    target = generations.build_path(config.venv)
    try:
        with removed_on_failure(staging), generations.removed_unless_current(config.venv,
                                                                             target):
            venv = snapshots.extract(staging)
            if generations.is_generation(config.venv, target):  # out of the archive's tree
                os.rename(venv, target)
                generations.prepare(target)
                venv = target
            runtime = _runtime_record(config, _validate(Venv.at(venv), config))
            snapshots.claim_marker(venv, runtime)
            method = generations.place(config.venv, venv)
        generations.remove_unused(config.venv)
    except (BadArchive, BootstrapError) as e:
        log.warning("snapshot unusable; building the venv instead",
                    snapshot=str(snapshots.archive), error=str(e))
        return None
    remove_quietly(staging)
    log.info("runtime restored from snapshot", venv=str(config.venv),
             snapshot=str(snapshots.archive), swap=method)
    return runtime


def _refuse_foreign_directory(live: Path) -> None:
    if generations.supported() and generations.is_foreign_link(live):
        raise ConfigError(
            f"{live} is a symbolic link kernel-bootstrap did not make; refusing to replace it. "
            "Point `venv` (or KERNEL_BOOTSTRAP_VENV) at another path, or remove it yourself."
        )
    if live.is_dir() and not is_venv(live) and any(live.iterdir()):
        raise ConfigError(
            f"{live} exists and is not a virtual environment; refusing to replace it. "
            "Point `venv` (or KERNEL_BOOTSTRAP_VENV) at another path, or remove it yourself."
        )
    if live.exists() and not live.is_dir():
        raise ConfigError(f"{live} exists and is not a directory; point `venv` elsewhere")


def _validate(staged: Venv, config: Config, *, ran: bool = False,
              found: list[record.Damage] | None = None) -> str:
    """The staged venv's interpreter runs (``ran``: uv has just run it), its distributions
    are complete (``found``: what a RECORD check already found), the ready-check passes,
    scripts are relocatable."""
    python = staged.python
    # Bounded: we hold the lock, and a ready-check that never returns must not wedge every
    # later start behind us (the system we replace hung kernels for 17 minutes).
    if not ran:
        process.run(python, "-c", "import sys, site", timeout=CHECK_TIMEOUT,
                    what="the new venv's interpreter does not run")
    _complete(staged, record.damaged(staged.path) if found is None else found)
    if config.ready_check:
        ready_check.run(python, config.ready_check,
                        what="the ready-check failed in the new venv; the old venv is unchanged")
    # A console script names its interpreter in its first lines (a shebang, or uv's relocatable
    # sh launcher); one naming the staging path would break once the venv is swapped in.
    needle = str(staged.path).encode()
    for script in sorted(staged.scripts.iterdir()):
        if script.is_file() and needle in b"\n".join(_head(script, 2)):
            raise BootstrapError(
                f"{script.name} in the new venv refers to its staging path {staged.path}; it "
                "would not run after the venv is moved into place (is uv older than 0.5?)"
            )
    version = staged.version()
    if version is None:
        raise BootstrapError(f"the new venv at {staged.path} has no readable pyvenv.cfg")
    return version


def _complete(staged: Venv, found: list[record.Damage]) -> None:
    """Every distribution holds the files its RECORD lists, at their sizes (``found``: the
    ones that do not).

    Sizes, not hashes: a new runtime is what uv just wrote, and what goes missing when a
    write fails is whole files or their tails (a large runtime's ~1,000 files cost ~10 ms).
    """
    if found:
        raise record.Incomplete(
            f"the new venv at {staged.path} lacks files its packages installed "
            f"({record.summary(found)}); the old venv is unchanged. Was the disk full? Free "
            "space, then run `kernel-bootstrap ensure --retry`")


def _head(path: Path, lines: int) -> list[bytes]:
    with path.open("rb") as f:
        return [f.readline(1024) for _ in range(lines)]

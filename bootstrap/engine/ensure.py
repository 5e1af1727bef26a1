"""``ensure()``: make the environment ready, doing as little as the marker allows.

Read the marker without the lock; if everything it records is current, return the interpreter:
no uv, no writes, no child process. Otherwise take the lock and check again, since another
process may have finished the work while we waited. If the runtime is current, sync skills only.
Otherwise rebuild beside the live venv, in a new generation (or adopt one a killed session
completed, or restore a snapshot of the same runtime), write the base marker, flip the venv's
link to it, then sync skills. The interpreter path never changes across rebuilds.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Final

from bootstrap import warm
from bootstrap.config import Config
from bootstrap.engine.results import Action, EnsureResult
from bootstrap.engine.status import Status, status
from bootstrap.env import generations
from bootstrap.env.identity import identity_of, runtime_inputs
from bootstrap.env.marker import RuntimeRecord, SkillRecord, base_marker, write_marker
from bootstrap.env.requirements import validate_requirements
from bootstrap.env.uv import Uv, make_uv
from bootstrap.env.venv import (
    Venv,
    interpreter,
    interrupted_rebuild,
    is_venv,
    recover,
    staging_path,
)
from bootstrap.errors import BootstrapError, ConfigError, UvError
from bootstrap.primitives import lock, log, process, progress
from bootstrap.primitives.fs import remove_quietly, removed_on_failure
from bootstrap.skills.sync import Riders, build_ahead, cached_riders, sync_skills
from bootstrap.trees.skillmd import SKILL_FILE

if TYPE_CHECKING:
    from bootstrap.engine import restore

CHECK_TIMEOUT: Final = 300.0


def ensure(config: Config, *, lock_timeout: float = 300.0, force: bool = False,
           reinstall: frozenset[str] = frozenset()) -> EnsureResult:
    """Make ``config``'s environment ready and return its interpreter.

    ``force`` rebuilds the runtime even when it is current (``repair --force``); ``reinstall``
    names skills to reinstall even if uv believes them installed (``repair`` of a damaged one).
    """
    if config.override_python is not None:
        from bootstrap.engine.override import ensure_override

        return ensure_override(config)
    live = Venv.at(config.venv)
    config_stamps = warm.stamps(_config_paths(config))
    venv_stamps = warm.stamps(_venv_paths(live))
    found = status(config)
    # A plain-directory venv of an earlier release becomes a generation under the lock.
    if found.ready and not force and not reinstall and not generations.wants_conversion(
            config.venv):
        _remember(config, live, config_stamps + venv_stamps)
        return EnsureResult(found.python, config.venv, "ready")
    if force or not found.base_current:
        # Only a rebuild reads the requirements; a current runtime's were valid when it was
        # built (its identity covers them). Checked before the lock so nothing is created.
        validate_requirements(config)
        _require_current_lock(config)
    with lock.hold(lock.lock_path(config.venv), lock_timeout):
        # Only here, under the lock: a staging tree is a leftover only if its builder is gone.
        # One that is means a session died building the runtime: this one leaves the skills
        # out of that step (see _install_runtime), so that the runtime lands (and is recorded)
        # as soon as it can.
        cut_short = interrupted_rebuild(config.venv) or generations.interrupted(config.venv)
        recover(config.venv)
        generations.convert(config.venv)
        # Another process may have finished this while we waited for the lock.
        venv_stamps = warm.stamps(_venv_paths(live))
        found = status(config)
        if found.ready and not force and not reinstall:
            _remember(config, live, config_stamps + venv_stamps)
            return EnsureResult(found.python, config.venv, "ready")
        return _make_ready(config, live, found, force, reinstall, config_stamps,
                           with_skills=not cut_short)


def _make_ready(config: Config, live: Venv, found: Status, force: bool,
                reinstall: frozenset[str], config_stamps: list[tuple[str, str]], *,
                with_skills: bool) -> EnsureResult:
    """Under the lock: sync the skills, after a rebuild (or restore) if the runtime needs one."""
    uv = make_uv(config.constraints, config.uv_args)
    skills_step = 1 if (found.pending or reinstall or found.stray) else 0
    snapshots: restore.Plan | None = None
    restored = False
    rode: list[str] = []
    if found.base_current and not force and found.marker.data is not None:
        action: Action = "skills"
        runtime = found.marker.data["runtime"]
        generations.remove_unused(config.venv)  # a kill after a flip left the old one
        progress.start(skills_step)
    else:
        validate_requirements(config)  # cheap when done already; the state may have moved
        _require_current_lock(config)
        _say_why_rebuild(found, force)
        progress.start(2 + bool(config.requirements or config.lock) + skills_step)
        snapshots = _snapshot_plan(config, uv)
        action = "rebuild"
        runtime, restored, rode = rebuild(config, uv, snapshots, with_skills=with_skills,
                                          adopt=not force)
    outcome = sync_skills(config, uv, runtime, reinstall)
    outcome.installed[:0] = [n for n in rode if n not in outcome.installed]
    progress.finish("ready" if not outcome.failed
                    else f"ready; {len(outcome.failed)} skill(s) failed")
    if action == "rebuild" and snapshots and not restored and not outcome.failed:
        snapshots.save(config.venv)
    if not outcome.failed:
        # Under the lock nobody else changes the venv: these stamps are of our final write.
        _remember(config, live, config_stamps + warm.stamps(_venv_paths(live)))
    return EnsureResult(live.python, config.venv, action,
                        tuple(outcome.installed), outcome.failed, tuple(outcome.removed))


# The lock file and snapshot modules (with tarfile and tempfile, ~25 ms to import together) are
# imported only by configs that use them: a rebuild without them should not pay for them.


def _require_current_lock(config: Config) -> None:
    if config.lock is not None:
        from bootstrap.env import pins

        pins.require_current(config)


def _snapshot_plan(config: Config, uv: Uv) -> restore.Plan | None:
    if config.snapshots is None:
        return None
    from bootstrap.engine import restore

    return restore.plan(config, uv)


def _config_paths(config: Config) -> list[str]:
    """Everything outside the venv that the ready check reads."""
    paths = [config.path] if config.path else []
    if config.constraints:
        paths.append(config.constraints)
    if config.lock:
        paths.append(config.lock)
    paths += config.watch
    for skill in config.skills:
        paths += [skill.path, skill.path / SKILL_FILE, skill.pyproject]
    return list(dict.fromkeys(str(p) for p in paths))


def _venv_paths(venv: Venv) -> list[str]:
    return [str(venv.cfg), str(venv.marker), str(venv.python)]


def _remember(config: Config, venv: Venv, stamped: list[tuple[str, str]]) -> None:
    if config.path is not None:
        warm.save(str(config.path), str(venv.path), str(venv.python), stamped)


def _say_why_rebuild(found: Status, force: bool) -> None:
    if found.marker.state in ("corrupt", "legacy"):
        log.warning(found.marker.problem + "; rebuilding the venv", venv=str(found.venv))
    else:
        why = found.why or (["rebuild from scratch requested"] if force else [])
        log.info("building the runtime", venv=str(found.venv), why=why)


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
    adopted = _adopt(config) if adopt else None
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
        progress.step("checking the new venv")
        generations.prepare(staged.path)
        # uv cannot install into an interpreter without running it (it asks the interpreter
        # for its paths and markers): after the requirements landed, the bare "does it run"
        # child would only repeat that (15-60 ms, by load).
        ran = config.lock is None and bool(config.requirements)
        runtime = _runtime_record(config, _validate(staged, config, ran=ran))
        # The base marker lands with the venv: a session killed during the skill sync leaves
        # a marker that says "runtime done", so the next one never rebuilds it.
        write_marker(staged.path, base_marker(runtime, skills))
        method = generations.place(live, staged.path)
    generations.remove_unused(live)
    log.info("runtime ready", venv=str(live), swap=method)
    return runtime, False, sorted(skills)


def _adopt(config: Config) -> RuntimeRecord | None:
    """Put in place a complete generation of this runtime that an earlier session left."""
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
        uv.install(python, list(config.requirements), what=what)
    return {}


def _runtime_step(config: Config, cached: Riders) -> str:
    text = f"installing the runtime ({len(config.requirements)} requirements)"
    if cached.skills:
        text += f" and {len(cached.skills)} skills from the build cache"
    return text + (f"; building {len(cached.rest)} skills" if cached.rest else "")


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


def _validate(staged: Venv, config: Config, *, ran: bool = False) -> str:
    """The staged venv's interpreter runs (``ran``: uv has just run it), the ready-check
    passes, scripts are relocatable."""
    python = staged.python
    # Bounded: we hold the lock, and a ready-check that never returns must not wedge every
    # later start behind us (the system we replace hung kernels for 17 minutes).
    if not ran:
        process.run(python, "-c", "import sys, site", timeout=CHECK_TIMEOUT,
                    what="the new venv's interpreter does not run")
    if config.ready_check:
        process.run(python, "-c", config.ready_check, timeout=CHECK_TIMEOUT,
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


def _head(path: Path, lines: int) -> list[bytes]:
    with path.open("rb") as f:
        return [f.readline(1024) for _ in range(lines)]

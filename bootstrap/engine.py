"""``ensure()``: make the environment ready, doing as little as the marker allows.

Read the marker without the lock; if everything it records is current, return the interpreter:
no uv, no writes, no child process. Otherwise take the lock and check again, since another
process may have finished the work while we waited. If the runtime is current, sync skills only.
Otherwise rebuild beside the live venv (or restore a snapshot of the same runtime), write the
base marker, swap the new venv in, then sync skills. The interpreter path never changes across
rebuilds.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Final

from bootstrap import lock, log, process, progress, skillmd, warm
from bootstrap.config import Config
from bootstrap.errors import BootstrapError, ConfigError, UvError
from bootstrap.fs import remove_quietly, removed_on_failure
from bootstrap.identity import identity_of, runtime_inputs
from bootstrap.marker import RuntimeRecord, SkillRecord, base_marker, marker_path, write_marker
from bootstrap.readiness import Status, status
from bootstrap.requirements import validate_requirements
from bootstrap.results import Action, EnsureResult
from bootstrap.sync import Riders, build_ahead, cached_riders, sync_skills
from bootstrap.uv import Uv, make_uv
from bootstrap.venv import (
    interpreter,
    interrupted_rebuild,
    is_venv,
    python_version,
    recover,
    scripts_dir,
    staging_path,
    swap_into_place,
)

if TYPE_CHECKING:
    from bootstrap import snapshot

CHECK_TIMEOUT: Final = 300.0


def ensure(config: Config, *, lock_timeout: float = 300.0, force: bool = False,
           reinstall: frozenset[str] = frozenset()) -> EnsureResult:
    """Make ``config``'s environment ready and return its interpreter.

    ``force`` rebuilds the runtime even when it is current (``repair --force``); ``reinstall``
    names skills to reinstall even if uv believes them installed (``repair`` of a damaged one).
    """
    if config.override_python is not None:
        from bootstrap.override import ensure_override

        return ensure_override(config)
    config_stamps = warm.stamps(_config_paths(config))
    venv_stamps = warm.stamps(_venv_paths(config))
    found = status(config)
    # Once per full check (the warm path skips all of this until a skill changes).
    skillmd.report((s.name, s.spec) for s in config.skills)
    if found.ready and not force and not reinstall:
        _remember(config, config_stamps + venv_stamps)
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
        cut_short = interrupted_rebuild(config.venv)
        recover(config.venv)
        # Another process may have finished this while we waited for the lock.
        venv_stamps = warm.stamps(_venv_paths(config))
        found = status(config)
        if found.ready and not force and not reinstall:
            _remember(config, config_stamps + venv_stamps)
            return EnsureResult(found.python, config.venv, "ready")
        return _make_ready(config, found, force, reinstall, config_stamps,
                           with_skills=not cut_short)


def _make_ready(config: Config, found: Status, force: bool, reinstall: frozenset[str],
                config_stamps: list[tuple[str, str]], *, with_skills: bool) -> EnsureResult:
    """Under the lock: sync the skills, after a rebuild (or restore) if the runtime needs one."""
    uv = make_uv(config.constraints, config.uv_args)
    skills_step = 1 if (found.pending or reinstall or found.stray) else 0
    snapshots: snapshot.Plan | None = None
    restored = False
    rode: list[str] = []
    if found.base_current and not force and found.marker.data is not None:
        action: Action = "skills"
        runtime = found.marker.data["runtime"]
        progress.start(skills_step)
    else:
        validate_requirements(config)  # cheap when done already; the state may have moved
        _require_current_lock(config)
        _say_why_rebuild(found, force)
        progress.start(2 + bool(config.requirements or config.lock) + skills_step)
        snapshots = _snapshot_plan(config, uv)
        action = "rebuild"
        runtime, restored, rode = rebuild(config, uv, snapshots, with_skills=with_skills)
    outcome = sync_skills(config, uv, runtime, reinstall)
    outcome.installed[:0] = [n for n in rode if n not in outcome.installed]
    progress.finish("ready" if not outcome.failed
                    else f"ready; {len(outcome.failed)} skill(s) failed")
    if action == "rebuild" and snapshots and not restored and not outcome.failed:
        snapshots.save(config.venv)
    if not outcome.failed:
        # Under the lock nobody else changes the venv: these stamps are of our final write.
        _remember(config, config_stamps + warm.stamps(_venv_paths(config)))
    return EnsureResult(interpreter(config.venv), config.venv, action,
                        tuple(outcome.installed), outcome.failed, tuple(outcome.removed))


# The lock file and snapshot modules (with tarfile and tempfile, ~25 ms to import together) are
# imported only by configs that use them: a rebuild without them should not pay for them.


def _require_current_lock(config: Config) -> None:
    if config.lock is not None:
        from bootstrap import lockfile

        lockfile.require_current(config)


def _snapshot_plan(config: Config, uv: Uv) -> snapshot.Plan | None:
    if config.snapshots is None:
        return None
    from bootstrap import snapshot

    return snapshot.plan(config, uv)


def _config_paths(config: Config) -> list[str]:
    """Everything outside the venv that the ready check reads."""
    paths = [config.path] if config.path else []
    if config.constraints:
        paths.append(config.constraints)
    if config.lock:
        paths.append(config.lock)
    paths += config.watch
    for skill in config.skills:
        paths += [skill.path, skill.path / skillmd.SKILL_FILE, skill.pyproject]
    return list(dict.fromkeys(str(p) for p in paths))


def _venv_paths(config: Config) -> list[str]:
    venv = config.venv
    return [str(venv / "pyvenv.cfg"), str(marker_path(venv)), str(interpreter(venv))]


def _remember(config: Config, stamped: list[tuple[str, str]]) -> None:
    if config.path is not None:
        warm.save(str(config.path), str(config.venv), str(interpreter(config.venv)), stamped)


def _say_why_rebuild(found: Status, force: bool) -> None:
    if found.marker.state in ("corrupt", "legacy"):
        log.warning(found.marker.problem + "; rebuilding the venv", venv=str(found.venv))
    else:
        why = found.why or (["rebuild from scratch requested"] if force else [])
        log.info("building the runtime", venv=str(found.venv), why=why)


def rebuild(config: Config, uv: Uv, snapshots: snapshot.Plan | None = None, *,
            with_skills: bool = True) -> tuple[RuntimeRecord, bool, list[str]]:
    """Build a new venv beside the live one, validate it, write its base marker, swap it in.

    Restores the snapshot instead when the store has a usable one; the flag says which.
    ``with_skills``: skills may be built and installed along with the runtime (see
    :func:`_install_runtime`); the list names those installed (the base marker records them).
    """
    live = config.venv
    _refuse_foreign_directory(live)
    if snapshots is not None and snapshots.available:
        progress.note("restoring a snapshot")
        restored = _restore(config, snapshots)
        if restored is not None:
            return restored, True, []
    staged = staging_path(live)
    skills: dict[str, SkillRecord] = {}
    with removed_on_failure(staged):
        progress.step("creating the venv")
        uv.create_venv(staged, config.python)
        if config.lock is not None:
            progress.step(f"installing the pinned runtime from {config.lock.name}")
            from bootstrap import lockfile

            lockfile.install_locked(uv, interpreter(staged), config.lock)
        elif config.requirements:
            skills = _install_runtime(config, uv, staged, with_skills)
        progress.step("checking the new venv")
        # uv cannot install into an interpreter without running it (it asks the interpreter
        # for its paths and markers): after the requirements landed, the bare "does it run"
        # child would only repeat that (15-60 ms, by load).
        ran = config.lock is None and bool(config.requirements)
        runtime = _runtime_record(config, _validate(staged, config, ran=ran))
        # The base marker lands with the venv: a session killed during the skill sync leaves
        # a marker that says "runtime done", so the next one never rebuilds it.
        write_marker(staged, base_marker(runtime, skills))
        method = swap_into_place(staged, live)
    log.info("runtime ready", venv=str(live), swap=method)
    return runtime, False, sorted(skills)


def _install_runtime(config: Config, uv: Uv, staged: Path,
                     with_skills: bool) -> dict[str, SkillRecord]:
    """Install the runtime's requirements; return the marker records of skills installed
    with them.

    ``with_skills``: the skills the build cache holds go into the same uv call, and the others
    are built (into that cache) while it runs; the sync then installs those without building.
    If the call with skills fails, the runtime is installed alone (its own error is then the
    one shown) and the skills are left to the sync, which finds the bad ones.
    """
    python = interpreter(staged)
    what = "uv could not install the requirements"
    log.info("installing the runtime", requirements=list(config.requirements))
    riders = cached_riders(config, uv, python) if with_skills else nullcontext(Riders())
    with riders as cached:
        progress.step(_runtime_step(config, cached))
        try:
            with uv.installing(python, [*config.requirements, *cached.args()], what=what):
                build_ahead(config, uv, python, cached.rest)
            return cached.adopt(staged)
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


def _restore(config: Config, snapshots: snapshot.Plan) -> RuntimeRecord | None:
    """Restore the snapshot into staging, validate it like a fresh build, swap it in.

    Anything wrong with it is a warning naming the archive and None: the caller builds.
    """
    from bootstrap.archive import BadSnapshot

    staging = staging_path(config.venv)
    try:
        with removed_on_failure(staging):
            venv = snapshots.extract(staging)
            runtime = _runtime_record(config, _validate(venv, config))
            snapshots.adopt_marker(venv, runtime)
            method = swap_into_place(venv, config.venv)
    except (BadSnapshot, BootstrapError) as e:
        log.warning("snapshot unusable; building the venv instead",
                    snapshot=str(snapshots.archive), error=str(e))
        return None
    remove_quietly(staging)
    log.info("runtime restored from snapshot", venv=str(config.venv),
             snapshot=str(snapshots.archive), swap=method)
    return runtime


def _refuse_foreign_directory(live: Path) -> None:
    if live.is_dir() and not is_venv(live) and any(live.iterdir()):
        raise ConfigError(
            f"{live} exists and is not a virtual environment; refusing to replace it. "
            "Point `venv` (or KERNEL_BOOTSTRAP_VENV) at another path, or remove it yourself."
        )
    if live.exists() and not live.is_dir():
        raise ConfigError(f"{live} exists and is not a directory; point `venv` elsewhere")


def _validate(staged: Path, config: Config, *, ran: bool = False) -> str:
    """The staged venv's interpreter runs (``ran``: uv has just run it), the ready-check
    passes, scripts are relocatable."""
    python = interpreter(staged)
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
    needle = str(staged).encode()
    for script in sorted(scripts_dir(staged).iterdir()):
        if script.is_file() and needle in b"\n".join(_head(script, 2)):
            raise BootstrapError(
                f"{script.name} in the new venv refers to its staging path {staged}; it would "
                "not run after the venv is moved into place (is uv older than 0.5?)"
            )
    version = python_version(staged)
    if version is None:
        raise BootstrapError(f"the new venv at {staged} has no readable pyvenv.cfg")
    return version


def _head(path: Path, lines: int) -> list[bytes]:
    with path.open("rb") as f:
        return [f.readline(1024) for _ in range(lines)]

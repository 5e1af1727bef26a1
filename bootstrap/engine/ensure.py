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
from typing import TYPE_CHECKING

from bootstrap import fingerprint, warm
from bootstrap.config import Config, Skill
from bootstrap.engine.rebuild import rebuild
from bootstrap.engine.results import Action, EnsureResult
from bootstrap.engine.status import Status, status
from bootstrap.env import bytecode, generations
from bootstrap.env.marker import RuntimeRecord
from bootstrap.env.network import Network
from bootstrap.env.requirements import validate_requirements
from bootstrap.env.uv import Uv, make_uv
from bootstrap.env.venv import (
    Venv,
    interrupted_rebuild,
    rebuild_record,
    recover,
)
from bootstrap.errors import EXIT_FAILED, BootstrapError
from bootstrap.primitives import lock, log, progress
from bootstrap.skills import backoff
from bootstrap.skills.sync import sync_skills
from bootstrap.trees import skillmd

if TYPE_CHECKING:
    from bootstrap.engine import restore



def ensure(config: Config, *, lock_timeout: float = 300.0, force: bool = False,
           reinstall: frozenset[str] = frozenset(), retry: bool = False,
           why: tuple[str, ...] = (), locked: bool = False) -> EnsureResult:
    """Make ``config``'s environment ready and return its interpreter.

    ``force`` rebuilds the runtime even when it is current (``repair --force``, or a problem
    ``repair`` found, which ``why`` names for the log); ``reinstall`` names skills to reinstall
    even if uv believes them installed (``repair`` of a damaged one); ``retry`` retries every
    failure now, backing off or not (``ensure --retry``, ``repair``). Git sources are locked,
    fetched and checked first (bootstrap.sources.prepare; ``locked``: the skills lock must
    match them already).
    """
    if config.override_python is not None:
        from bootstrap.engine.override import ensure_override

        return ensure_override(config)
    if config.git_sources or locked or (
            config.skills_lock is not None and os.path.isfile(config.skills_lock)):
        from bootstrap.engine import sources

        prepared, failed = sources.prepare(config, locked=locked)
        result = _ensure(prepared, lock_timeout=lock_timeout, force=force,
                         reinstall=reinstall, retry=retry, why=why)
        return sources.merged(result, failed, config)
    return _ensure(config, lock_timeout=lock_timeout, force=force, reinstall=reinstall,
                   retry=retry, why=why)


def _ensure(config: Config, *, lock_timeout: float, force: bool, reinstall: frozenset[str],
            retry: bool, why: tuple[str, ...]) -> EnsureResult:
    live = Venv.at(config.venv)
    config_stamps = fingerprint.input_stamps(_config_paths(config))
    venv_stamps = fingerprint.stamps(_venv_paths(live))
    vouched = _vouched(config)
    found = status(config, vouched=vouched)
    # Once per full check (the warm path skips all of this until a skill changes).
    skillmd.report((s.name, s.spec) for s in config.skills if _skill_md(s) not in vouched)
    # A plain-directory venv of an earlier release becomes a generation under the lock.
    if _nothing_due(found, force, reinstall, retry) and not generations.wants_conversion(
            config.venv):
        return _settled(config, live, found, config_stamps + venv_stamps)
    if force or not found.base_current:
        backoff.refuse_rebuild(config, found.rebuild, config_stamps + venv_stamps,
                               retry=force or retry)
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
        venv_stamps = fingerprint.stamps(_venv_paths(live))
        found = status(config)
        if _nothing_due(found, force, reinstall, retry):
            return _settled(config, live, found, config_stamps + venv_stamps)
        if not found.base_current:
            backoff.refuse_rebuild(config, found.rebuild, [], retry=force or retry)
        return _make_ready(config, live, found, (force, reinstall, retry), config_stamps,
                           with_skills=not cut_short, why=why)


# SKILL.md files vouched for in this process, and their stamps then: a library caller's later
# ensure() calls cost a stat per skill, not a read of the fingerprint and a stat of all it holds.
_VOUCHED: dict[str, str] = {}


def _vouched(config: Config) -> frozenset[str]:
    """The SKILL.md files of ``config`` that the warm fingerprint vouches for: it holds, it
    stamped them (unchanged since a full check found them breaking no rule) and does not
    record their skills as invalid. Their check is skipped: parsing them imported PyYAML
    (~20 ms) into every process that called ``ensure()``, though the answer was warm."""
    files = {s.name: _skill_md(s) for s in config.skills}
    stamps = {path: warm.stamp(path) for path in files.values()}  # before the fingerprint's
    known = {path for path, stamp in stamps.items() if _VOUCHED.get(path) == stamp}
    held = None
    if len(known) < len(stamps) and config.path is not None:
        held = warm.holds(str(config.path))
    if held is not None:
        invalid = {name for name, _ in held[3]}
        for name, path in files.items():
            if name not in invalid and path in held[5] and stamps[path] != "-":
                _VOUCHED[path] = stamps[path]
                known.add(path)
    return frozenset(known)


def _skill_md(skill: Skill) -> str:
    return os.path.join(skill.path, skillmd.SKILL_FILE)  # a stat's worth: not pathlib's ~10 µs


def _nothing_due(found: Status, force: bool, reinstall: frozenset[str], retry: bool) -> bool:
    """Ready, or ready but for failed skills backing off (and no retry asked for)."""
    return (found.settled and not force and not reinstall
            and not (retry and any(s.state == "failed" for s in found.skills)))


def _settled(config: Config, live: Venv, found: Status,
             stamped: list[tuple[str, str]]) -> EnsureResult:
    """The answer when nothing is due: each failure backing off is warned about and reported,
    as is each invalid skill (warned about by skillmd.report already)."""
    _remember(config, live, stamped, found)
    failed = {}
    for skill in found.backed_off:
        assert skill.failure is not None
        backoff.warn_backed_off(skill.name, skill.failure)
        failed[skill.name] = skill.failure.error
    failed.update({s.name: s.error or "" for s in found.invalid})
    return EnsureResult(found.python, config.venv, "ready", failed=failed)


def _make_ready(config: Config, live: Venv, found: Status,
                asked: tuple[bool, frozenset[str], bool], config_stamps: list[tuple[str, str]],
                *, with_skills: bool, why: tuple[str, ...] = ()) -> EnsureResult:
    """Under the lock: sync the skills, after a rebuild (or restore) if the runtime needs one.

    ``asked``: ``force``, ``reinstall`` and ``retry`` as :func:`ensure` took them."""
    force, reinstall, retry = asked
    # Only here, on the cold path, is the network asked about, and only the first uv call
    # that needs an index waits for the answer.
    network = Network(config.offline, config.uv_args)
    network.start()
    uv = make_uv(config.constraints, config.uv_args, network,
                 compile_bytecode=config.compile_bytecode)
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
        _say_why_rebuild(found, force, why)
        progress.start(2 + bool(config.requirements or config.lock) + skills_step)
        snapshots = _snapshot_plan(config, uv)
        action = "rebuild"
        runtime, restored, rode = _rebuild_noted(config, live, uv, snapshots, with_skills,
                                                 config_stamps, adopt=not force)
    # Before the sync: what it installs is compiled (or not) by its own uv call already.
    bytecode.settle(config)
    outcome = sync_skills(config, uv, runtime, reinstall, retry=retry)
    outcome.installed[:0] = [n for n in rode if n not in outcome.installed]
    progress.finish("ready" if not outcome.failed
                    else f"ready; {len(outcome.failed)} skill(s) failed")
    if action == "rebuild" and snapshots and not restored and not outcome.failed:
        snapshots.save(config.venv)
    # Under the lock nobody else changes the venv: these stamps are of our final write. With
    # failures, the start is warm only while each of them backs off.
    after = None if not outcome.failed else status(config)
    if after is None or after.settled:
        _remember(config, live, config_stamps + fingerprint.stamps(_venv_paths(live)), after)
    return EnsureResult(live.python, config.venv, action,
                        tuple(outcome.installed), outcome.failed, tuple(outcome.removed))


def _rebuild_noted(config: Config, live: Venv, uv: Uv, snapshots: restore.Plan | None,
                   with_skills: bool, config_stamps: list[tuple[str, str]], *,
                   adopt: bool = True) -> tuple[RuntimeRecord, bool, list[str]]:
    """:func:`rebuild`, its failure recorded so that the next starts back off (a usage error
    is not recorded: it is fixed by editing the config, which retries anyway)."""
    try:
        built = rebuild(config, uv, snapshots, with_skills=with_skills, adopt=adopt)
    except (BootstrapError, OSError) as e:
        if not isinstance(e, BootstrapError) or e.exit_code == EXIT_FAILED:
            failure = backoff.note_rebuild_failure(config, str(e))
            if failure is not None and failure.backing_off:
                log.info("the rebuild failed again; the next starts do not retry it before "
                         "retry_at", retry_at=backoff.iso(failure.retry_at),
                         failures=failure.failures)
                # The venv is as it was, but for the record: the next start answers warm.
                stamped = config_stamps + fingerprint.stamps(_venv_paths(live))
                backoff.remember_refusal(config, failure, stamped)
        raise
    backoff.clear_rebuild_failure(config.venv)
    return built


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
    if config.git_sources and config.skills_lock:
        # Its entries choose the git skills' trees: an edit (another commit, a stale entry)
        # must send the next start the long way, which reads it.
        paths.append(config.skills_lock)
    paths += config.watch
    for skill in config.skills:
        paths += [skill.path, skill.path / skillmd.SKILL_FILE, skill.pyproject]
    return list(dict.fromkeys(str(p) for p in paths))


def _venv_paths(venv: Venv) -> list[str]:
    return [str(venv.cfg), str(venv.marker), str(venv.python), str(rebuild_record(venv.path))]


def _remember(config: Config, venv: Venv, stamped: list[tuple[str, str]],
              found: Status | None = None) -> None:
    """Save the warm fingerprint; with failures backing off (``found``), it records them and
    holds only until the first of them is due."""
    if config.path is None:
        return
    failures = [(s.name, s.failure) for s in (found.backed_off if found else []) if s.failure]
    failed = tuple((name, f.failures, backoff.iso(f.retry_at), f.error) for name, f in failures)
    until = min((f.retry_at for _, f in failures), default=None)
    invalid = tuple((s.name, s.error or "") for s in (found.invalid if found else []))
    fingerprint.save(str(config.path), str(venv.path), str(venv.python), stamped, failed, until,
                     invalid=invalid, kernel_server=config.kernel_server)


def _say_why_rebuild(found: Status, force: bool, asked: tuple[str, ...]) -> None:
    if found.marker.state in ("corrupt", "legacy"):
        log.warning(found.marker.problem + "; rebuilding the venv", venv=str(found.venv))
    else:
        why = found.why or list(asked) or (["rebuild from scratch requested"] if force else [])
        log.info("building the runtime", venv=str(found.venv), why=why)

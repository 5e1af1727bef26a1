"""``kernel-bootstrap status``: what is wrong and why; strictly read-only."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bootstrap.config import Config, load_config
from bootstrap.engine.status import SkillStatus, Status
from bootstrap.engine.status import status as read_status
from bootstrap.env import generations
from bootstrap.env.venv import python_version
from bootstrap.errors import EXIT_FAILED, EXIT_OK, EXIT_SKILLS_FAILED, BootstrapError
from bootstrap.primitives.lock import LockInfo, inspect
from bootstrap.skills.backoff import Failure, iso


def status(config_path: Path | None, *, as_json: bool, verbose: bool = False) -> int:
    """0 ready, 3 ready but a skill failed (what ``ensure --strict`` exits with), 1 not ready.
    ``verbose``: each failed skill's whole error under its line."""
    try:
        config = load_config(config_path)
    except BootstrapError as e:
        if as_json:
            # A program reading `status --json` always gets its object, even for a config it
            # cannot use (a venv path too long to create, a typo in a key); stderr and the
            # exit code (2) say the same as for any other command.
            print(json.dumps({"ready": False, "error": str(e)}))
        raise
    found = read_status(config)
    held = inspect(config.venv)
    snapshot = snapshot_info(config)
    lockfile = lockfile_info(config)
    generation = generations.describe(config.venv)
    server = kernel_server(config.venv)
    where = skill_places(config)
    if as_json:
        data = status_dict(found, held)
        data["skills"] = [{**s, **where.get(s["name"], {})} for s in data["skills"]]
        print(json.dumps({**data, **lockfile, "snapshot": snapshot,
                          "generation": generation, "kernel_server": server}))
    else:
        briefly = {name: f"git {w['source']['git']}@{w['source']['commit'][:12]}"
                   for name, w in where.items() if "source" in w}
        text = _with_generations(_with_origin(render(found, held, briefly, verbose=verbose),
                                              config), generation)
        text = _with_kernel_server(text, server)
        if lockfile:
            text = _with_lockfile(text, config, lockfile["lockfile"])
        print(text)
        if snapshot["store"]:
            exists = {True: "one exists", False: "none yet", None: "unknown"}[snapshot["exists"]]
            print(f"snapshot: {exists} for this runtime in {snapshot['store']}")
    if not found.ready:
        return EXIT_FAILED
    return EXIT_SKILLS_FAILED if found.failed else EXIT_OK


def snapshot_info(config: Config) -> dict[str, Any]:
    """Whether the store holds a snapshot for the current key; read-only, no child process."""
    if config.snapshots is None:
        return {"store": None, "key": None, "exists": None}
    from bootstrap.config import default_python
    from bootstrap.env.platform import is_running_interpreter, local_platform
    from bootstrap.snapshots.cloud import Unavailable
    from bootstrap.snapshots.store import offline_bucket, open_store, snapshot_key

    version = python_version(config.venv)
    # Resolved, as a rebuild resolves it (snapshot.platform_of): a venv's bin/python spelling
    # our own interpreter once left a fresh sandbox with "key": null.
    if version is None and (config.python == default_python()
                            or is_running_interpreter(config.python)):
        version = ".".join(map(str, sys.version_info[:3]))
    if version is None:
        return {"store": str(config.snapshots), "key": None, "exists": None}
    key = snapshot_key(config, local_platform(version))
    if offline_bucket(config):  # offline: not asked, as a rebuild would not ask it
        return {"store": str(config.snapshots), "key": key, "exists": None}
    try:
        exists = open_store(config.snapshots).has(key)  # a bucket: one bounded HEAD
    except Unavailable:  # the bucket cannot be asked without the cloud extra
        exists = None
    return {"store": str(config.snapshots), "key": key, "exists": exists}


def lockfile_info(config: Config) -> dict[str, str]:
    """``{"lockfile": current | stale | missing}``; empty when no lock is configured."""
    if config.lock is None:
        return {}
    from bootstrap.env.pins import known_resolution, state

    return {"lockfile": state(config, known_resolution(config))}


def _with_origin(text: str, config: Config) -> str:
    """The venv line says where the path came from when the config does not name it: two
    projects once shared the default venv without either config saying so."""
    if config.venv_from == "config":
        return text
    origin = "this config's default" if config.venv_from == "default" else config.venv_from
    first, _, rest = text.partition("\n")
    return f"{first} ({origin})\n{rest}"


def _with_generations(text: str, generation: dict[str, Any]) -> str:
    if generation["current"] is None and not generation["others"]:
        return text  # a plain-directory venv (or none yet): nothing to say
    *lines, verdict = text.splitlines()
    lines.append(f"generation: {generation['current'] or 'none (a plain directory)'}")
    lines += [f"  older:  {g['path']} ({'in use' if g['in_use'] else 'unused; gc removes it'})"
              for g in generation["others"]]
    return "\n".join([*lines, verdict])


def kernel_server(venv: Path) -> dict[str, Any] | None:
    """What the venv's live kernel server says of itself (asked over its socket, 1 s at most):
    ``{pid, generation, started, kernels_started, spares, kernels, detached, serving,
    not_serving, spare_pids}`` (``kernels``: the pids of the kernels it serves now); None when
    none answers."""
    from bootstrap.kernels.info import describe

    return describe(venv)


def _with_kernel_server(text: str, server: dict[str, Any] | None) -> str:
    *lines, verdict = text.splitlines()
    lines.append("kernel server: none" if server is None else
                 f"kernel server: pid {server['pid']}, generation {server['generation']}, "
                 f"{server['kernels_started']} kernels started")
    if server is not None and "kernels" in server:  # pids, for `kill` or `ps -p`
        lines.append("  kernels running: " + (" ".join(map(str, server["kernels"])) or "none"))
    if server is not None and "spare_pids" in server:
        lines.append("  spares ready: " + (" ".join(map(str, server["spare_pids"])) or "none"))
    if server is not None and server.get("not_serving"):
        lines.append(f"  not serving: {server['not_serving']}")
    return "\n".join([*lines, verdict])


def _with_lockfile(text: str, config: Config, state: str) -> str:
    # Just above the verdict, whose advice must come first when the lock is what is wrong.
    *lines, verdict = text.splitlines()
    lines.append(f"lock file: {state} ({config.lock})")
    if state != "current" and not verdict.startswith("ready:   yes"):
        verdict = "ready:   no; run `kernel-bootstrap lock`, then `kernel-bootstrap ensure`"
    return "\n".join([*lines, verdict])


def skill_places(config: Config) -> dict[str, dict[str, Any]]:
    """Each configured skill's ``path`` (a git skill's: its materialised tree) and, for a git
    skill, its ``source`` as the skills lock pins it (the URL without credentials)."""
    out: dict[str, dict[str, Any]] = {s.name: {"path": str(s.path)} for s in config.skills}
    if not config.git_sources or config.skills_lock is None:
        return out
    from bootstrap.sources import lockfile
    from bootstrap.sources.paths import tree_path

    keys = {lockfile.source_key(s) for s in config.git_sources}
    for e in lockfile.read(config.skills_lock):
        place = out.get(e.name)
        if e.source_key in keys and place and place["path"] == str(tree_path(e.sha256, e.name)):
            place["source"] = {"git": e.git, "commit": e.commit, "sha256": e.sha256}
    return out


def status_dict(found: Status, held: LockInfo) -> dict[str, Any]:
    rebuild = {"rebuild": found.rebuild.as_json()} if found.rebuild is not None else {}
    return {
        "ready": found.ready,
        "venv": str(found.venv),
        "python": str(found.python),
        "marker": found.marker.state,
        "runtime": found.runtime,
        "why": found.why,
        **rebuild,
        "skills": [_skill_dict(s) for s in found.skills],
        "stray": list(found.stray),
        "lock": {"held": held.held, "pid": held.pid},
    }


def _skill_dict(skill: SkillStatus) -> dict[str, Any]:
    entry = {"name": skill.name, "python": skill.python, "state": skill.state,
             "error": skill.error, "warnings": list(skill.warnings)}
    # A failed skill also says how many times in a row, and when it is retried.
    return {**entry, **skill.failure.as_json()} if skill.failure is not None else entry


def render(found: Status, held: LockInfo, sources: dict[str, str] | None = None, *,
           verbose: bool = False) -> str:
    """The text status; ``sources``: skill name -> where it comes from, said briefly;
    ``verbose``: each failed skill's whole error, indented under its line."""
    lines = [
        f"venv:    {found.venv}",
        f"python:  {found.python}",
        f"marker:  {found.marker.state}" + (f" ({found.marker.problem})"
                                            if found.marker.problem else ""),
        f"runtime: {found.runtime}" + (f" ({'; '.join(found.why)})" if found.why else ""),
        # Not "lock:": that word is the lock file's (the pins) on the line below it.
        "busy:    " + (f"yes, pid {held.pid} holds the venv's lock (ensure, repair or gc)"
                       if held.held and held.pid else "yes, the venv's lock is held"
                       if held.held else "no"),
    ]
    if found.rebuild is not None:
        lines.insert(4, f"rebuild: failed ({_when(found.rebuild)}): "
                        f"{summary(found.rebuild.error)}")
    if found.skills or found.stray:  # a stray skill alone still goes under its heading
        lines.append("skills:")
    if found.skills:
        width = max(len(s.name) for s in found.skills)
        for s in found.skills:
            kind = "python" if s.python else "plain"
            error = f"  {summary(s.error)}" if s.error else ""
            error += f" ({_when(s.failure)})" if s.failure else ""
            error += " (still installed: `kernel-bootstrap ensure` uninstalls it)" \
                if s.still_installed else ""
            origin = f"  {sources[s.name]}" if sources and s.name in sources else ""
            lines.append(f"  {s.name:<{width}}  {s.state:<9}  {kind}{origin}{error}")
            if verbose and s.error and s.error.strip() != summary(s.error):
                lines += [f"  {'':<{width}}    {line}" for line in s.error.strip().splitlines()]
            lines += [f"  {'':<{width}}  warning: {w}" for w in s.warnings]
    for name in found.stray:
        lines.append(f"  {name}  recorded but no longer configured (ensure uninstalls it)")
    lines.append(f"ready:   {_verdict(found)}")
    return "\n".join(lines)


def _verdict(found: Status) -> str:
    if not found.ready:
        return f"no; run {_next(found)}"
    if not found.failed:
        return "yes"
    names = ", ".join(s.name for s in found.failed)
    ensure = f"`kernel-bootstrap ensure{' --retry' if found.backed_off else ''}`"
    return (f"yes, without the failed skill(s) {names} (exit 3); after fixing them, run "
            f"{ensure} or `kernel-bootstrap repair`")


def _when(failure: Failure) -> str:
    times = "once" if failure.failures == 1 else f"{failure.failures} times"
    due = (f"next try after {iso(failure.retry_at)}" if failure.backing_off
           else "retried at the next start")
    return f"{times}; {due}"


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else text


def summary(error: str) -> str:
    """An error on one line: for a resolver's, uv's ``error:`` line and what its first cause
    could not find (its last line, ``And because only x==0.1.0 is available...``, named only
    the skill); else the last line (a build's exception, a download's cause)."""
    lines = [line.strip() for line in error.strip().splitlines()]
    head = next((line for line in lines if line.startswith("error:")), None)
    cause = next((line for line in lines if line.startswith("cause: Because ")), None)
    if head is None or cause is None:
        return _last_line(error)
    # "Because X was not found in Y and Z depends on X, we can conclude ...": "X was not ..."
    gist = cause.removeprefix("cause: Because ").split(" and ")[0].split(", we can")[0]
    return f"{head.removeprefix('error:').strip()}: {gist}"


def _next(found: Status) -> str:
    """What to run next, each command in backticks (one too many used to close the hint)."""
    if found.rebuild is not None and found.rebuild.backing_off:
        return "`kernel-bootstrap ensure --retry` after fixing what made the rebuild fail"
    # A plain `ensure` does not retry a failure backing off: it would answer at once.
    ensure = f"`kernel-bootstrap ensure{' --retry' if found.backed_off else ''}`"
    if any(s.state == "failed" for s in found.skills):
        return f"`kernel-bootstrap repair` after fixing the failed skills, or {ensure}"
    return ensure

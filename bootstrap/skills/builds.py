"""Editable builds of many skills in one backend process, installed by uv as wheels.

uv builds each editable with two fresh interpreters running the backend's hooks
(``get_requires_for_build_editable``, then ``build_editable``); for a hatchling skill that is
~0.33 s of CPU, nearly all of it importing hatchling, for a wheel of four small files. With
8 skills on 2 cores that was 1.6 s of a 2.3 s cold start. Here the skills that share a build
backend and build requirements are built by one interpreter in one build environment (which
uv creates and fills from its cache, as it would its own): 8 skills in ~0.3 s. uv then installs
the wheels, resolving the skills' dependencies in the same single call as before.

What uv records for an editable it built itself is written afterwards, so the venv looks as if
uv had done it all: ``direct_url.json`` says editable at the skill's directory (PEP 610), and
``uv_cache.json`` carries the timestamps uv's freshness check compares, so a later
``uv pip install -r`` with ``-e`` lines is a no-op, as it would be. That file is uv's own
record; if our copy ever differs from what uv computes, uv sees a stale editable and rebuilds
it, which is what happens without it.

Only backends known to be safe to call repeatedly in one process are batched (an in-tree
backend, ``backend-path``, never is); anything this cannot build, it leaves out, and uv builds
it the usual way and reports its own errors. ``KERNEL_BOOTSTRAP_BATCH_BUILDS=0`` turns it off,
and the build cache with it (bootstrap.skills.buildcache): with it on, a skill built before is taken
from the cache and no build environment or backend process is started for it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from bootstrap.env.uv import Uv, environment
from bootstrap.env.venv import Venv, python_version
from bootstrap.errors import BootstrapError
from bootstrap.primitives import log, process
from bootstrap.primitives.atomic import write_atomic
from bootstrap.primitives.fs import birth_time_ns, read_state_file, removed_on_exit
from bootstrap.skills import buildcache
from bootstrap.skills.buildcache import Cache
from bootstrap.skills.python_skill import PythonSkill

# Verified here to build many projects in one process with the same result as uv's own builds.
BATCHED_BACKENDS: Final = frozenset({"hatchling.build"})
# Without the build cache, one skill gains nothing: the build environment and one backend
# start cost what uv's do. With it, one skill is built here too, to be kept.
MIN_BATCH: Final = 2
_WORKER: Final = Path(__file__).with_name("_build_worker.py")
_SWITCH: Final = "KERNEL_BOOTSTRAP_BATCH_BUILDS"
# uv's default cache keys for a local project (its `tool.uv.cache-keys` default).
_CACHE_KEY_FILES: Final = ("pyproject.toml", "setup.py", "setup.cfg")


# (the build cache, the skills this module builds, their cache keys)
_Keyed = tuple[Cache | None, list[PythonSkill], dict[str, str]]


def enabled() -> bool:
    return os.environ.get(_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def build(skills: Sequence[PythonSkill], uv: Uv, python: Path,
          workdir: Path) -> dict[str, Path]:
    """Editable wheels for the skills that can be batched: {skill name: wheel path}.

    ``python`` is the managed venv's interpreter (the build uses the same Python). Wheels
    come from the build cache when it has them; the others are built and go into it. Whatever
    is missing from the answer is for uv to build; this never raises for a skill's sake.
    """
    found = _keyed(skills, uv, python)
    return _fill(found, uv, python, workdir) if found is not None else {}


def _fill(found: _Keyed, uv: Uv, python: Path, workdir: Path) -> dict[str, Path]:
    cache, batchable, keys = found
    wheels = _from_cache(cache, batchable, keys, workdir)
    misses = [s for s in batchable if s.name not in wheels]
    if not misses:
        return wheels
    held = cache.building([keys[s.name] for s in misses]) if cache else contextlib.nullcontext()
    with held as locked:
        # Another session may have built some of these while we waited for their locks.
        wheels.update(_from_cache(cache, [s for s in misses if keys[s.name] in (locked or ())],
                                  keys, workdir))
        wheels.update(_build_groups([s for s in misses if s.name not in wheels], cache, keys,
                                    uv, python, workdir))
    return wheels


def cached(skills: Sequence[PythonSkill], uv: Uv, python: Path,
           workdir: Path) -> dict[str, Path]:
    """The editable wheels of ``skills`` that the build cache holds, copied into ``workdir``:
    {skill name: wheel path}. Builds nothing and starts no process."""
    found = _keyed(skills, uv, python)
    if found is None or found[0] is None:
        return {}
    cache, batchable, keys = found
    return _from_cache(cache, batchable, keys, workdir)


def prebuild(skills: Sequence[PythonSkill], uv: Uv, python: Path, workdir: Path) -> None:
    """Put the wheels of ``skills`` into the build cache, building those it lacks; nothing
    when the cache is unusable (the wheels would be thrown away with ``workdir``)."""
    found = _keyed(skills, uv, python)
    if found is not None and found[0] is not None:
        _fill(found, uv, python, workdir)


def _keyed(skills: Sequence[PythonSkill], uv: Uv, python: Path) -> _Keyed | None:
    """(the build cache, the skills this module builds, their cache keys); None when it
    builds none of them."""
    if not enabled():
        return None
    batchable = [s for s in skills
                 if s.build_system is not None and s.build_system[0] in BATCHED_BACKENDS]
    if not batchable:
        return None
    version = python_version(python.parent.parent) or os.path.realpath(python)
    keys = {s.name: buildcache.key(s, version, uv.build_args) for s in batchable}
    return buildcache.open_cache(), batchable, keys


def _build_groups(misses: Sequence[PythonSkill], cache: Cache | None, keys: Mapping[str, str],
                  uv: Uv, python: Path, workdir: Path) -> dict[str, Path]:
    groups: dict[tuple[str, tuple[str, ...]], list[PythonSkill]] = {}
    for skill in misses:
        if skill.build_system is not None:
            groups.setdefault(skill.build_system, []).append(skill)
    wheels: dict[str, Path] = {}
    for index, ((backend, requires), members) in enumerate(sorted(groups.items())):
        # A single skill built here is worth it only to keep it in the cache.
        if len(members) < (1 if cache else MIN_BATCH):
            continue
        try:
            if cache is None:
                wheels.update(_build_group(backend, requires, members, uv, python,
                                           workdir / f"build-{index}", {}))
            else:
                wheels.update(_build_into_cache(cache, keys, backend, requires, members, uv,
                                                python, workdir / f"build-{index}"))
        except (BootstrapError, OSError, ValueError) as e:
            log.info("could not build the editables in one process; uv builds them",
                     backend=backend, skills=[s.name for s in members], error=str(e))
    return wheels


def _from_cache(cache: Cache | None, skills: Sequence[PythonSkill], keys: Mapping[str, str],
                workdir: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for skill in skills if cache else ():
        assert cache is not None
        try:
            wheel = cache.take(keys[skill.name], skill.name, workdir / skill.name)
        except OSError as e:  # our own scratch space refused the copy: build it instead
            log.info("could not use the build cache", skill=skill.name, error=str(e))
            continue
        if wheel is not None:
            found[skill.name] = wheel
    if found:
        log.debug("editables from the build cache", skills=sorted(found))
    return found


def _build_into_cache(cache: Cache, keys: Mapping[str, str], backend: str,
                      requires: tuple[str, ...], members: list[PythonSkill], uv: Uv,
                      python: Path, workdir: Path) -> dict[str, Path]:
    """Build ``members`` in one process, each published into the cache as soon as it is done."""
    publish = {s.name: (cache.staging(keys[s.name]), cache.entry(keys[s.name]),
                        cache.metadata(s)) for s in members}
    with contextlib.ExitStack() as stack:
        for staging, _, _ in publish.values():
            stack.enter_context(removed_on_exit(staging))
        built = _build_group(backend, requires, members, uv, python, workdir, publish)
        # Copied out of the cache: what uv installs cannot change under it.
        for name, wheel in built.items():
            (workdir / name).mkdir(parents=True, exist_ok=True)
            built[name] = Path(shutil.copy(wheel, workdir / name / wheel.name))
    return built


# {skill name: (where its entry is written, the entry it is renamed to, its entry.json)}
Publish = Mapping[str, tuple[Path, Path, Mapping[str, object]]]


def _build_group(backend: str, requires: tuple[str, ...], members: list[PythonSkill],
                 uv: Uv, python: Path, workdir: Path, publish: Publish) -> dict[str, Path]:
    env = Venv.at(workdir / "env")
    # The venv's base interpreter (its bin/python links to it): uv has that one's description
    # cached from creating the venv, while asking about the link costs a child (~50 ms).
    uv.run("venv", "--quiet", "--python", os.path.realpath(python), env.path,
           what="uv could not create a build environment", index=False)
    install = ["pip", "install", "--quiet", "--python", str(env.python), *uv.build_args]
    if requires:
        # Offline first: any cached backend that satisfies build-system.requires will do.
        uv.cached_first(*install, *requires,
                        what=f"uv could not install the build requirements {', '.join(requires)}")
    request = {
        "backend": backend,
        "install": [str(uv.exe), *install, *uv.network.args(install)],
        "skills": [_item(s, workdir, publish) for s in members],
        "results": str(workdir / "results.json"),
    }
    (workdir / "request.json").write_text(json.dumps(request), encoding="utf-8")
    log.debug("building editables in one process", backend=backend,
              skills=[s.name for s in members])
    # As uv runs a backend: the build environment active, its scripts first on PATH.
    run_env = {**environment(), "VIRTUAL_ENV": str(env.path),
               "PATH": os.pathsep.join([str(env.scripts), os.environ.get("PATH", "")])}
    process.run(env.python, "-I", _WORKER, workdir / "request.json", env=run_env,
                what="the build backend process failed")
    results = json.loads(read_state_file(workdir / "results.json"))
    wheels: dict[str, Path] = {}
    for skill in members:
        outcome = results.get(skill.name, {})
        wheel = outcome.get("wheel") if isinstance(outcome, dict) else None
        if isinstance(wheel, str) and wheel.endswith(".whl") and Path(wheel).is_file():
            wheels[skill.name] = Path(wheel)
        else:
            log.info("uv builds this skill instead", skill=skill.name,
                     error=str(outcome.get("error", "no wheel")).strip().splitlines()[-1:])
    return wheels


def _item(skill: PythonSkill, workdir: Path, publish: Publish) -> dict[str, object]:
    if skill.name not in publish:
        return {"name": skill.name, "dir": str(skill.skill.path), "out": str(workdir / skill.name)}
    staging, entry, meta = publish[skill.name]
    return {"name": skill.name, "dir": str(skill.skill.path), "out": str(staging),
            "entry": str(entry), "meta": dict(meta)}


def out_of_tree(scratch: Path) -> dict[str, str]:
    """What a uv call that may build skills with setuptools adds to its environment: their
    ``*.egg-info`` go to ``scratch/egg-info``, never into a skill's directory.

    A git skill's tree is read-only and hashed (bootstrap.sources.materialise): setuptools
    creating ``src/NAME.egg-info`` there failed for any user but root ("could not create
    '*.egg-info': Permission denied"), and as root it changed the tree, which the next check
    then removed. ``DIST_EXTRA_CONFIG`` names a config file setuptools (65 and later) reads
    after the project's own; its ``egg_base`` moves that directory. The editable still points
    at the skill's own directory, and nothing of the build is kept (its metadata is in the
    venv). A ``DIST_EXTRA_CONFIG`` of the user's own is left to win.
    """
    base = scratch / "egg-info"
    if os.environ.get("DIST_EXTRA_CONFIG") or any(c in str(base) for c in "\r\n"):
        return {}
    base.mkdir()
    config = scratch / "setuptools.cfg"
    # configparser's interpolation: a % in the path must be doubled.
    config.write_text(f"[egg_info]\negg_base = {str(base).replace('%', '%%')}\n",
                      encoding="utf-8")
    return {"DIST_EXTRA_CONFIG": str(config)}


# -- after uv installed the wheels -------------------------------------------------------------

def record_editables(venv: Path, built: Mapping[PythonSkill, Path]) -> None:
    """Record each installed wheel as the editable install of its skill, as uv records its own.

    A record we cannot write costs nothing but metadata (the skill imports either way): a
    warning, never a failure.
    """
    for skill, wheel in built.items():
        try:
            dist_info = _dist_info(venv, wheel)
            _rewrite(dist_info, {
                "direct_url.json": _direct_url(skill.skill.path),
                "uv_cache.json": _uv_cache_info(skill.skill.path),
                "uv_build.json": b"{}",
            })
        except (OSError, ValueError) as e:
            log.warning("could not record the skill as an editable install (it imports "
                        "anyway)", skill=skill.name, error=str(e))


def _dist_info(venv: Path, wheel: Path) -> Path:
    # A wheel's name starts with its dist-info's: {distribution}-{version}-{tags}.whl.
    distribution, version = wheel.name.split("-")[:2]
    name = f"{distribution}-{version}.dist-info"
    for site in Venv.at(venv).site_packages():
        if (site / name).is_dir():
            return site / name
    raise ValueError(f"{name} is not installed in {venv}")


def _direct_url(path: Path) -> bytes:
    return json.dumps({"url": path.resolve().as_uri(), "dir_info": {"editable": True}},
                      separators=(",", ":")).encode()


def _uv_cache_info(path: Path) -> bytes:
    # What uv compares (its uv-cache-info crate, checked against uv 0.13 by the integration
    # tests): the latest *ctime* of the key files (a chmod counts, an mtime reset does not hide
    # an edit), and for src/ its *creation* time, or its inode where none is recorded; src/'s
    # mtime, which any file made directly in it moves, is not compared.
    stamps = [st.st_ctime_ns for name in _CACHE_KEY_FILES
              if (st := _stat(path / name)) is not None and stat.S_ISREG(st.st_mode)]
    info = {"timestamp": _timestamp(max(stamps)) if stamps else None, "commit": None,
            "tags": None, "env": {}, "directories": _directories(path / "src")}
    return json.dumps(info, separators=(",", ":")).encode()


def _directories(src: Path) -> dict[str, object]:
    st = _stat(src)
    if st is None:
        return {"src": None}
    if not stat.S_ISDIR(st.st_mode):
        return {}  # uv leaves a src that is not a directory out of the record
    born = birth_time_ns(src)
    return {"src": st.st_ino if born is None else _timestamp(born)}


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def _timestamp(ns: int) -> dict[str, int]:
    return {"secs_since_epoch": ns // 1_000_000_000, "nanos_since_epoch": ns % 1_000_000_000}


def _rewrite(dist_info: Path, files: Mapping[str, bytes]) -> None:
    """Write ``files`` into ``dist_info`` and make its RECORD list them with their hashes."""
    record = dist_info / "RECORD"
    prefix = dist_info.name + "/"
    lines = [line for line in record.read_text(encoding="utf-8").splitlines()
             if line and line.split(",", 1)[0] not in {prefix + n for n in files}]
    for name, data in files.items():
        # Replaced, not rewritten in place: uv links files from its cache into venvs. Not
        # durable (no fsync): metadata repair re-derives after a power loss, and four fsyncs
        # per skill would cost the cold path more than the records are worth.
        write_atomic(dist_info / name, data, durable=False)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{prefix}{name},sha256={digest},{len(data)}")
    write_atomic(record, ("\n".join(lines) + "\n").encode(), durable=False)

"""`uv pip install`: gather requests, simulate failures, resolve, then install all or nothing
(and, with `--compile-bytecode`, compile what it installed).

Like uv, every check (builds, resolution) finishes before the first file is written, so a failed
call leaves the venv exactly as it was. The fault injections are environment variables:
FAKE_UV_HANG, FAKE_UV_DELAY, FAKE_UV_FAIL, FAKE_UV_OFFINDEX, FAKE_UV_DELAY_EACH, FAKE_UV_SCRIPTS,
and, for what happens only while writing, FAKE_UV_ENOSPC and FAKE_UV_PARTIAL (`dists.torn`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, NamedTuple

from fake_uv import cli, dists, projects, reqs, venvs, wheels
from fake_uv.errors import UvExit, failure
from fake_uv.lock import add_locked, hashed
from fake_uv.output import Console, plural
from fake_uv.projects import Project

INSTALL_SPEC: Final = cli.spec(
    "uv pip install --python <PYTHON> <PACKAGE|--requirements <REQUIREMENTS>|"
    "--editable <EDITABLE>>",
    flags={"--reinstall", "--no-deps", "--compile-bytecode", "--strict", "--upgrade",
           "--no-build-isolation", "--refresh", "--no-index", "--require-hashes"},
    valued={"--python", "--editable", "--requirements", "--constraints", "--exclude-newer",
            "--index-url", "--extra-index-url", "--default-index", "--index", "--find-links",
            "--link-mode", "--reinstall-package", "--refresh-package", "--prerelease",
            "--resolution", "--index-strategy", "--preview-features"},
    aliases={"-p": "--python", "-e": "--editable", "-r": "--requirements",
             "--requirement": "--requirements", "-c": "--constraints",
             "--constraint": "--constraints", "-U": "--upgrade", "-i": "--index-url",
             "-f": "--find-links"},
)
_WHEEL: Final = "Wheel-Version: 1.0\nGenerator: fake_uv\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
# uv's own trampoline for relocatable venvs: the script finds the python beside itself.
_RELOCATABLE_SHEBANG: Final = (
    "#!/bin/sh\n"
    "'''exec' \"$(dirname -- \"$(realpath -- \"$0\")\")\"/'python' \"$0\" \"$@\"\n"
    "' '''\n"
)


class Package(NamedTuple):
    """One distribution this call will write: an editable project or a fake index package."""

    norm: str
    name: str
    version: str
    project: Project | None
    requested: bool
    wheel: Path | None = None  # a `name @ file:///x.whl` requirement's wheel

    def described(self) -> str:
        source = f" (from {self.project.url})" if self.project else ""
        return f"{self.norm}=={self.version}{source}"


def install(args: Sequence[str]) -> int:
    opts = cli.parse(args, INSTALL_SPEC)
    console = Console(opts.flag("--quiet"))
    venv = venvs.locate(opts.value("--python"))
    console.say(f"Using Python {venv.version} environment at: {venv.shown}")
    requests = _gather(opts)
    editables = _load(requests)
    _log_request(editables, requests.requirements)
    _inject_faults(editables, requests.requirements)
    installed = dists.scan(venv.site)
    offline = opts.flag("--offline") or os.environ.get("UV_OFFLINE", "") in ("1", "true")
    fetch, resolved = _resolve(editables, requests, installed, offline,
                               no_deps=opts.flag("--no-deps"))
    forced = {reqs.normalize(n) for n in opts.values("--reinstall-package")}
    todo, checked = _plan(editables, requests, fetch, installed,
                          lambda norm: opts.flag("--reinstall") or norm in forced)
    if not todo:
        console.say(f"Checked {plural(checked)} in {console.elapsed()}")
        return 0
    console.say(f"Resolved {plural(resolved)} in {console.elapsed()}")
    for package in todo:
        if package.project:
            console.say(f"   Building {package.project.label()}")
            console.say(f"      Built {package.project.label()}")
    console.say(f"Prepared {plural(len(todo))} in {console.elapsed()}")
    _apply(venv, todo, installed, console)
    if opts.flag("--compile-bytecode"):
        _compile(venv, todo, console)
    return 0


def _gather(opts: cli.Parsed) -> reqs.Requests:
    requests = reqs.Requests()
    for path in opts.values("--requirements"):
        if hashed(Path(path), opts.flag("--require-hashes")):
            add_locked(requests, Path(path), opts.flag("--require-hashes"))
        else:
            requests.read(Path(path))
    for path in opts.values("--constraints"):
        requests.read(Path(path), constraints=True)
    for directory in opts.values("--editable"):
        requests.add_editable(directory, from_file=False)
    for text in opts.positionals:
        requests.add_requirement(text)
    if not (opts.values("--requirements") or requests.editables or requests.requirements):
        raise UvExit(2, "error: the following required arguments were not provided:\n"
                        "  <PACKAGE|--requirements <REQUIREMENTS>|--editable <EDITABLE>>\n\n"
                        f"Usage: {INSTALL_SPEC.usage}\n\nFor more information, try '--help'.")
    return requests


def _load(requests: reqs.Requests) -> list[Project]:
    """The editable projects, once each; two directories claiming one name is uv's error."""
    loaded: dict[str, Project] = {}
    for editable in requests.editables:
        project = projects.load(editable)
        earlier = loaded.get(project.norm)
        if earlier and earlier.directory != project.directory:
            raise failure(2, f"Requirements contain conflicting URLs for package "
                             f"`{project.norm}`:\n- {earlier.url}\n- {project.url}")
        if not earlier or not project.from_file:
            loaded[project.norm] = project  # a command-line -e wins uv's "always rebuild"
    return list(loaded.values())


def _log_request(editables: list[Project], requirements: list[reqs.Requirement]) -> None:
    """A detail line for the call just logged: which editables (by directory name) and which
    requirements it asked for, including those read from -r files, which are often gone by the
    time a test looks."""
    from fake_uv.__main__ import log_line

    log_line({"pid": os.getpid(), "detail": True,
              "editables": sorted(p.directory.name for p in editables),
              "requirements": [r.norm for r in requirements],
              "wheels": sum(r.url.endswith(".whl") for r in requirements)})


def _inject_faults(editables: list[Project], requirements: list[reqs.Requirement]) -> None:
    """FAKE_UV_HANG, FAKE_UV_DELAY and FAKE_UV_FAIL, in the order a real slow build fails.

    FAKE_UV_HANG_ALONE=name hangs only a call whose sole editable is ``name``: an isolation
    retry, not the group call that contained it.
    """
    names = {p.norm for p in editables} | {reqs.normalize(p.directory.name) for p in editables}
    names |= {r.norm for r in requirements}
    alone = {reqs.normalize(p.directory.name) for p in editables}
    if len(editables) == 1 and alone & reqs.env_names("FAKE_UV_HANG_ALONE"):
        while True:  # tests SIGKILL us; nothing has been written
            time.sleep(3600)
    if names & reqs.env_names("FAKE_UV_HANG"):
        while True:  # tests SIGKILL us; nothing has been written
            time.sleep(3600)
    time.sleep(_seconds("FAKE_UV_DELAY"))
    failing = reqs.env_names("FAKE_UV_FAIL")
    for project in editables:
        if {project.norm, reqs.normalize(project.directory.name)} & failing:
            raise failure(1, f"Failed to build `{project.label()}`",
                          ["The build backend returned an error",
                           f"fake build failure for {project.norm} (FAKE_UV_FAIL)"])
    for requirement in requirements:
        if requirement.norm in failing:
            raise _download_failure(requirement.norm)


def _download_failure(norm: str) -> UvExit:
    return failure(1, f"Failed to download `{norm}`",
                   [f"fake download failure for {norm} (FAKE_UV_FAIL)"])


def _resolve(
    editables: list[Project],
    requests: reqs.Requests,
    installed: dict[str, dists.Dist],
    offline: bool,
    *,
    no_deps: bool,
) -> tuple[list[reqs.Requirement], int]:
    """Index packages to fetch, and how many packages the resolution holds in all.

    A dependency is satisfied by an editable or requirement of this call, by a distribution
    already in the venv, or by the fake index, which holds every name but FAKE_UV_OFFINDEX.
    """
    where = "the cache" if offline else "the package registry"
    off_index = reqs.env_names("FAKE_UV_OFFINDEX")
    provided = {p.norm for p in editables} | {r.norm for r in requests.requirements}
    for requirement in requests.requirements:
        if requirement.norm in off_index and requirement.norm not in installed:
            raise _unsatisfiable(
                f"Because {requirement.norm} was not found in {where} and you require "
                f"{requirement.norm}, we can conclude that your requirements are unsatisfiable.",
                offline)
    fetch: dict[str, reqs.Requirement] = {}
    seen = set(provided)
    for project in [] if no_deps else editables:
        for dep in project.dependencies:
            seen.add(dep.norm)
            if dep.norm in provided or dep.norm in installed or dep.norm in fetch:
                continue
            if dep.norm in off_index:
                pinned = f"{project.norm}=={project.version}"
                raise _unsatisfiable(
                    f"Because {dep.norm} was not found in {where} and {pinned} depends on "
                    f"{dep.norm}{dep.specifier}, we can conclude that {pinned} cannot be used.\n"
                    f"And because only {pinned} is available and you require {project.norm}, "
                    "we can conclude that your requirements are unsatisfiable.", offline)
            fetch[dep.norm] = dep
    failing = reqs.env_names("FAKE_UV_FAIL") & set(fetch)
    if failing:
        raise _download_failure(sorted(failing)[0])
    return list(fetch.values()), len(seen)


def _unsatisfiable(cause: str, offline: bool) -> UvExit:
    hint = ("Packages were unavailable because the network was disabled. When the network is "
            "disabled, registry packages may only be read from the cache.") if offline else ""
    return failure(1, "No solution found when resolving dependencies", [cause], hint)


def _plan(
    editables: list[Project],
    requests: reqs.Requests,
    fetch: list[reqs.Requirement],
    installed: dict[str, dists.Dist],
    forced: Callable[[str], bool],
) -> tuple[list[Package], int]:
    """What to write, and how many requested packages are already fresh (uv's "Checked")."""
    todo: list[Package] = []
    fresh = 0
    for project in editables:
        old = installed.get(project.norm)
        # uv 0.13.9 always rebuilds a command-line `-e DIR`; only `-e` lines in a requirements
        # file get its freshness check (same path, version and pyproject.toml ctime).
        if project.from_file and old and not forced(project.norm) and _fresh(project, old):
            fresh += 1
            continue
        todo.append(Package(project.norm, project.name, project.version, project, True))
    for requirement in requests.requirements:
        old = installed.get(requirement.norm)
        wheel = _wheel(requirement)
        version = wheels.version_of(wheel) if wheel else requests.version_for(requirement)
        if old and not forced(requirement.norm) and _satisfies(old, requirement, requests):
            fresh += 1
            continue
        todo.append(Package(requirement.norm, requirement.name, version, None, True, wheel))
    todo += [Package(dep.norm, dep.name, requests.version_for(dep), None, False) for dep in fetch]
    return todo, fresh


def _wheel(requirement: reqs.Requirement) -> Path | None:
    url = requirement.url
    return Path(reqs.editable_path(url)) if url.endswith(".whl") else None


def _fresh(project: Project, old: dists.Dist) -> bool:
    """uv's check (path, version, pyproject.toml ctime), plus the metadata we would write now.

    The metadata comparison is stricter than uv: a dependency edit that keeps the old ctime
    (within one clock tick) still reinstalls, so tests never see stale deps.
    """
    package = Package(project.norm, project.name, project.version, project, True)
    return (old.version == project.version
            and old.editable_location() == project.directory
            and old.cache_timestamp_ns() == project.pyproject_ctime_ns
            and old.read("METADATA") == _metadata(package))


def _satisfies(old: dists.Dist, requirement: reqs.Requirement, requests: reqs.Requests) -> bool:
    """An installed distribution satisfies an unpinned request, or one pinned to its version."""
    constraint = requests.constraints.get(requirement.norm)
    pin = requirement.pinned("==", "===") or (constraint.pinned("==", "===") if constraint
                                              else None)
    return pin is None or pin == old.version


def _apply(venv: venvs.Venv, todo: list[Package], installed: dict[str, dists.Dist],
           console: Console) -> None:
    """Write every package (replacing an earlier version of it), then print uv's summary."""
    each = _seconds("FAKE_UV_DELAY_EACH")
    scripts = reqs.env_names("FAKE_UV_SCRIPTS")
    changes: list[tuple[str, str]] = []
    removed = 0
    for package in todo:
        time.sleep(each)
        old = installed.get(package.norm)
        if old:
            dists.remove(venv, old)
            removed += 1
        torn = dists.torn(package.norm)
        _write(venv, package, package.norm in scripts, payload=not torn)
        if torn == "ENOSPC":
            raise failure(2, f"Failed to install: {package.norm}-{package.version}-py3-none-any"
                             f".whl ({package.norm}=={package.version})",
                          [f"failed to copy file to {venv.site / package.norm}",
                           "No space left on device (os error 28)"])
        if old and old.described() == package.described():
            changes.append((package.norm, f" ~ {package.described()}"))
        else:
            changes += [(package.norm, f" - {old.described()}")] if old else []
            changes.append((package.norm, f" + {package.described()}"))
    if removed:
        console.say(f"Uninstalled {plural(removed)} in {console.elapsed()}")
    console.say(f"Installed {plural(len(todo))} in {console.elapsed()}")
    for _, line in sorted(changes, key=lambda change: change[0]):
        console.say(line)


def _compile(venv: venvs.Venv, todo: list[Package], console: Console) -> None:
    """`--compile-bytecode` as uv 0.13.9 does it: the modules this call installed, nothing else
    (a call that installs nothing compiles nothing), into `__pycache__` beside each."""
    import py_compile

    installed = dists.scan(venv.site)
    count = 0
    for package in todo:
        dist = installed.get(package.norm)
        for line in (dist.read("RECORD") if dist else "").splitlines():
            source = venv.site / line.split(",")[0]
            if source.suffix == ".py" and source.is_file():
                py_compile.compile(str(source), quiet=1)
                count += 1
    console.say(f"Bytecode compiled {count} file{'' if count == 1 else 's'} in {console.elapsed()}")


def _write(venv: venvs.Venv, package: Package, with_script: bool, *,
           payload: bool = True) -> None:
    if package.wheel:
        return wheels.install(venv, package.wheel)
    meta = {
        "METADATA": _metadata(package),
        "INSTALLER": "uv",
        "WHEEL": _WHEEL,
    }
    if package.requested:
        meta["REQUESTED"] = ""
    files: dict[str, str] = {}
    project = package.project
    if project:
        files[f"_editable_{project.norm}.pth"] = f"{project.import_root}\n"
        meta["direct_url.json"] = _compact({"url": project.url, "dir_info": {"editable": True}})
        seconds, nanos = divmod(project.pyproject_ctime_ns, 10**9)
        meta["uv_cache.json"] = _compact({
            "timestamp": {"secs_since_epoch": seconds, "nanos_since_epoch": nanos},
            "commit": None, "tags": None, "env": {}, "directories": {"src": None}})
        for name, target in project.scripts:
            files[_bin_record(venv, name)] = _script(venv, _entry_point_body(target))
        if project.scripts:
            meta["entry_points.txt"] = "[console_scripts]\n" + "".join(
                f"{name} = {target}\n" for name, target in project.scripts)
    else:
        import_name = package.norm.replace("-", "_")
        files[f"{import_name}/__init__.py"] = f'__version__ = "{package.version}"\n'
        if import_name == "hatchling":  # a backend that builds: see fake_uv/wheels.py
            files["hatchling/build.py"] = wheels.BACKEND
        if with_script:
            body = f"print({f'{package.norm} {package.version}'!r})\n"
            files[_bin_record(venv, package.norm)] = _script(venv, body)
    executables = [path for path in files if not path.endswith((".pth", ".py"))]
    dists.write(venv, files, dists.dist_info_name(package.name, package.version), meta,
                executables, payload=payload)


def _metadata(package: Package) -> str:
    lines = ["Metadata-Version: 2.3", f"Name: {package.name}", f"Version: {package.version}"]
    if package.project:
        lines += [f"Requires-Dist: {dep.text}" for dep in package.project.dependencies]
    return "\n".join(lines) + "\n"


def _bin_record(venv: venvs.Venv, name: str) -> str:
    """A script's RECORD path: relative to site-packages, like `../../../bin/name`."""
    return Path(os.path.relpath(venv.bin / name, venv.site)).as_posix()


def _script(venv: venvs.Venv, body: str) -> str:
    # A kernel cannot exec a shebang with spaces, and a relocatable venv must not embed its
    # absolute path: both get uv's sh trampoline instead.
    python = str(venv.python)
    relocatable = venv.relocatable or " " in python
    return (_RELOCATABLE_SHEBANG if relocatable else f"#!{python}\n") + body


def _entry_point_body(target: str) -> str:
    module, _, attribute = target.split("[")[0].strip().partition(":")
    attribute = attribute.strip() or "main"
    return (f"import sys\nfrom {module.strip()} import {attribute.split('.')[0]}\n"
            f"if __name__ == \"__main__\":\n    sys.exit({attribute}())\n")


def _compact(data: object) -> str:
    return json.dumps(data, separators=(",", ":"))


def _seconds(variable: str) -> float:
    try:
        return max(0.0, float(os.environ.get(variable, "") or 0))
    except ValueError:
        return 0.0

"""One child process that reports what an interpreter really has installed and can import.

Used where a deep look is worth a process start: the interpreter override (every start, by
contract) and ``repair``. Never on the warm path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bootstrap.errors import ProcessError
from bootstrap.primitives import log, process

_PURPOSE = "<probe: list installed distributions, try the skills' imports (-v shows it)>"
# Runs inside the target interpreter: stdlib only, and tolerant of anything missing there.
_SCRIPT = r"""
import importlib, importlib.metadata as md, json, os, platform, sys
req = json.loads(sys.argv[1])
def fmt(info):
    v = "%d.%d.%d" % info[:3]
    return v if info.releaselevel == "final" else v + info.releaselevel[0] + str(info.serial)
markers = {
    "implementation_name": sys.implementation.name,
    "implementation_version": fmt(sys.implementation.version),
    "os_name": os.name, "platform_machine": platform.machine(),
    "platform_release": platform.release(), "platform_system": platform.system(),
    "platform_version": platform.version(), "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform,
}
out = {"version": sys.version.split()[0], "markers": markers, "dists": {}, "imports": {}}
for name in req["dists"]:
    try:
        d = md.distribution(name)
    except md.PackageNotFoundError:
        out["dists"][name] = None
        continue
    url = d.read_text("direct_url.json")
    out["dists"][name] = {"version": d.version, "direct_url": json.loads(url) if url else None}
for key, modules in req["imports"].items():
    err = None
    for m in modules:
        try:
            importlib.import_module(m)
        except BaseException as e:
            err = f"import {m}: {type(e).__name__}: {e}"
            break
    out["imports"][key] = err
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Dist:
    version: str
    editable_path: Path | None


@dataclass(frozen=True)
class ProbeResult:
    version: str
    dists: dict[str, Dist | None]
    import_errors: dict[str, str | None]
    # PEP 508 marker values of the probed interpreter: "foo; python_version < '3.12'" is
    # about that interpreter, not the one running kernel-bootstrap.
    markers: dict[str, str]


def probe(python: Path, dists: Sequence[str],
          imports: Mapping[str, Sequence[str]]) -> ProbeResult:
    """Ask ``python`` for the named distributions and try the named imports."""
    request = json.dumps({"dists": list(dists),
                          "imports": {k: list(v) for k, v in imports.items()}})
    try:
        result = process.run(python, "-c", _SCRIPT, request,
                             what=f"the interpreter {python} does not run")
    except ProcessError as e:
        # The script is 40 lines: the message names what it does, and -v shows it whole.
        log.debug("the probe script that failed", script=_SCRIPT)
        raise ProcessError((str(python), "-c", _PURPOSE, request), e.returncode, e.stderr,
                           e.what) from None
    try:
        raw = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ProcessError((str(python), "-c", _PURPOSE), 0, result.stderr,
                           f"the interpreter {python} gave no usable answer") from None
    return ProbeResult(raw["version"],
                       {n: _dist(v) for n, v in raw["dists"].items()},
                       raw["imports"], raw["markers"])


def _dist(raw: dict[str, object] | None) -> Dist | None:
    if raw is None:
        return None
    url = raw.get("direct_url")
    path = None
    if isinstance(url, dict) and isinstance(url.get("dir_info"), dict) \
            and url["dir_info"].get("editable") and str(url.get("url", "")).startswith("file://"):
        from urllib.parse import unquote, urlparse

        path = Path(unquote(urlparse(str(url["url"])).path))
    return Dist(str(raw["version"]), path)


def unmet_requirements(requirements: Sequence[str], found: ProbeResult) -> list[str]:
    """Each requirement the probed interpreter does not satisfy, with the reason."""
    from packaging.requirements import Requirement

    problems: list[str] = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(found.markers):
            continue
        dist = found.dists.get(req.name)
        if dist is None:
            problems.append(f"{text}: not installed")
        elif req.specifier and not req.specifier.contains(dist.version, prereleases=True):
            problems.append(f"{text}: version {dist.version} is installed")
    return problems


def requirement_names(requirements: Sequence[str]) -> list[str]:
    from packaging.requirements import Requirement

    return [Requirement(r).name for r in requirements]

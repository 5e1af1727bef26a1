"""One child process that reports what an interpreter really has installed and can import.

Used where a deep look is worth a process start: the interpreter override (every start, by
contract) and ``repair``. Never on the warm path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap.env.requirements import canonical
from bootstrap.errors import ProcessError
from bootstrap.primitives import log, process

_PURPOSE = "<probe: what the interpreter is and has, the skills' imports (-v shows it)>"
# The one script any interpreter we do not run in is asked through (the override, repair, a
# lock's exactness, a snapshot's platform). Runs inside that interpreter: stdlib only, tolerant
# of anything missing there; importlib.metadata (~76 ms) only when distributions are asked for.
_SCRIPT = r"""
import json, os, platform, sys
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
where = {"python_version": platform.python_version(), "implementation": sys.implementation.name,
         "os": sys.platform, "machine": platform.machine(),
         "libc": "-".join(platform.libc_ver()) or "none"}
out = {"version": sys.version.split()[0], "markers": markers, "platform": where, "dists": {},
       "imports": {}, "everything": []}
if req["dists"] or req["everything"]:
    import importlib.metadata as md
for name in req["dists"]:
    try:
        d = md.distribution(name)
    except md.PackageNotFoundError:
        out["dists"][name] = None
        continue
    url = d.read_text("direct_url.json")
    out["dists"][name] = {"version": d.version, "direct_url": json.loads(url) if url else None}
if req["everything"]:
    out["everything"] = [[d.metadata["Name"], d.version, d.requires or []]
                         for d in md.distributions() if d.metadata["Name"]]
for key, modules in req["imports"].items():
    import importlib
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
    # The fields of an env.platform.Platform.
    platform: dict[str, str] = field(default_factory=dict)
    # With ``everything``: each installed distribution, canonical name -> (version, requires).
    everything: dict[str, tuple[str, list[str]]] = field(default_factory=dict)


def probe(python: Path, dists: Sequence[str] = (),
          imports: Mapping[str, Sequence[str]] | None = None, *, everything: bool = False,
          isolated: bool = False) -> ProbeResult:
    """Ask ``python`` what it is, for the named distributions (or, with ``everything``, all of
    them) and try the named imports. ``isolated`` runs it with ``-I``: what the binary is,
    whatever PYTHON* variables say."""
    request = json.dumps({"dists": list(dists), "everything": everything,
                          "imports": {k: list(v) for k, v in (imports or {}).items()}})
    flags = ("-I",) if isolated else ()
    try:
        result = process.run(python, *flags, "-c", _SCRIPT, request,
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
                       raw["imports"], raw["markers"], raw["platform"],
                       {canonical(n): (str(v), [str(r) for r in requires])
                        for n, v, requires in raw["everything"]})


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

"""Build several projects' editable wheels in one process: the PEP 517/660 hooks, in a loop.

Run by :mod:`bootstrap.skills.builds` with a build environment's interpreter and ``-I``, so it uses
nothing but the standard library and never imports kernel-bootstrap. Its only output is the
results file named in the request; what the backend prints goes to stderr.

Request (JSON): ``{"backend": "module:object", "install": [argv prefix that installs build
requirements into this environment], "skills": [{"name", "dir", "out", "entry"?, "meta"?}],
"results": path}``. Results (JSON): ``{name: {"wheel": path} | {"error": text}}``. A skill
missing from the results or with an error is left to uv, which builds it the usual way (and
reports its own error).

A skill with an ``entry`` goes into the build cache the moment its build returns: ``out`` (a
hidden sibling of ``entry``) gets ``entry.json`` (``meta`` plus the wheel's name and sha256) and
is renamed to ``entry``, so a session killed while building the next skill keeps this one.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the build environment may run a Python older than ours
    Item = dict[str, str]
    Results = dict[str, dict[str, str]]


def _load_backend(spec: str) -> Any:
    module, _, path = spec.partition(":")
    backend = importlib.import_module(module)
    for attr in filter(None, path.split(".")):
        backend = getattr(backend, attr)
    return backend


def _error() -> dict[str, str]:
    return {"error": "".join(traceback.format_exc().splitlines(True)[-12:])}


def _requirements(backend: Any, items: list[Item],
                  results: Results) -> tuple[list[str], list[Item]]:
    """Each project's extra build requirements (PEP 517); those whose hook failed are out."""
    hook = getattr(backend, "get_requires_for_build_editable", None)
    wanted: list[str] = []
    ready: list[Item] = []
    for item in items:
        try:
            os.chdir(item["dir"])
            for requirement in (hook() if hook else []):
                if requirement not in wanted:
                    wanted.append(requirement)
            ready.append(item)
        except BaseException:  # a backend may sys.exit(); that fails this project only
            results[item["name"]] = _error()
    return wanted, ready


def _build(backend: Any, request: dict[str, Any]) -> Results:
    results: Results = {}
    hook = getattr(backend, "build_editable", None)
    if hook is None:
        return {item["name"]: {"error": "the backend has no build_editable hook (PEP 660)"}
                for item in request["skills"]}
    wanted, ready = _requirements(backend, request["skills"], results)
    if wanted:
        done = subprocess.run(request["install"] + wanted, stdout=sys.stderr,
                              stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            error = {"error": "could not install the build requirements " + ", ".join(wanted)
                     + ": " + done.stderr[-2000:]}
            results.update({item["name"]: error for item in ready})
            return results
        importlib.invalidate_caches()
    for item in ready:
        try:
            os.chdir(item["dir"])
            os.makedirs(item["out"], exist_ok=True)
            wheel = os.path.join(item["out"], hook(item["out"]))
            results[item["name"]] = {"wheel": _publish(item, wheel)}
        except BaseException:
            results[item["name"]] = _error()
    return results


def _publish(item: dict[str, Any], wheel: str) -> str:
    """Rename the finished entry into the build cache; the wheel's path, wherever it is now.

    Another session may have published the same key first (a rename onto a non-empty
    directory fails): its entry is the same build, and ours stays where it is for this session.
    """
    if "entry" not in item:
        return wheel
    with open(wheel, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    meta = dict(item["meta"], wheel=os.path.basename(wheel), sha256=digest)
    with open(os.path.join(item["out"], "entry.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)
    try:
        os.rename(item["out"], item["entry"])
    except OSError:
        return wheel
    return os.path.join(item["entry"], os.path.basename(wheel))


def main(request_path: str) -> int:
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    sys.stdout = sys.stderr  # backends print; only the results file is ours
    try:
        backend = _load_backend(request["backend"])
    except BaseException:
        failed = _error()
        results = {item["name"]: failed for item in request["skills"]}
    else:
        results = _build(backend, request)
    with open(request["results"], "w", encoding="utf-8") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

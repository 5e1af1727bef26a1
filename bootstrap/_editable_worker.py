"""Build several projects' editable wheels in one process: the PEP 517/660 hooks, in a loop.

Run by :mod:`bootstrap.editables` with a build environment's interpreter and ``-I``, so it uses
nothing but the standard library and never imports kernel-bootstrap. Its only output is the
results file named in the request; what the backend prints goes to stderr.

Request (JSON): ``{"backend": "module:object", "install": [argv prefix that installs build
requirements into this environment], "skills": [{"name", "dir", "out"}], "results": path}``.
Results (JSON): ``{name: {"wheel": path} | {"error": text}}``. A skill missing from the results
or with an error is left to uv, which builds it the usual way (and reports its own error).
"""

from __future__ import annotations

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
            results[item["name"]] = {"wheel": os.path.join(item["out"], hook(item["out"]))}
        except BaseException:
            results[item["name"]] = _error()
    return results


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

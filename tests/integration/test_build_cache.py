"""The build cache with the real uv: each skill is built once, ever, whatever happens to the venvs.

Builds are counted by a hatchling build hook in every skill that appends the skill's name to a
log when its build finishes: uv's builds and ours run it alike, so the counts are every backend
build of the test, by anyone.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

from testing.processes import kill_group, start, wait_for
from testing.uvlog import Call
from tests.integration.conftest import HANG_BACKEND, RealWorld

# Waits while a HANG file sits in the project (a build a test can kill), then records the build.
COUNT_HOOK = textwrap.dedent("""\
    import os, time
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface

    class CustomBuildHook(BuildHookInterface):
        def initialize(self, version, build_data):
            while os.path.exists(os.path.join(self.root, "HANG")):
                time.sleep(0.1)
            with open({log!r}, "a") as f:
                f.write(os.path.basename(self.root) + "\\n")
    """)
NAMES = ["alpha", "beta", "gamma"]


def counted(real: RealWorld, *names: str) -> None:
    for name in names:
        path = real.skill(name, files={"hatch_build.py": COUNT_HOOK.format(
            log=str(real.root / "builds.log"))})
        with (path / "pyproject.toml").open("a") as f:
            f.write("\n[tool.hatch.build.hooks.custom]\n")


def builds(real: RealWorld) -> Counter[str]:
    try:
        return Counter((real.root / "builds.log").read_text().split())
    except FileNotFoundError:
        return Counter()


def cache_entries(real: RealWorld) -> list[Path]:
    """The published entries: a hidden staging directory holds an ``entry.json`` for the
    moment before its rename, and a session killed then has not kept that build."""
    root = Path(real.env["XDG_CACHE_HOME"]) / "kernel-bootstrap" / "builds"
    return sorted(p for p in root.iterdir()
                  if not p.name.startswith(".") and (p / "entry.json").is_file())


def new_venv(real: RealWorld, name: str, *args: str) -> dict[str, Any]:
    """``ensure --json`` into another venv; its stderr is added to the answer as ``stderr``."""
    result = real.ensure("--json", *args, env={"KERNEL_BOOTSTRAP_VENV": str(real.root / name)})
    out: dict[str, Any] = json.loads(result.stdout)
    out["stderr"] = result.stderr
    return out


def imports_in(real: RealWorld, venv: str, *modules: str) -> bool:
    python = real.root / venv / "bin" / "python"
    return subprocess.run([str(python), "-c", "; ".join(f"import {m}" for m in modules)],
                          check=False).returncode == 0


def test_a_new_venv_for_built_skills_builds_nothing(real: RealWorld) -> None:
    counted(real, *NAMES)
    real.ensure()
    assert builds(real) == Counter(NAMES)
    assert len(cache_entries(real)) == 3
    real.clear_log()
    out = new_venv(real, "venv2")
    assert sorted(out["installed"]) == NAMES
    assert real.build_env_calls() == [], "a build environment was made for cached skills"
    assert builds(real) == Counter(NAMES), "a cached skill was built again"
    [call] = [c for c in real.uv_calls() if "-r" in c]
    assert call.wheels == 3  # one uv call installs the cached wheels, as before
    assert imports_in(real, "venv2", *NAMES)


def test_a_killed_batched_build_keeps_what_it_finished(real: RealWorld) -> None:
    counted(real, *NAMES)
    (real.skills_dir / "gamma" / "HANG").write_text("")  # built last: alpha and beta finish
    proc = start(real)
    try:
        wait_for(lambda: builds(real) == Counter(["alpha", "beta"]), 90, proc)
        wait_for(lambda: len(cache_entries(real)) == 2, 10, proc)
    finally:
        kill_group(proc)
    assert real.status()["ready"] is False
    (real.skills_dir / "gamma" / "HANG").unlink()
    real.ensure()
    assert builds(real) == Counter(NAMES), "a build the killed session finished was redone"
    assert len(cache_entries(real)) == 3
    assert real.imports("alpha") and real.imports("gamma")


def test_an_edited_pyproject_misses_for_that_skill_only(real: RealWorld) -> None:
    counted(real, *NAMES)
    real.ensure()
    with (real.skills_dir / "beta" / "pyproject.toml").open("a") as f:
        f.write("# edited\n")
    out = new_venv(real, "venv2")
    assert sorted(out["installed"]) == NAMES
    assert builds(real) == Counter([*NAMES, "beta"])
    assert imports_in(real, "venv2", *NAMES)


def test_a_corrupt_entry_is_rebuilt_with_a_warning(real: RealWorld) -> None:
    counted(real, *NAMES)
    real.ensure()
    for entry in cache_entries(real):
        meta = json.loads((entry / "entry.json").read_text())
        if meta["name"] == "alpha":
            (entry / meta["wheel"]).write_bytes(b"PK not a wheel")
        if meta["name"] == "beta":
            (entry / "entry.json").write_text("{")
    out = new_venv(real, "venv2")
    assert "corrupt build cache entry" in out["stderr"]
    assert sorted(out["installed"]) == NAMES and out["failed"] == []
    assert builds(real) == Counter([*NAMES, "alpha", "beta"])
    assert imports_in(real, "venv2", *NAMES)
    new_venv(real, "venv3")  # the rebuilt entries took their place
    assert builds(real) == Counter([*NAMES, "alpha", "beta"])


def test_two_sessions_on_two_venvs_build_each_skill_once(real: RealWorld) -> None:
    counted(real, *NAMES)
    procs = [start(real, "--json", env={"KERNEL_BOOTSTRAP_VENV": str(real.root / name)})
             for name in ("one", "two")]
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr
        assert sorted(json.loads(stdout)["installed"]) == NAMES
    assert builds(real) == Counter(NAMES)
    assert imports_in(real, "one", *NAMES) and imports_in(real, "two", *NAMES)


def test_gc_prunes_entries_of_skills_that_are_gone(real: RealWorld) -> None:
    counted(real, *NAMES)
    real.ensure()
    (real.skills_dir / "gamma" / "pyproject.toml").unlink()
    result = real.run("gc", "--json")
    assert result.returncode == 0, result.stderr
    assert len([d for d in json.loads(result.stdout)["done"] if "build cache" in d]) == 1
    assert len(cache_entries(real)) == 2
    assert os.path.isdir(real.venv)


def pip_installs(real: RealWorld) -> list[Call]:
    return [c for c in real.uv_calls() if c[:2] == ["pip", "install"]]


def test_a_new_venv_for_built_skills_installs_them_with_its_runtime_in_one_uv_call(
        real: RealWorld) -> None:
    counted(real, *NAMES)
    runtime = real.runtime_package()
    real.write_config(requirements=[runtime])
    real.ensure()
    real.clear_log()
    out = new_venv(real, "venv2")
    assert sorted(out["installed"]) == NAMES and out["failed"] == []
    [call] = pip_installs(real)  # one uv call: the runtime and the cached wheels together
    assert runtime in call and call.wheels == 3
    assert real.build_env_calls() == [] and builds(real) == Counter(NAMES)
    assert imports_in(real, "venv2", "kb_runtime_demo", *NAMES)
    status = real.run("status", "--json", env={"KERNEL_BOOTSTRAP_VENV": str(real.root / "venv2")})
    assert json.loads(status.stdout)["ready"] is True
    # Recorded as uv records an editable it built: a later `uv pip install -e` is a no-op.
    marker = json.loads((real.root / "venv2" / ".bootstrap-version").read_text())
    assert sorted(marker["skills"]) == NAMES and "attempt" not in marker


def test_a_session_killed_in_the_runtime_call_leaves_the_skills_to_their_own_call(
        real: RealWorld) -> None:
    """After a session died building the runtime, the next one installs the runtime alone
    first, so that it lands (and is recorded) as soon as it can."""
    counted(real, *NAMES)
    runtime = real.runtime_package()
    real.write_config(requirements=[runtime])
    real.ensure()
    package = real.root / "runtime" / "kb-runtime-demo"
    (package / "hang_backend.py").write_text(HANG_BACKEND)
    text = (package / "pyproject.toml").read_text()
    (package / "pyproject.toml").write_text(text.replace(
        'build-backend = "hatchling.build"',
        'build-backend = "hang_backend"\nbackend-path = ["."]'))
    (package / "HANG").write_text("")  # uv builds the changed runtime, and hangs there
    real.clear_log()
    venv2 = {"KERNEL_BOOTSTRAP_VENV": str(real.root / "venv2")}
    proc = start(real, env=venv2)
    try:
        wait_for(lambda: any(c.wheels == 3 for c in pip_installs(real)), 90, proc)
    finally:
        kill_group(proc)
    (package / "HANG").unlink()
    real.clear_log()
    out = new_venv(real, "venv2")
    assert sorted(out["installed"]) == NAMES
    runtime_call, skills_call = pip_installs(real)
    assert runtime in runtime_call and runtime_call.wheels == 0
    assert skills_call.wheels == 3 and runtime not in skills_call
    assert builds(real) == Counter(NAMES)
    assert imports_in(real, "venv2", "kb_runtime_demo", *NAMES)


def test_a_cached_skill_that_cannot_install_fails_alone_and_the_runtime_still_lands(
        real: RealWorld) -> None:
    counted(real, *NAMES)
    real.skill("delta", deps=["alpha>=99"])  # no such alpha: uv cannot resolve it
    runtime = real.runtime_package()
    real.write_config(requirements=[runtime])
    first = real.ensure("--json")
    assert [f["name"] for f in json.loads(first.stdout)["failed"]] == ["delta"]
    assert len(cache_entries(real)) == 4, first.stderr
    real.clear_log()
    out = new_venv(real, "venv2")
    assert sorted(out["installed"]) == NAMES
    assert [f["name"] for f in out["failed"]] == ["delta"]
    assert "alpha" in out["failed"][0]["error"]
    together, *rest = pip_installs(real)
    assert runtime in together and together.wheels == 4  # it failed: nothing was installed
    assert runtime in rest[0] and rest[0].wheels == 0  # then the runtime alone
    assert real.build_env_calls() == []  # every wheel came from the cache
    assert imports_in(real, "venv2", "kb_runtime_demo", *NAMES)

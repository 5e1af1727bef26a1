"""The whole engine driven as a user would, with the real uv on real local skill packages."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.integration.conftest import RealWorld


def start(world: RealWorld, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(world.command("ensure", *args), env=world.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_cold_then_warm(real: RealWorld) -> None:
    real.write_config(requirements=[real.runtime_package()])
    real.skill("alpha")
    real.skill("beta")
    real.skill("notes", python=False)
    out = json.loads(real.ensure("--json").stdout)
    assert out["action"] == "rebuild" and sorted(out["installed"]) == ["alpha", "beta"]
    assert real.imports("alpha") and real.imports("beta") and real.imports("kb_runtime_demo")
    # Console scripts of the runtime run from the final path (the venv was built beside it).
    script = subprocess.run([str(real.venv / "bin" / "kb-runtime-demo")], capture_output=True,
                            text=True, check=False)
    assert script.stdout.strip() == "runtime ok", script.stderr
    # One uv call for the venv, one for the runtime, one for both skills.
    assert [c[:2] for c in real.uv_calls()] == [
        ["venv", "--quiet"], ["pip", "install"], ["pip", "install"]]

    marker = real.venv / ".bootstrap-version"
    mtime = marker.stat().st_mtime_ns
    real.clear_log()
    result = real.ensure()
    assert result.stdout == f"{real.python}\n" and result.stderr == ""
    assert real.uv_calls() == []
    assert marker.stat().st_mtime_ns == mtime


def test_killed_mid_build_then_resumed(real: RealWorld) -> None:
    real.write_config(requirements=[real.runtime_package()])
    real.skill("alpha")
    real.ensure()
    real.skill("beta")
    slow = real.hanging_skill("gamma")
    (slow / "HANG").write_text("")
    real.clear_log()
    proc = start(real)
    deadline = time.monotonic() + 60
    while not any("gamma" in real.editables(c) for c in real.installs()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(1.0)  # let uv get into the build
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert real.status()["runtime"] == "current"

    (slow / "HANG").unlink()
    real.clear_log()
    out = json.loads(real.ensure("--json").stdout)
    assert out["action"] == "skills"
    assert sorted(out["installed"]) == ["beta", "gamma"]
    assert real.venv_calls() == []
    # Only what was left; after a kill inside a uv call the next session may split it.
    installed_now = [e for c in real.installs() for e in real.editables(c)]
    assert sorted(installed_now) == ["beta", "gamma"]
    assert not any("kb-runtime-demo" in " ".join(c) for c in real.installs())
    assert real.imports("alpha") and real.imports("beta") and real.imports("gamma")
    assert real.status()["ready"] is True


def test_a_failed_build_is_isolated_and_reported(real: RealWorld) -> None:
    real.skill("alpha")
    real.skill("broken", version="not a version")
    result = real.ensure("--json", "--strict", ok=False)
    assert result.returncode == 3
    out = json.loads(result.stdout)
    assert out["installed"] == ["alpha"]
    assert [f["name"] for f in out["failed"]] == ["broken"]
    assert "broken" in result.stderr
    assert real.imports("alpha")
    states = {s["name"]: s for s in real.status()["skills"]}
    assert states["broken"]["state"] == "failed" and states["broken"]["error"]


def test_skills_depending_on_each_other_install_with_the_real_resolver(
        real: RealWorld) -> None:
    real.skill("base-skill")
    real.skill("top-skill", deps=("base-skill",))
    real.ensure()
    assert real.imports("top_skill") and real.imports("base_skill")
    real.clear_log()
    real.skill("top-skill", deps=("base-skill",), version="0.2.0")
    out = json.loads(real.ensure("--json").stdout)
    assert out["installed"] == ["top-skill"]


def test_a_failed_rebuild_keeps_the_old_venv_working_and_recognised(real: RealWorld) -> None:
    real.write_config(requirements=[real.runtime_package()])
    real.skill("alpha")
    real.ensure()
    marker = (real.venv / ".bootstrap-version").read_bytes()
    real.write_config(requirements=[real.runtime_package(), "kb-no-such-package-xyz==1.0"])
    result = real.run("ensure")
    assert result.returncode == 1
    assert "kb-no-such-package-xyz" in result.stderr and "Traceback" not in result.stderr
    assert real.imports("alpha") and real.imports("kb_runtime_demo")
    assert (real.venv / ".bootstrap-version").read_bytes() == marker
    assert not [p for p in real.root.iterdir() if ".stage-" in p.name]

    real.write_config(requirements=[real.runtime_package()])
    real.clear_log()
    real.ensure()
    assert real.uv_calls() == []


def test_repair_reinstalls_a_skill_deleted_by_hand_then_ensure_is_warm(
        real: RealWorld) -> None:
    real.skill("alpha")
    real.ensure()
    site = next((real.venv / "lib").glob("python*/site-packages"))
    for path in site.iterdir():
        if path.name.startswith(("alpha-", "_alpha")) or "alpha" in path.name:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert not real.imports("alpha")
    result = real.run("repair")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "alpha" in result.stdout
    assert real.imports("alpha")
    real.clear_log()
    real.ensure()
    assert real.uv_calls() == []


def test_a_snapshot_restores_with_an_empty_uv_cache(real: RealWorld, tmp_path_factory: object
                                                    ) -> None:
    real.write_config(requirements=[real.runtime_package()], snapshots="store")
    real.skill("alpha")
    real.ensure()
    assert len(list((real.root / "store").glob("*.tar"))) == 1
    real.clear_log()
    empty_cache = real.root / "empty-uv-cache"
    other = real.root / "other"
    result = real.ensure("--json", env={"KERNEL_BOOTSTRAP_VENV": str(other),
                                        "UV_CACHE_DIR": str(empty_cache)})
    out = json.loads(result.stdout)
    assert out["action"] == "rebuild" and out["installed"] == [], result.stderr
    assert real.venv_calls() == [] and real.installs() == []
    for module in ("alpha", "kb_runtime_demo"):
        assert subprocess.run([str(other / "bin" / "python"), "-c", f"import {module}"],
                              check=False).returncode == 0
    script = subprocess.run([str(other / "bin" / "kb-runtime-demo")], capture_output=True,
                            text=True, check=False)
    assert script.stdout.strip() == "runtime ok"


@pytest.mark.parametrize("batched", ["1", "0"])
def test_skill_paths_reach_uv_as_themselves(real: RealWorld, batched: str) -> None:
    # "-e /x/proj #2/sk1" in a requirements file made uv install /x/proj (the rest read as a
    # comment). Paths go as percent-encoded file:// URLs, which uv decodes exactly; a "#",
    # which no URL or path in that file survives, from a uv running beside the skill
    # (issue 22), whether it comes built (batched) or as an -e line for uv to build.
    real.env["KERNEL_BOOTSTRAP_BATCH_BUILDS"] = batched
    decoy = real.skills_dir / "proj"
    (decoy / "decoy").mkdir(parents=True)
    (decoy / "decoy" / "__init__.py").write_text("")
    (decoy / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "decoy"\nversion = "1.0"\n')
    odd = real.skills_dir / "odd dir; 'q' %41 \u00e9" / "oddskill"
    hashed = real.skills_dir / "proj #2" / "sk1"
    for target in (odd, hashed):
        target.parent.mkdir()
        real.skill(target.name).rename(target)
    real.write_config(skills=[str(odd), str(hashed)])
    result = real.ensure("--json")
    out = json.loads(result.stdout)
    assert sorted(out["installed"]) == ["oddskill", "sk1"], result.stderr
    assert real.imports("oddskill") and real.imports("sk1") and not real.imports("decoy")
    hashed_probe = subprocess.run([str(real.python), "-c", "import sk1; print(sk1.__file__)"],
                                  capture_output=True, text=True, check=True)
    assert hashed_probe.stdout.strip().startswith(str(hashed))
    real.clear_log()
    assert json.loads(real.ensure("--json").stdout)["action"] == "ready"
    probe = subprocess.run([str(real.python), "-c", "import oddskill; print(oddskill.__file__)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip().startswith(str(odd))


def test_a_renamed_project_leaves_one_distribution(real: RealWorld) -> None:
    # Both used to stay installed: two dist-infos and two .pth files for one skill tree.
    real.skill("alpha")
    real.ensure()
    real.skill("alpha", project="alpha-tools")
    out = json.loads(real.ensure("--json").stdout)
    assert out["installed"] == ["alpha"] and out["failed"] == []
    listed = subprocess.run([str(real.uv), "pip", "list", "--python", str(real.python),
                             "--format", "json"], capture_output=True, text=True, check=True,
                            env=real.env)
    names = sorted(d["name"] for d in json.loads(listed.stdout))
    assert "alpha-tools" in names and "alpha" not in names
    site = next(real.venv.glob("lib/python*/site-packages"))
    assert sorted(p.name for p in site.glob("alpha*.dist-info")) == ["alpha_tools-0.1.0.dist-info"]
    assert real.imports("alpha")

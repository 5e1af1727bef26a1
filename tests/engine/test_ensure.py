"""`ensure` end to end against fake uv: the ready gate, skills-only and rebuild paths."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from testing.seams import Seam, seam_argv, seam_env
from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("beta")
    w.skill("notes", python=False)
    return w


def test_cold_start_builds_the_venv_and_prints_only_the_interpreter(world: World) -> None:
    result = world.ensure()
    assert result.stdout == f"{world.python}\n"
    assert len(world.venv_calls()) == 1
    assert world.imports("alpha") and world.imports("beta")
    marker = world.marker()
    assert marker["schema"] == 1
    assert sorted(marker["skills"]) == ["alpha", "beta"]
    assert marker["skills"]["alpha"]["path"] == str(world.skills_dir / "alpha")


def test_warm_start_runs_no_uv_and_writes_nothing(world: World) -> None:
    world.ensure()
    marker = world.venv / ".bootstrap-version"
    before = marker.stat().st_mtime_ns
    world.clear_log()
    result = world.ensure("--json")
    assert json.loads(result.stdout)["action"] == "ready"
    assert world.uv_calls() == []
    assert marker.stat().st_mtime_ns == before
    assert result.stderr == ""


def test_all_pending_skills_go_in_one_uv_call_through_a_requirements_file(world: World) -> None:
    world.ensure()
    skill_installs = [c for c in world.installs() if "-r" in c]
    assert len(skill_installs) == 1
    assert sorted(world.editables(skill_installs[0])) == ["alpha", "beta"]


def test_a_source_edit_needs_no_uv_call(world: World) -> None:
    world.ensure()
    world.clear_log()
    (world.skills_dir / "alpha" / "src" / "alpha" / "__init__.py").write_text("VALUE = 2\n")
    assert json.loads(world.ensure("--json").stdout)["action"] == "ready"
    assert world.uv_calls() == []


def test_a_pyproject_change_reinstalls_only_that_skill(world: World) -> None:
    world.ensure()
    world.clear_log()
    world.skill("beta", version="0.2.0")
    out = json.loads(world.ensure("--json").stdout)
    assert out["action"] == "skills"
    assert out["installed"] == ["beta"]
    assert world.venv_calls() == []
    assert [world.editables(c) for c in world.installs()] == [["beta"]]


def test_an_added_skill_installs_alone_and_a_removed_one_is_uninstalled(world: World) -> None:
    world.ensure()
    world.clear_log()
    world.skill("gamma")
    out = json.loads(world.ensure("--json").stdout)
    assert out["installed"] == ["gamma"]
    assert [world.editables(c) for c in world.installs()] == [["gamma"]]

    world.clear_log()
    import shutil

    shutil.rmtree(world.skills_dir / "alpha")
    out = json.loads(world.ensure("--json").stdout)
    assert out["removed"] == ["alpha"]
    assert [c[:2] for c in world.uv_calls()] == [["pip", "uninstall"]]
    assert not world.imports("alpha")
    assert "alpha" not in world.marker()["skills"]
    assert world.venv_calls() == [] and world.installs() == []


def test_a_failed_skill_is_isolated_reported_and_retried(world: World) -> None:
    world.skill("gamma")
    result = world.ensure("--json", env={"FAKE_UV_FAIL": "beta"})
    out = json.loads(result.stdout)
    assert sorted(out["installed"]) == ["alpha", "gamma"]
    assert [f["name"] for f in out["failed"]] == ["beta"]
    assert "fake build failure" in out["failed"][0]["error"]
    assert "beta" in result.stderr  # the warning names the skill
    assert world.imports("alpha") and world.imports("gamma") and not world.imports("beta")
    marker = world.marker()
    assert "beta" in marker["failed"] and "beta" not in marker["skills"]

    status = world.status()
    assert {s["name"]: s["state"] for s in status["skills"]}["beta"] == "failed"
    assert status["ready"] is True  # as `ensure` said: the kernel starts, without beta

    # The next start retries the failed skill only, and succeeds once uv does.
    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert out["installed"] == ["beta"] and out["failed"] == []
    assert [world.editables(c) for c in world.installs()] == [["beta"]]


def test_strict_exits_3_when_a_skill_failed(world: World) -> None:
    result = world.ensure("--strict", env={"FAKE_UV_FAIL": "alpha"}, ok=False)
    assert result.returncode == 3
    assert result.stdout == f"{world.python}\n"


def test_a_skill_depending_on_a_failed_skill_is_reported_not_attempted(world: World) -> None:
    world.skill("gamma", deps=("beta",))
    result = world.ensure("--json", env={"FAKE_UV_FAIL": "beta", "FAKE_UV_OFFINDEX": "beta"})
    failed = {f["name"]: f["error"] for f in json.loads(result.stdout)["failed"]}
    assert sorted(failed) == ["beta", "gamma"]
    assert "depends on skill 'beta'" in failed["gamma"]


def test_skills_depending_on_each_other_install_together(world: World) -> None:
    world.skill("gamma", deps=("beta",))
    world.ensure(env={"FAKE_UV_OFFINDEX": "beta"})
    assert world.imports("gamma") and world.imports("beta")
    # Reinstalling the dependent alone still brings its configured dependency into the call.
    world.clear_log()
    world.skill("gamma", deps=("beta",), version="0.3.0")
    world.ensure(env={"FAKE_UV_OFFINDEX": "beta"})
    assert [sorted(world.editables(c)) for c in world.installs()] == [["beta", "gamma"]]


@pytest.mark.parametrize("content", [
    b"", b"{", b"{\"schema\": 1", b"[1, 2]", b"\x00\xff garbage",
    b'{"schema": 1, "runtime": "nope", "skills": {}, "failed": {}, "updated": 0}',
    b'{"schema": 1, "runtime": {"identity": "x", "python": "p", "inputs": {}}, '
    b'"skills": {"a": 3}, "failed": {}, "updated": 0}',
])
def test_a_corrupt_or_truncated_marker_warns_by_name_and_rebuilds(
        world: World, content: bytes) -> None:
    world.ensure()
    (world.venv / ".bootstrap-version").write_bytes(content)
    world.clear_log()
    result = world.ensure("--json")
    assert json.loads(result.stdout)["action"] == "rebuild"
    assert "marker" in result.stderr and ".bootstrap-version" in result.stderr
    assert len(world.venv_calls()) == 1
    assert world.imports("alpha")
    assert world.status()["ready"] is True


@pytest.mark.parametrize("schema", [0, 2, "1", None, True])
def test_a_legacy_marker_rebuilds(world: World, schema: object) -> None:
    world.ensure()
    marker = world.marker()
    marker["schema"] = schema
    (world.venv / ".bootstrap-version").write_text(json.dumps(marker))
    assert world.status()["marker"] == "legacy"
    world.clear_log()
    assert json.loads(world.ensure("--json").stdout)["action"] == "rebuild"
    assert world.marker()["schema"] == 1


def test_a_deleted_interpreter_rebuilds_at_the_same_path(world: World) -> None:
    world.ensure()
    world.python.unlink()
    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert out["action"] == "rebuild" and out["python"] == str(world.python)
    assert world.imports("alpha")


def test_a_runtime_change_rebuilds_at_the_same_path_and_reinstalls_skills(world: World) -> None:
    world.ensure()
    world.write_config(requirements=["requests>=2"])
    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert out["action"] == "rebuild" and out["python"] == str(world.python)
    assert world.imports("requests") and world.imports("alpha")
    assert len(world.venv_calls()) == 1


def test_base_marker_is_written_before_skills_so_status_reports_them_pending(
        world: World) -> None:
    # A skill install that fails for every skill leaves exactly what a killed sync leaves:
    # the base marker with no skills recorded.
    world.ensure(env={"FAKE_UV_FAIL": "alpha,beta"})
    status = world.status()
    assert status["runtime"] == "current" and status["marker"] == "ok"
    world.clear_log()
    world.ensure()
    assert world.venv_calls() == []
    assert not any("requests" in " ".join(c) for c in world.installs())


def test_status_reports_every_field_of_the_contract(world: World) -> None:
    world.ensure()
    status = world.status()
    assert set(status) >= {"ready", "venv", "python", "marker", "runtime", "skills", "lock"}
    assert status["ready"] is True
    assert status["lock"] == {"held": False, "pid": None}
    skills = {s["name"]: s for s in status["skills"]}
    assert skills["notes"] == {"name": "notes", "python": False, "state": "installed",
                               "error": None, "warnings": [],
                               "path": str(world.skills_dir / "notes")}
    assert skills["alpha"]["state"] == "installed"
    world.skill("alpha", version="9.0")
    assert {s["name"]: s["state"] for s in world.status()["skills"]}["alpha"] == "stale"


def test_status_on_a_cold_machine_creates_nothing_and_exits_1(world: World) -> None:
    before = sorted(p.relative_to(world.root) for p in world.root.rglob("*"))
    home = Path(world.env["HOME"])
    home_before = sorted(home.rglob("*"))
    result = world.run("status", "--json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["ready"] is False and data["marker"] == "missing"
    assert {s["state"] for s in data["skills"] if s["python"]} == {"pending"}
    assert sorted(p.relative_to(world.root) for p in world.root.rglob("*")) == before
    assert sorted(home.rglob("*")) == home_before
    assert world.uv_calls() == []
    human = world.run("status")
    assert "ready:   no" in human.stdout and human.returncode == 1


def test_uv_missing_is_exit_1_saying_so(world: World) -> None:
    result = world.run("ensure", env={"KERNEL_BOOTSTRAP_UV": str(world.root / "nope")})
    assert result.returncode == 1
    assert "KERNEL_BOOTSTRAP_UV" in result.stderr and "uv" in result.stderr
    assert "Traceback" not in result.stderr
    assert not world.venv.exists()


def test_the_lock_lives_beside_the_venv(world: World) -> None:
    world.ensure()
    assert (world.root / "venv.lock").exists()
    assert not any(p.name.endswith(".lock") for p in world.venv.iterdir())


def test_env_override_of_the_venv_path(world: World) -> None:
    other = world.root / "elsewhere"
    result = world.ensure(env={"KERNEL_BOOTSTRAP_VENV": str(other)})
    assert result.stdout.strip() == str(other / "bin" / "python")
    assert not world.venv.exists()


def test_a_directory_that_is_not_a_venv_is_never_replaced(world: World) -> None:
    world.venv.mkdir()
    (world.venv / "precious.txt").write_text("mine")
    result = world.run("ensure")
    assert result.returncode == 2
    assert "not a virtual environment" in result.stderr
    assert (world.venv / "precious.txt").read_text() == "mine"


def test_warm_path_sees_a_new_skill_matching_the_glob(world: World) -> None:
    world.ensure()
    world.clear_log()
    world.skill("gamma")
    out = json.loads(world.ensure("--json").stdout)
    assert out["installed"] == ["gamma"]


def test_a_failing_skill_installed_alone_is_not_tried_twice(world: World) -> None:
    world.ensure()
    world.clear_log()
    world.skill("beta", version="0.2.0")
    result = world.ensure("--json", env={"FAKE_UV_FAIL": "beta"})
    assert [f["name"] for f in json.loads(result.stdout)["failed"]] == ["beta"]
    assert len(world.installs()) == 1


def test_a_venv_whose_parent_cannot_hold_scratch_space_still_syncs_skills(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    # Scratch space goes beside the venv; a parent that refuses it (a venv provisioned under
    # a directory the user cannot write) must not fail the sync. As root a read-only mode does
    # not refuse anything, so the refusal is injected at the seam: the scratch path.
    from bootstrap.config import load_config
    from bootstrap.engine import ensure
    from bootstrap.skills import sync

    world.ensure()
    world.skill("gamma")
    for var, value in world.env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(sync, "work_path", lambda venv: world.root / "absent" / "work")
    result = ensure.ensure(load_config(world.config))
    assert result.action == "skills" and result.installed == ("gamma",)
    assert world.imports("gamma")
    assert not (world.root / "absent").exists()


def _project(directory: Path, name: str) -> None:
    (directory / "src" / name).mkdir(parents=True)
    (directory / "src" / name / "__init__.py").write_text(f"VALUE = {name!r}\n")
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "1.0"\n'
        f'[tool.hatch.build.targets.wheel]\npackages = ["src/{name}"]\n')


def test_skills_under_paths_with_hash_are_installed_as_themselves_from_beside_them(
        tmp_path: Path) -> None:
    # uv read "-e /x/proj #2/skills/sk1" as "-e /x/proj" (the rest a comment) and installed
    # the project that lives there; then such a skill failed by name. uv reaches it as
    # "-e ./sk1" from a working directory beside it (issue 22), one call per such directory.
    world = World(tmp_path)
    _project(world.skills_dir / "proj", "decoy")
    skills = [world.skills_dir / "proj #2" / "sk1", world.skills_dir / "proj #2" / "sk2",
              world.skills_dir / "other #3" / "sk3"]
    for skill in skills:
        skill.parent.mkdir(exist_ok=True)
        world.skill(skill.name).rename(skill)
    world.skill("alpha")
    world.write_config(skills=["skills/*", "skills/proj #2/*", "skills/other #3/*"])
    result = world.ensure("--json")
    out = json.loads(result.stdout)
    assert sorted(out["installed"]) == ["alpha", "sk1", "sk2", "sk3"], result.stderr
    assert out["failed"] == []
    for skill in skills:
        assert world.marker()["skills"][skill.name]["path"] == str(skill)
        assert world.imports(skill.name)
    assert not world.imports("decoy")
    assert sorted(sorted(world.editables(c)) for c in world.installs()) == [
        ["alpha", "sk1", "sk2"], ["sk3"]]
    world.clear_log()
    assert json.loads(world.ensure("--json").stdout)["action"] == "ready"
    assert world.installs() == []


@pytest.mark.parametrize("name", ["sp ace;x=1 'q'", "tab\tx", "pct%41x", "uni-\u00e9"])
def test_a_skill_under_an_odd_path_is_installed_and_recorded_as_itself(
        tmp_path: Path, name: str) -> None:
    world = World(tmp_path)
    _project(world.skills_dir / "sp", "decoy")
    skill = world.skills_dir / name / "odd"
    skill.parent.mkdir()
    world.skill("odd").rename(skill)
    world.write_config(skills=[f"skills/{name}/odd"])
    out = json.loads(world.ensure("--json").stdout)
    assert out["installed"] == ["odd"] and out["failed"] == []
    assert world.marker()["skills"]["odd"]["path"] == str(skill)
    assert world.imports("odd") and not world.imports("decoy")


def test_a_full_disk_while_preparing_the_skill_sync_names_the_file_and_leaves_no_attempt(
        world: World) -> None:
    # It ended with a bare "[Errno 28] No space left on device", and the attempt it had noted
    # stayed in the marker, so the next session halved its groups for no reason.
    world.ensure()
    for name in ("gamma", "delta", "epsilon"):
        world.skill(name)
    env = seam_env(world.env, Seam(call="write", action="ENOSPC", match="skills.txt"))
    result = subprocess.run(seam_argv(["ensure", "--config", str(world.config)]),
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 1, result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: could not write ") and "skills.txt" in error
    assert "No space left on device" in error and "kernel-bootstrap ensure" in error
    assert "Traceback" not in result.stderr
    assert "attempt" not in world.marker()

    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert sorted(out["installed"]) == ["delta", "epsilon", "gamma"]
    assert [len(world.editables(c)) for c in world.installs()] == [3]


def test_a_rebuild_from_the_cli_imports_neither_structlog_nor_packaging(world: World) -> None:
    # Together ~0.1-0.2 s of a rebuild whose uv work takes well under a second (issue 13): the
    # CLI renders its own log lines, and plain requirements need no PEP 508 parser.
    import sys

    world.write_config(requirements=["requests>=2", "six"])
    result = subprocess.run([sys.executable, "-X", "importtime", *world.command("ensure")[1:]],
                            capture_output=True, text=True, check=True,
                            env={**world.env, "KERNEL_BOOTSTRAP_LOG_FORMAT": "json"})
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert "building the runtime" in [e["event"] for e in events]
    assert all({"event", "level", "timestamp"} <= set(e) for e in events)
    assert world.imports("requests") and world.imports("alpha")
    assert not {"structlog", "packaging", "packaging.requirements"} & imported

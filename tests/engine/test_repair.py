"""`repair`: find what is really wrong, fix it, leave a marker that makes the next start warm."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("beta")
    w.write_config(requirements=["requests>=2"])
    w.ensure()
    w.clear_log()
    return w


def site_packages(world: World) -> Path:
    [site] = world.venv.glob("lib/python*/site-packages")
    return site


def repair(world: World, *args: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return world.run("repair", *args, env=env)


def repair_json(world: World, *args: str) -> dict[str, Any]:
    result = repair(world, "--json", *args)
    data: dict[str, Any] = json.loads(result.stdout)
    assert result.returncode == (0 if data["healthy"] else 1), result.stderr
    return data


def assert_warm_next(world: World) -> None:
    world.clear_log()
    assert json.loads(world.ensure("--json").stdout)["action"] == "ready"
    assert world.uv_calls() == []


def test_a_healthy_venv_needs_nothing(world: World) -> None:
    result = repair(world)
    assert result.returncode == 0, result.stderr
    assert "found: nothing wrong" in result.stdout
    assert "done" not in result.stdout
    assert "healthy: yes" in result.stdout
    assert world.uv_calls() == []


def test_a_skill_whose_dist_info_and_pth_were_deleted_is_reinstalled(world: World) -> None:
    site = site_packages(world)
    shutil.rmtree(next(site.glob("alpha-*.dist-info")))
    next(site.glob("*alpha*.pth")).unlink()
    assert not world.imports("alpha")
    # The marker still says installed: only a deep look can tell.
    assert world.status()["ready"] is True

    result = repair(world)
    assert result.returncode == 0, result.stderr
    assert "found:\n  - skill alpha: distribution alpha is not installed" in result.stdout
    assert "done:\n  - reinstalled skill alpha" in result.stdout
    assert "healthy: yes" in result.stdout
    assert world.imports("alpha") and world.imports("beta")
    assert [world.editables(c) for c in world.installs()] == [["alpha"]]
    assert world.venv_calls() == []
    assert_warm_next(world)


def test_a_skill_that_no_longer_imports_is_reinstalled(world: World) -> None:
    next(site_packages(world).glob("*beta*.pth")).unlink()
    data = repair_json(world)
    assert data["found"] == ["skill beta: import beta: ModuleNotFoundError: "
                             "No module named 'beta'"]
    assert data["done"] == ["reinstalled skill beta"]
    assert data["healthy"] is True and world.imports("beta")
    assert_warm_next(world)


def test_json_output_has_the_documented_shape(world: World) -> None:
    data = repair_json(world)
    assert data == {"healthy": True, "python": str(world.python), "found": [], "done": [],
                    "remaining": []}


def test_force_rebuilds_from_scratch_into_a_new_generation(world: World) -> None:
    before = os.readlink(world.venv)
    data = repair_json(world, "--force")
    assert data["healthy"] is True
    assert data["found"] == []
    assert data["done"][0].startswith("rebuilt the runtime at ")
    [venv_call] = world.venv_calls()
    # Built in a new generation, which the link now names (never the one it replaces).
    assert os.path.basename(venv_call[-1]) == os.readlink(world.venv) != before
    assert world.imports("requests") and world.imports("alpha") and world.imports("beta")
    assert_warm_next(world)


def test_a_requirement_uninstalled_by_hand_rebuilds_the_runtime(world: World) -> None:
    subprocess.run([str(world.uv), "pip", "uninstall", "--python", str(world.python),
                    "requests"], env=world.env, check=True, capture_output=True)
    world.clear_log()
    assert not world.imports("requests")
    data = repair_json(world)
    assert data["found"] == ["requirement requests>=2: not installed"]
    assert data["done"][0].startswith("rebuilt the runtime")
    assert data["healthy"] is True and data["remaining"] == []
    assert len(world.venv_calls()) == 1
    assert world.imports("requests") and world.imports("alpha")
    assert_warm_next(world)


def test_a_rebuild_that_fails_reports_it_and_keeps_the_old_venv(world: World) -> None:
    subprocess.run([str(world.uv), "pip", "uninstall", "--python", str(world.python),
                    "requests"], env=world.env, check=True, capture_output=True)
    result = repair(world, env={"FAKE_UV_FAIL": "requests"})
    assert result.returncode == 1
    assert "  - the rebuild failed, nothing was changed" in result.stdout
    assert "Failed to download `requests`" in result.stdout
    assert "still wrong:\n  - requirement requests>=2: not installed" in result.stdout
    assert "healthy: no" in result.stdout
    assert world.imports("alpha")  # the old venv, untouched
    # Nothing beside it but its own generation: the failed one is gone.
    assert [p.name for p in world.venv.parent.glob(".venv.*")] == [os.readlink(world.venv)]


def test_a_failing_ready_check_is_found_and_a_rebuild_attempted(world: World) -> None:
    world.write_config(requirements=["requests>=2"], ready_check="import six")
    data = repair_json(world)
    assert data["found"] == ["the ready-check fails: ModuleNotFoundError: No module named 'six'"]
    assert data["done"][0].startswith("the rebuild failed")
    assert data["healthy"] is False
    assert world.imports("alpha")


def test_a_rebuild_for_a_failing_ready_check_logs_why(world: World) -> None:
    # `repair` without --force logged "rebuild from scratch requested" (issue 22).
    world.write_config(requirements=["requests>=2"], ready_check="import six")
    as_json = {"KERNEL_BOOTSTRAP_LOG_FORMAT": "json"}
    result = repair(world, "--json", env=as_json)
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    [building] = [e for e in events if e["event"] == "building the runtime"]
    assert building["why"] == ["the ready-check fails: ModuleNotFoundError: No module named "
                               "'six'"]
    forced = repair(world, "--force", "--json", env=as_json)
    [building] = [json.loads(line) for line in forced.stderr.splitlines()
                  if line.startswith("{") and "building the runtime" in line]
    assert building["why"][-1] == "rebuild from scratch requested"


def test_marker_records_that_disagree_with_the_config_are_synced(world: World) -> None:
    shutil.rmtree(world.skills_dir / "beta")
    data = repair_json(world)
    assert data["found"] == ["skill beta: recorded in the marker but no longer configured"]
    assert data["done"] == ["uninstalled skill beta (no longer configured)"]
    assert not world.imports("beta")
    assert_warm_next(world)


def test_a_cold_machine_is_built(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.skill("alpha")
    data = repair_json(world)
    assert data["found"] == [f"runtime missing: no marker in {world.venv}"]
    assert data["done"][:2] == [f"rebuilt the runtime at {world.venv} (staged, then swapped "
                                "into place)", "installed skill alpha"]
    assert data["healthy"] is True


def test_a_failing_probe_names_its_purpose_not_its_whole_script(tmp_path: Path) -> None:
    from bootstrap.env.probe import probe
    from bootstrap.errors import ProcessError

    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'cannot start' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(ProcessError) as caught:
        probe(broken, ["requests"], {})
    message = str(caught.value)
    assert "<probe:" in message and "cannot start" in message
    assert "importlib.metadata" not in message and len(message.splitlines()) < 8


# -- files checked against each distribution's RECORD (issue 31, item 8) ---------------------

def test_a_runtime_file_deleted_by_hand_is_found_and_reinstalled(world: World) -> None:
    """`rm site-packages/six.py`: the metadata still said installed, and repair said healthy.
    (Deleting a package's __init__.py leaves a namespace package: `import` does not tell.)"""
    lost = site_packages(world) / "requests" / "__init__.py"
    lost.unlink()
    assert world.imports("requests")
    data = repair_json(world)
    assert data["found"] == ["package requests 2: requests/__init__.py is missing"]
    assert data["done"][0].startswith("rebuilt the runtime")
    assert data["healthy"] is True and data["remaining"] == []
    assert (site_packages(world) / "requests" / "__init__.py").is_file()
    assert world.imports("alpha") and world.imports("beta")
    assert_warm_next(world)


def test_a_runtime_file_changed_in_place_is_found_by_its_hash(world: World) -> None:
    path = site_packages(world) / "requests" / "__init__.py"
    text = path.read_text()
    path.write_text(text.replace("2", "3"))  # the same size
    data = repair_json(world)
    assert data["found"] == ["package requests 2: requests/__init__.py differs from what was "
                             "installed"]
    assert data["healthy"] is True and data["done"][0].startswith("rebuilt the runtime")
    assert path.read_text() == text  # through <venv>: the new generation's file


def test_a_damaged_skill_distribution_is_reinstalled_alone(world: World) -> None:
    installer = next(site_packages(world).glob("alpha-*.dist-info")) / "INSTALLER"
    installer.write_text("someone else\n")
    data = repair_json(world)
    [found] = data["found"]
    assert found.startswith("skill alpha: files damaged: alpha 0.1.0: alpha-0.1.0.dist-info/"
                            "INSTALLER has 13 bytes, its RECORD says ")
    assert data["done"] == ["reinstalled skill alpha"] and data["healthy"] is True
    assert world.venv_calls() == [] and installer.read_text() == "uv"
    assert_warm_next(world)


def test_a_rebuild_that_lands_torn_again_is_reported_and_the_old_venv_kept(
        world: World) -> None:
    (site_packages(world) / "requests" / "__init__.py").unlink()
    before = os.readlink(world.venv)
    result = repair(world, "--json", env={"FAKE_UV_PARTIAL": "requests"})
    data = json.loads(result.stdout)
    assert result.returncode == 1
    [done] = data["done"]
    assert done.startswith("the rebuild failed, nothing was changed: the new venv at ")
    assert "(requests 2: requests/__init__.py is missing)" in done
    assert data["remaining"] == ["package requests 2: requests/__init__.py is missing"]
    assert os.readlink(world.venv) == before and world.imports("alpha")

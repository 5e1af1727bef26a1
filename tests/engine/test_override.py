"""KERNEL_BOOTSTRAP_PYTHON: an interpreter used as it is, checked now rather than failing later."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.env.probe import ProbeResult, unmet_requirements
from testing.world import World


def provided_env(world: World, name: str, *requirements: str,
                 python: str | None = None) -> Path:
    """A venv made by the fake uv with ``requirements`` installed: the platform's own env."""
    root = world.root / name
    uv = [str(world.uv)]
    subprocess.run([*uv, "venv", str(root), *(["--python", python] if python else [])],
                   env=world.env, check=True, capture_output=True)
    if requirements:
        subprocess.run([*uv, "pip", "install", "--python", str(root / "bin" / "python"),
                        *requirements], env=world.env, check=True, capture_output=True)
    return root / "bin" / "python"


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.write_config(requirements=["requests>=2", "six==1.16"])
    return w


@pytest.fixture
def platform_python(world: World) -> Path:
    python = provided_env(world, "platform", "requests==2.31", "six==1.16")
    world.clear_log()
    return python


def override(world: World, python: Path | str, *args: str,
             ok: bool = False) -> subprocess.CompletedProcess[str]:
    return world.ensure(*args, env={"KERNEL_BOOTSTRAP_PYTHON": str(python)}, ok=ok)


def test_a_satisfying_interpreter_is_used_as_given_and_nothing_is_built(
    world: World, platform_python: Path
) -> None:
    subprocess.run([str(world.uv), "pip", "install", "--python", str(platform_python),
                    "-e", str(world.skills_dir / "alpha")], env=world.env, check=True,
                   capture_output=True)
    world.clear_log()
    result = override(world, platform_python, ok=True)
    assert result.stdout == f"{platform_python}\n"
    assert "alpha" not in result.stderr  # it imports: no warning
    out = json.loads(override(world, platform_python, "--json", ok=True).stdout)
    assert out["action"] == "override"
    assert out["python"] == str(platform_python)
    assert out["venv"] == str(platform_python.parent.parent)
    assert out["failed"] == []
    assert world.uv_calls() == []
    assert not world.venv.exists()
    assert not (world.root / "venv.lock").exists()


def test_the_override_wins_over_a_warm_managed_venv(world: World, platform_python: Path) -> None:
    world.ensure()  # a managed venv, and a warm fingerprint for this config
    result = override(world, platform_python, ok=True)
    assert result.stdout == f"{platform_python}\n"


def test_each_missing_or_mismatched_requirement_is_named(world: World) -> None:
    python = provided_env(world, "platform", "requests==2.31")
    world.write_config(requirements=["requests>=3", "six==1.16", "attrs"])
    result = override(world, python)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "does not satisfy the requirements" in result.stderr
    assert "requests>=3: version 2.31 is installed" in result.stderr
    assert "six==1.16: not installed" in result.stderr
    assert "attrs: not installed" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_skill_that_does_not_import_is_a_warning_naming_it(
    world: World, platform_python: Path
) -> None:
    result = override(world, platform_python, "--json")
    assert result.returncode == 0, result.stderr
    assert "alpha" in result.stderr and "does not import" in result.stderr
    out = json.loads(result.stdout)
    assert [f["name"] for f in out["failed"]] == ["alpha"]
    assert "No module named 'alpha'" in out["failed"][0]["error"]
    assert override(world, platform_python, "--strict").returncode == 3


@pytest.mark.parametrize("given", ["missing/bin/python", "skills/alpha/SKILL.md"])
def test_a_path_that_is_not_an_interpreter_is_exit_1_with_a_clear_message(
    world: World, given: str
) -> None:
    python = world.root / given
    result = override(world, python)
    assert result.returncode == 1
    assert f"KERNEL_BOOTSTRAP_PYTHON={python} is not an executable file" in result.stderr
    assert "Traceback" not in result.stderr
    assert world.uv_calls() == [] and not world.venv.exists()


def test_an_executable_that_is_not_python_is_exit_1(world: World) -> None:
    fake = world.root / "not-python"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    result = override(world, fake)
    assert result.returncode == 1
    assert f"the interpreter {fake} does not run" in result.stderr


def probed(python_version: str) -> ProbeResult:
    return ProbeResult("x", {"six": None}, {}, {"python_version": python_version,
                                                 "python_full_version": python_version + ".0"})


def test_requirement_markers_are_evaluated_for_the_probed_interpreter() -> None:
    requirement = 'six; python_version < "3.0"'
    assert unmet_requirements([requirement], probed("3.11")) == []
    assert unmet_requirements([requirement], probed("2.7")) == [f"{requirement}: not installed"]


def other_python() -> str | None:
    """An interpreter of another minor version than ours, if this machine has one."""
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = sorted(glob.glob("/usr/bin/python3.1*") + glob.glob("/usr/local/bin/python3.1*")
                        + glob.glob("/root/.pyenv/versions/3.1*/bin/python3.1*"))
    for path in candidates:
        name = Path(path).name
        if not name.endswith("-config") and name.count(".") == 1 and name[6:] != ours:
            return path
    return None


@pytest.mark.skipif(other_python() is None, reason="needs a Python of another minor version")
def test_a_marker_for_another_python_than_ours_is_judged_by_the_override(world: World) -> None:
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    python = provided_env(world, "other", "requests==2.31", python=other_python())
    world.write_config(requirements=["requests>=2", f'six; python_version == "{ours}"'])
    result = override(world, python)
    assert result.returncode == 0, result.stderr


def test_the_ready_check_runs_in_the_provided_interpreter(world: World,
                                                          platform_python: Path) -> None:
    # A provided interpreter whose ready-check failed was used anyway (issue 22): the kernel
    # then failed later, inside itself.
    world.write_config(requirements=["requests>=2", "six==1.16"],
                       ready_check="import sys; sys.exit('no GPU here')")
    result = override(world, platform_python)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "fails the config's ready-check" in result.stderr and "no GPU here" in result.stderr
    assert str(platform_python) in result.stderr and "Traceback" not in result.stderr
    world.write_config(requirements=["requests>=2", "six==1.16"],
                       ready_check="import sys; assert sys.prefix")
    assert override(world, platform_python, ok=True).stdout == f"{platform_python}\n"

"""Bad input is exit 2 with one message naming the file and the key; nothing is created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootstrap.config import load_config
from tests.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    return w


def assert_rejected(world: World, *needles: str) -> None:
    before = sorted(world.root.rglob("*"))
    result = world.run("ensure")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    assert result.stdout == ""
    assert world.uv_calls() == []
    assert sorted(world.root.rglob("*")) == before
    assert not world.venv.exists() and not (world.root / "venv.lock").exists()


def test_missing_config_file(world: World) -> None:
    world.config.unlink()
    assert_rejected(world, str(world.config), "not found")


def test_invalid_toml(world: World) -> None:
    world.config.write_text("venv = \n")
    assert_rejected(world, str(world.config), "invalid TOML")


def test_unknown_key(world: World) -> None:
    world.config.write_text('venv = "venv"\nrequirement = ["x"]\n')
    assert_rejected(world, str(world.config), "'requirement'")


@pytest.mark.parametrize(("body", "key"), [
    ('requirements = "ipykernel"', "'requirements'"),
    ("venv = 3", "'venv'"),
    ("skills = [1, 2]", "'skills'"),
    ('uv-args = "--offline"', "'uv-args'"),
    ("ready-check = true", "'ready-check'"),
    ('python = ""', "'python'"),
])
def test_wrong_types_name_the_key(world: World, body: str, key: str) -> None:
    world.config.write_text(body + "\n")
    assert_rejected(world, str(world.config), key)


def test_invalid_requirement_is_quoted(world: World) -> None:
    world.write_config(requirements=["ipykernel>=6", "requests >>= 2"])
    assert_rejected(world, "'requests >>= 2'", "requirements[1]")


def test_two_skills_with_one_name_name_both_paths(world: World, tmp_path: Path) -> None:
    other = tmp_path / "more" / "alpha"
    other.mkdir(parents=True)
    (other / "SKILL.md").write_text("# alpha\n")
    world.write_config(skills=["skills/*", "more/alpha"])
    assert_rejected(world, str(world.skills_dir / "alpha"), str(other))


def test_front_matter_name_must_match_the_directory(world: World) -> None:
    (world.skills_dir / "alpha" / "SKILL.md").write_text("---\nname: beta\n---\n")
    assert_rejected(world, "'beta'", "alpha")


def test_a_plain_skill_path_must_be_a_skill(world: World, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    world.write_config(skills=["empty"])
    assert_rejected(world, "SKILL.md", str(tmp_path / "empty"))
    world.write_config(skills=["missing"])
    assert_rejected(world, "not a directory", str(tmp_path / "missing"))


def test_missing_constraints_file(world: World) -> None:
    world.write_config(constraints="constraints.txt")
    assert_rejected(world, "'constraints'", "constraints.txt")


def test_bad_lock_timeout_is_a_usage_error(world: World) -> None:
    result = world.run("ensure", "--lock-timeout", "soon")
    assert result.returncode == 2 and "--lock-timeout" in result.stderr


def test_relative_paths_resolve_against_the_config_directory(world: World) -> None:
    world.write_config(venv="envs/kernel", constraints="c.txt", skills=["skills/*"])
    (world.root / "c.txt").write_text("")
    config = load_config(world.config)
    assert config.venv == world.root / "envs" / "kernel"
    assert config.constraints == world.root / "c.txt"
    assert [s.path for s in config.skills] == [world.skills_dir / "alpha"]


def test_config_discovery_from_the_environment_then_the_current_directory(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNEL_BOOTSTRAP_CONFIG", str(world.config))
    assert load_config().path == world.config
    monkeypatch.delenv("KERNEL_BOOTSTRAP_CONFIG")
    monkeypatch.chdir(world.root)
    assert load_config().path == world.config


def test_default_venv_is_in_the_user_data_dir(world: World) -> None:
    world.config.write_text("")
    config = load_config(world.config)
    assert config.venv.name == "venv" and "kernel-bootstrap" in str(config.venv)


@pytest.mark.parametrize("venv", ["v" * 300, "v" * 200, "deep/" + "d" * 256 + "/venv"])
def test_a_venv_path_too_long_to_use_is_a_config_error_naming_the_key(world: World,
                                                                       venv: str) -> None:
    # A 300-character name was accepted; `status --json` then printed no JSON and `ensure`
    # failed at the lock with a bare "File name too long".
    world.write_config(venv=venv)
    assert_rejected(world, "key 'venv'", "too long")
    status = world.run("status", "--json")
    assert status.returncode == 2 and "key 'venv'" in status.stderr
    assert "Traceback" not in status.stderr


def test_a_venv_path_too_long_from_the_environment_names_the_variable(world: World) -> None:
    result = world.run("ensure", env={"KERNEL_BOOTSTRAP_VENV": str(world.root / ("v" * 300))})
    assert result.returncode == 2 and "KERNEL_BOOTSTRAP_VENV" in result.stderr


def test_the_longest_accepted_venv_name_builds_and_reports(world: World) -> None:
    world.write_config(venv="v" * 191)
    world.ensure()
    status = world.run("status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["ready"] is True

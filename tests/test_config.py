"""Bad input is exit 2 with one message naming the file and the key; nothing is created."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.config import load_config
from bootstrap.errors import ConfigError
from testing.world import World


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
    assert_rejected(world, str(world.config), "does not exist")


def test_invalid_toml(world: World) -> None:
    world.config.write_text("venv = \n")
    assert_rejected(world, str(world.config), "invalid TOML")


@pytest.mark.parametrize(("text", "line"), [
    ("venv = \n", "line 1: venv ="),  # tomllib: "Invalid value (at end of document)"
    ('requirements = ["six",\n\n', 'line 1: requirements = ["six",'),
    ('venv = "v"\nskills = ["skills/*"\nuv-args = []\n', "line 3: uv-args = []"),
    ('venv = "v"\nfoo bar\n', "line 2: foo bar"),
])
def test_invalid_toml_names_and_quotes_the_line(world: World, text: str, line: str) -> None:
    world.config.write_text(text)
    assert_rejected(world, str(world.config), "invalid TOML", f"\n  {line}\n")


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


def test_front_matter_is_not_the_config_s_business(world: World) -> None:
    # A skill that breaks the Agent Skills spec is a failed skill (tests/test_skillmd.py); it
    # used to be a config error that stopped the runtime and every other skill.
    (world.skills_dir / "alpha" / "SKILL.md").write_text("---\nname: beta\n---\n")
    config = load_config(world.config)
    assert [s.name for s in config.skills] == ["alpha"]
    assert "'beta' differs from the directory name 'alpha'" in config.skills[0].spec.problem


def test_a_plain_skill_path_must_be_a_skill(world: World, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    world.write_config(skills=["empty"])
    assert_rejected(world, "SKILL.md", str(tmp_path / "empty"))
    world.write_config(skills=["missing"])
    assert_rejected(world, "not a directory", str(tmp_path / "missing"))


def test_missing_constraints_file(world: World) -> None:
    world.write_config(constraints="constraints.txt")
    assert_rejected(world, "'constraints'", "constraints.txt")


def test_every_missing_path_is_named_at_once(world: World) -> None:
    # README's full example failed once per file: constraints.txt, then pylock.toml.
    world.write_config(constraints="constraints.txt", lock="pylock.toml",
                       skills=["skills/*", "nowhere/*", "../shared/pdf"])
    assert_rejected(world, "4 paths it names do not exist:",
                    f"key 'constraints': file not found: {world.root / 'constraints.txt'}",
                    f"skills[1]: the pattern 'nowhere/*' matches nothing: "
                    f"{world.root / 'nowhere'} does not exist",
                    f"skills[2]: not a directory: {world.root.parent / 'shared' / 'pdf'}",
                    f"key 'lock': file not found: {world.root / 'pylock.toml'}")


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
    assert config.venv.parent == _data_dir() / "venvs"
    assert config.venv.name.startswith(f"{world.root.name}-")


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
    report = json.loads(status.stdout)  # a program reading --json always gets its object
    assert report["ready"] is False and "key 'venv'" in report["error"]


def test_a_venv_path_too_long_from_the_environment_names_the_variable(world: World) -> None:
    result = world.run("ensure", env={"KERNEL_BOOTSTRAP_VENV": str(world.root / ("v" * 300))})
    assert result.returncode == 2 and "KERNEL_BOOTSTRAP_VENV" in result.stderr


@pytest.mark.parametrize("source", ["key", "/", "//", "/."])
def test_the_root_directory_as_the_venv_is_a_config_error_naming_where_it_came_from(
        world: World, source: str) -> None:
    # Every command crashed with "ValueError: PosixPath('/') has an empty name" (exit 1), and
    # `status --json` printed no object (issue 22).
    env = {} if source == "key" else {"KERNEL_BOOTSTRAP_VENV": source}
    if source == "key":
        world.write_config(venv="/")
    where = "key 'venv'" if source == "key" else "KERNEL_BOOTSTRAP_VENV"
    for command in (["ensure"], ["repair"], ["gc"], ["status", "--json"]):
        result = world.run(*command, env=env)
        assert result.returncode == 2, (command, result.stderr)
        assert where in result.stderr and "root directory" in result.stderr
        assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert report["ready"] is False and where in report["error"]


def test_the_longest_accepted_venv_name_builds_and_reports(world: World) -> None:
    world.write_config(venv="v" * 191)
    world.ensure()
    status = world.run("status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["ready"] is True


# -- discovery, pyproject.toml, and mistakes a person makes ---------------------------------------


def _cli(cwd: Path, *args: str, env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bootstrap", *args], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, **(env or {})}, check=False)


def test_a_pyproject_table_is_a_config_source_after_kernel_bootstrap_toml(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.kernel-bootstrap]\nvenv = "from-pyproject"\n')
    assert load_config().venv == tmp_path / "from-pyproject"
    assert load_config().path == tmp_path / "pyproject.toml"
    (tmp_path / "kernel-bootstrap.toml").write_text('venv = "from-own-file"\n')
    assert load_config().venv == tmp_path / "from-own-file"


def test_pyproject_errors_name_the_file_and_the_table(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.kernel-bootstrap]\nvenvv = "x"\n')
    with pytest.raises(ConfigError, match=r"pyproject\.toml \[tool\.kernel-bootstrap\]: "
                                          r"unknown key 'venvv'"):
        load_config()


def test_a_pyproject_without_the_table_is_not_a_config(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(ConfigError, match="run `kernel-bootstrap init`"):
        load_config()


def test_a_missing_config_says_so_and_where_its_name_came_from(tmp_path: Path) -> None:
    result = _cli(tmp_path, "status", "--config", "nope.toml")
    assert (result.returncode, result.stderr) == (2, "error: config file nope.toml does not "
                                                     "exist\n")
    result = _cli(tmp_path, "status", env={"KERNEL_BOOTSTRAP_CONFIG": "env.toml"})
    assert result.returncode == 2
    assert result.stderr == ("error: config file env.toml (from KERNEL_BOOTSTRAP_CONFIG) does "
                             "not exist\n")


def test_a_skills_pattern_with_a_typo_is_an_error_and_nothing_is_removed(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.skill("alpha")
    world.ensure()
    world.write_config(skills=["skils/*"])
    result = world.run("ensure")
    assert result.returncode == 2
    assert "'skils/*'" in result.stderr and "does not exist" in result.stderr
    world.write_config()
    assert world.status()["ready"], "alpha is still installed"


def test_a_skills_pattern_over_an_empty_directory_is_a_warning_naming_it(tmp_path: Path) -> None:
    world = World(tmp_path)
    (tmp_path / "more").mkdir()
    world.write_config(skills=["skills/*", "more/*"])
    result = world.ensure("--log-format", "console")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and any("more/*" in w for w in warnings), result.stderr


@pytest.mark.parametrize("kind", ["FIFO", "character device"])
def test_a_skill_file_that_is_a_fifo_or_device_is_warned_about_by_name(
        tmp_path: Path, kind: str) -> None:
    # The directory was silently not a skill (SKILL.md), or silently a plain one
    # (pyproject.toml) (issue 22).
    world = World(tmp_path)
    world.skill("alpha")
    beta = world.skill("beta", python=False)
    gamma = world.skill("gamma")

    def plant(path: Path) -> None:
        path.unlink()
        if kind == "FIFO":
            os.mkfifo(path)
        else:
            path.symlink_to("/dev/null")

    plant(beta / "SKILL.md")
    plant(gamma / "pyproject.toml")
    result = world.run("ensure", timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"{beta / 'SKILL.md'} is a {kind}, not a file; the directory is not a skill" \
        in result.stderr
    assert f"{gamma / 'pyproject.toml'} is a {kind}, not a file; skill 'gamma' is taken as " \
        "a plain skill" in result.stderr
    world.write_config(skills=["skills/beta"])
    explicit = world.run("ensure", timeout=60)
    assert explicit.returncode == 2
    assert f"{beta / 'SKILL.md'}: is a {kind}, not a file" in explicit.stderr


# -- the default venv belongs to its config (issue 31: two projects shared one) --------------

def _data_dir() -> Path:
    return Path(os.environ["XDG_DATA_HOME"]) / "kernel-bootstrap"


def _project(root: Path, name: str) -> World:
    world = World(root / name)
    world.skill(f"{name}-skill")
    world.write_config(venv=None, requirements=[f"{name}-dep"])
    return world


def test_two_configs_without_venv_get_venvs_of_their_own(tmp_path: Path) -> None:
    first, second = _project(tmp_path, "first"), _project(tmp_path, "second")
    first_venv, second_venv = load_config(first.config).venv, load_config(second.config).venv
    assert first_venv != second_venv
    for venv, name in ((first_venv, "first"), (second_venv, "second")):
        assert venv.parent == _data_dir() / "venvs" and venv.name.startswith(f"{name}-")
    # The config's real path decides: the same file through a symlinked directory is the same.
    (tmp_path / "alias").symlink_to(first.root)
    assert load_config(tmp_path / "alias" / "kernel-bootstrap.toml").venv == first_venv

    # A second project's ensure leaves the first one's venv as it was: ready, and warm.
    assert first.ensure().stdout == f"{first_venv / 'bin' / 'python'}\n"
    assert second.ensure().stdout == f"{second_venv / 'bin' / 'python'}\n"
    status = first.run("status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["ready"] is True
    first.clear_log()
    assert first.ensure().stdout == f"{first_venv / 'bin' / 'python'}\n"
    assert first.uv_calls() == []


def test_status_says_which_venv_a_config_uses_and_why(tmp_path: Path) -> None:
    world = _project(tmp_path, "proj")
    venv = load_config(world.config).venv
    text = world.run("status")
    assert text.stdout.splitlines()[0] == f"venv:    {venv} (this config's default)"
    assert json.loads(world.run("status", "--json").stdout)["venv"] == str(venv)
    chosen = world.run("status", env={"KERNEL_BOOTSTRAP_VENV": str(tmp_path / "elsewhere")})
    assert chosen.stdout.splitlines()[0] == (f"venv:    {tmp_path / 'elsewhere'} "
                                             "(KERNEL_BOOTSTRAP_VENV)")
    world.write_config(venv="venv")
    assert world.run("status").stdout.splitlines()[0] == f"venv:    {world.venv}"


def test_the_shared_default_of_earlier_releases_is_named_until_the_configs_own_exists(
        tmp_path: Path) -> None:
    world = _project(tmp_path, "proj")
    legacy = _data_dir() / "venv"
    legacy.mkdir(parents=True)
    (legacy / "kept").write_text("")
    own = load_config(world.config).venv
    note = (f"warning: configs without `venv` no longer share {legacy}; this one uses "
            f"{own}, built at the next ensure (to keep the old one, set venv = \"{legacy}\" "
            f"in {world.config})\n")
    status = world.run("status")
    assert status.stderr == note
    world.ensure()
    assert world.run("status").stderr == ""
    assert (legacy / "kept").exists(), "the old shared venv is left as it was"

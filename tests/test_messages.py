"""Every expected failure says what happened and what to do next, in one message, no traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap.errors import EXIT_FAILED, EXIT_SKILLS_FAILED, EXIT_USAGE
from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("beta")
    return w


def assert_one_clean_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    return result.stderr


# -- uv missing -----------------------------------------------------------------------------------


def test_uv_missing_everywhere_says_how_to_get_it(world: World, tmp_path: Path) -> None:
    # No uv on PATH, and the bundled one hidden behind a `uv` module that cannot be imported.
    shadow = tmp_path / "shadow" / "uv"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = {k: v for k, v in world.env.items() if k != "KERNEL_BOOTSTRAP_UV"}
    env.update(PATH="/usr/bin:/bin", PYTHONPATH=str(shadow.parent))
    assert shutil.which("uv", path=env["PATH"]) is None
    result = subprocess.run(world.command("ensure"), capture_output=True, text=True, env=env,
                            check=False)
    stderr = assert_one_clean_error(result, EXIT_FAILED)
    assert "uv not found" in stderr
    assert "pip install uv" in stderr and "https://docs.astral.sh/uv/" in stderr
    assert "KERNEL_BOOTSTRAP_UV" in stderr


def test_a_wrong_kernel_bootstrap_uv_names_the_variable_and_the_way_out(world: World,
                                                                       tmp_path: Path) -> None:
    missing = tmp_path / "no" / "uv"
    stderr = assert_one_clean_error(
        world.run("ensure", env={"KERNEL_BOOTSTRAP_UV": str(missing)}), EXIT_FAILED)
    assert f"KERNEL_BOOTSTRAP_UV={missing}" in stderr
    assert "unset it" in stderr and "pip install uv" in stderr


# -- lock timeout ---------------------------------------------------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from bootstrap.primitives.lock import hold, lock_path
with hold(lock_path(Path(sys.argv[1])), 60):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_lock_timeout_names_the_holder_pid_and_status(world: World) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(world.venv)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        started = time.monotonic()
        # Over the ~2 s after which a waiter says whom it waits for.
        result = world.run("ensure", "--lock-timeout", "2.5", "--log-format", "console")
        assert time.monotonic() - started < 30
    finally:
        holder.kill()
        holder.wait()
    stderr = assert_one_clean_error(result, EXIT_FAILED)
    error = next(line for line in stderr.splitlines() if line.startswith("error: "))
    assert "timed out after 2.5 s" in error and str(world.venv) in error
    assert f"held by pid {holder.pid}" in error
    assert "`kernel-bootstrap status`" in error
    assert f"kill {holder.pid}" in error and "--lock-timeout SECONDS" in error
    # Said once while waiting, before giving up.
    [waiting] = [line for line in stderr.splitlines() if line.startswith("warning: ")]
    assert f"pid {holder.pid}" in waiting and "lock" in waiting


# -- a failed skill -------------------------------------------------------------------------------


def test_a_failed_skill_shows_its_uv_error_tail_and_what_to_run_next(world: World) -> None:
    result = world.ensure("--log-format", "console", env={"FAKE_UV_FAIL": "alpha"})
    assert result.stdout == f"{world.python}\n", "still ready to use: exit 0, the interpreter"
    stderr = result.stderr
    assert "skill failed to install skill=alpha" in stderr
    # uv's own words, as uv printed them: indented lines, not a quoted repr.
    assert "\n    error: Failed to build `alpha @ file://" in stderr
    assert "\n      cause: fake build failure for alpha (FAKE_UV_FAIL)" in stderr
    assert "`kernel-bootstrap ensure`" in stderr and "repair`" in stderr
    assert "skill=beta" not in stderr.split("skill failed to install", 1)[1]


def test_a_failed_skill_in_json_logs_and_output_carries_the_tail(world: World) -> None:
    result = world.run("ensure", "--json", "--strict", env={"FAKE_UV_FAIL": "alpha",
                                                          "KERNEL_BOOTSTRAP_LOG_FORMAT": "json"})
    assert result.returncode == EXIT_SKILLS_FAILED, result.stderr
    [failed] = json.loads(result.stdout)["failed"]
    assert failed["name"] == "alpha" and "fake build failure for alpha" in failed["error"]
    events = [json.loads(line) for line in result.stderr.splitlines()]
    warning = next(e for e in events if e["event"] == "skill failed to install")
    assert "fake build failure for alpha (FAKE_UV_FAIL)" in warning["error"]
    assert "repair" in warning["hint"]


def test_status_after_a_failed_skill_says_what_to_run(world: World) -> None:
    world.ensure(env={"FAKE_UV_FAIL": "alpha"})
    result = world.run("status")
    assert result.returncode == 3  # ready (as `ensure` says), but a skill failed
    assert "alpha" in result.stdout and "failed" in result.stdout
    assert "fake build failure for alpha (FAKE_UV_FAIL)" in result.stdout
    assert "kernel-bootstrap repair" in result.stdout


def test_a_failed_skill_hint_names_the_full_repair_command(world: World) -> None:
    result = world.ensure("--log-format", "console", env={"FAKE_UV_FAIL": "alpha"})
    assert "`kernel-bootstrap repair`" in result.stderr


# -- config errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "needles"), [
    ("venv = 3\n", ["key 'venv' must be a non-empty string, got int 3"]),
    ('requirements = "ipykernel"\n', ["key 'requirements' must be a list of strings"]),
    ('requirement = ["x"]\n', ["unknown key 'requirement'", "known: ", "requirements"]),
    ("venv = \n", ["invalid TOML", "line 1"]),
    ('skills = ["nowhere"]\n', ["skills[0]: not a directory:", "nowhere"]),
    ('constraints = "c.txt"\n', ["key 'constraints': file not found:", "c.txt"]),
    ('requirements = ["requests >>= 2"]\n', ["requirements[0]: invalid requirement",
                                              "'requests >>= 2'"]),
    ('venv = "a\\u0000b"\n', ["key 'venv' contains a NUL character"]),
    ("venv = 1" + "0" * 5000 + "\n", ["invalid TOML"]),
])
def test_a_config_error_names_the_file_and_the_key(world: World, body: str,
                                                   needles: list[str]) -> None:
    world.config.write_text(body)
    stderr = assert_one_clean_error(world.run("ensure"), EXIT_USAGE)
    assert f"error: {world.config}: " in stderr
    for needle in needles:
        assert needle in stderr, (needle, stderr)
    assert world.uv_calls() == []


def test_a_missing_config_file_says_how_to_name_one(world: World) -> None:
    world.config.unlink()
    stderr = assert_one_clean_error(world.run("ensure"), EXIT_USAGE)
    assert stderr == f"error: config file {world.config} does not exist\n"


def test_an_unusable_skill_name_names_the_config_entry_and_the_problem(world: World) -> None:
    (world.root / "odd").mkdir()
    (world.root / "odd" / "a..b").mkdir()
    (world.root / "odd" / "a..b" / "SKILL.md").write_text("---\nname: x\n---\n")
    world.write_config(skills=["odd/a..b"])
    stderr = assert_one_clean_error(world.run("status"), EXIT_USAGE)
    assert str(world.config) in stderr and "skills[0]" in stderr
    assert "'a..b'" in stderr and "path separator or '..'" in stderr

"""Never worse off: staged rebuilds, the swap, and recovery after a kill at any step.

Every test looks from outside: exit codes, what the interpreter at the stable path can import,
the marker's bytes, the fake uv's log, and the names left beside the venv.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.env.venv import interpreter, recover, staging_path, swap_into_place
from bootstrap.errors import BootstrapError
from testing.processes import kill_group, start, wait_for
from testing.world import World

NEW_RUNTIME = ["requests>=2", "six"]
# A venv without generations (Windows): a plain directory, rebuilt by the staged swap.
PLAIN = {"KERNEL_BOOTSTRAP_NO_GENERATIONS": "1"}


def ready_world(root: Path, env: dict[str, str] | None = None) -> World:
    w = World(root)
    w.env.update(env or {})
    w.skill("alpha")
    w.write_config(requirements=["requests>=2"])
    w.ensure()
    w.clear_log()
    return w


@pytest.fixture
def world(tmp_path: Path) -> World:
    return ready_world(tmp_path)


@pytest.fixture
def plain_world(tmp_path: Path) -> World:
    return ready_world(tmp_path, PLAIN)


def beside(world: World) -> list[str]:
    """Names beside the venv that a rebuild or swap made (staging, retired, journal, temp, an
    old generation), not the current generation the venv's link names."""
    current = os.readlink(world.venv) if world.venv.is_symlink() else None
    return sorted(n for n in os.listdir(world.venv.parent)
                  if n.startswith(".venv.") and n != current)


def runs(python: Path) -> bool:
    done = subprocess.run([str(python), "-c", "import sys"], capture_output=True, check=False)
    return done.returncode == 0


def log_events(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


# -- a failed rebuild -----------------------------------------------------------------------

def test_a_failed_rebuild_keeps_the_old_venv_working_and_recognised(world: World) -> None:
    marker = (world.venv / ".bootstrap-version").read_bytes()
    world.write_config(requirements=NEW_RUNTIME)
    result = world.ensure(env={"FAKE_UV_FAIL": "six"}, ok=False)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "uv could not install the requirements" in result.stderr
    assert "Failed to download `six`" in result.stderr  # uv's own words, naming it
    assert "Traceback" not in result.stderr
    assert world.imports("requests") and world.imports("alpha")
    assert (world.venv / ".bootstrap-version").read_bytes() == marker
    assert beside(world) == []

    # Reverting the config finds the old venv still recognised: a warm start, no uv at all.
    world.write_config(requirements=["requests>=2"])
    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert out["action"] == "ready"
    assert world.uv_calls() == []


def test_a_failing_ready_check_in_the_new_venv_keeps_the_old_one(world: World) -> None:
    marker = (world.venv / ".bootstrap-version").read_bytes()
    world.write_config(requirements=NEW_RUNTIME, ready_check="import no_such_module")
    result = world.ensure(ok=False)
    assert result.returncode == 1
    assert "ready-check failed in the new venv" in result.stderr
    assert "No module named 'no_such_module'" in result.stderr
    assert (world.venv / ".bootstrap-version").read_bytes() == marker
    assert world.imports("alpha") and not world.imports("six")
    assert beside(world) == []


# -- a successful rebuild -------------------------------------------------------------------

@pytest.mark.parametrize(("env", "method", "built_in"), [
    ({}, "flip", ".venv.gen-"),
    (PLAIN, "exchange", ".venv.stage-"),
    ({**PLAIN, "KERNEL_BOOTSTRAP_NO_EXCHANGE": "1"}, "rename-aside", ".venv.stage-")])
def test_a_runtime_change_rebuilds_beside_and_swaps_in_at_the_same_path(
    tmp_path: Path, env: dict[str, str], method: str, built_in: str
) -> None:
    world = ready_world(tmp_path, env)
    before = world.ensure().stdout
    (world.venv / "old-tree").write_text("the venv before the rebuild")
    world.write_config(requirements=NEW_RUNTIME)
    world.clear_log()
    result = world.ensure("--json", env={**env, "KERNEL_BOOTSTRAP_LOG_FORMAT": "json"})
    out = json.loads(result.stdout)
    assert out["action"] == "rebuild"
    assert f"{out['python']}\n" == before == f"{world.python}\n"
    # Built beside the live venv, never at its path.
    [venv_call] = world.venv_calls()
    assert Path(venv_call[-1]).parent == world.venv.parent
    assert Path(venv_call[-1]).name.startswith(built_in)
    [ready] = [e for e in log_events(result.stderr) if e["event"] == "runtime ready"]
    assert ready["swap"] == method
    assert not (world.venv / "old-tree").exists()
    assert world.imports("six") and world.imports("alpha")
    assert beside(world) == []
    assert world.status()["ready"] is True


def test_scripts_installed_by_a_requirement_run_from_the_final_path(world: World) -> None:
    world.write_config(requirements=NEW_RUNTIME)
    world.ensure(env={"FAKE_UV_SCRIPTS": "six"})
    done = subprocess.run([str(world.venv / "bin" / "six")], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("six ")


def test_a_script_naming_its_staging_path_is_refused_before_the_swap(tmp_path: Path) -> None:
    from bootstrap.config import Config
    from bootstrap.engine.rebuild import _validate
    from bootstrap.env.venv import Venv

    staged = tmp_path / ".venv.stage-1-aa"
    (staged / "bin").mkdir(parents=True)
    (staged / "pyvenv.cfg").write_text("version_info = 3.11.7\n")
    (staged / "bin" / "python").symlink_to(sys.executable)
    (staged / "bin" / "tool").write_text(f"#!{staged}/bin/python\nprint(1)\n")
    config = Config(path=None, venv=tmp_path / "venv", python="3.11")
    with pytest.raises(BootstrapError, match="tool in the new venv refers to its staging path"):
        _validate(Venv.at(staged), config)


def test_a_venv_whose_parent_does_not_exist_gets_its_parent(world: World) -> None:
    world.write_config(venv="deep/er/venv", requirements=["requests>=2"])
    out = json.loads(world.ensure("--json").stdout)
    assert out["python"] == str(world.root / "deep" / "er" / "venv" / "bin" / "python")
    assert runs(Path(out["python"]))


# -- killed at each step of a staged rebuild ------------------------------------------------

def hang_after_venv_shim(world: World) -> Path:
    """A uv that creates the venv (via the fake) and then never returns: killed mid `uv venv`."""
    shim = world.root / "bin" / "uv-hang-venv"
    shim.write_text("#!/bin/sh\n"
                    f"{shlex.quote(str(world.uv))} \"$@\" || exit $?\n"
                    'if [ "$1" = venv ]; then exec sleep 3600; fi\n')
    shim.chmod(0o755)
    return shim


def in_staged_venv_call(world: World) -> bool:
    return any(".venv.gen-" in c[-1] for c in world.venv_calls())


def installing(world: World, name: str) -> bool:
    return any(name in c.requirements or name in c.editables for c in world.installs())


@pytest.mark.parametrize("step", ["uv venv", "runtime install", "skill sync after the swap"])
def test_a_rebuild_killed_at_any_step_leaves_a_venv_and_the_next_start_converges(
    world: World, step: str
) -> None:
    marker = (world.venv / ".bootstrap-version").read_bytes()
    world.write_config(requirements=NEW_RUNTIME)
    if step == "uv venv":
        proc = start(world, env={"KERNEL_BOOTSTRAP_UV": str(hang_after_venv_shim(world))})
        wait_for(lambda: in_staged_venv_call(world) and bool(beside(world)))
    elif step == "runtime install":
        proc = start(world, env={"FAKE_UV_HANG": "six"})
        wait_for(lambda: installing(world, "six"))
    else:
        proc = start(world, env={"FAKE_UV_HANG": "alpha"})
        wait_for(lambda: installing(world, "alpha"))
    kill_group(proc)

    assert runs(world.python)  # never neither: a venv at the stable path at every instant
    if step == "skill sync after the swap":
        assert world.imports("six")  # the new one, with its base marker
        assert world.status()["runtime"] == "current"
    else:
        assert (world.venv / ".bootstrap-version").read_bytes() == marker
        assert world.imports("alpha") and not world.imports("six")
        assert beside(world) != []  # what the killed rebuild left

    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    assert beside(world) == []  # reaped under the lock
    assert out["installed"] == ["alpha"]
    assert len(world.venv_calls()) == (0 if step == "skill sync after the swap" else 1)
    assert world.imports("six") and world.imports("alpha")
    assert world.status()["ready"] is True


# -- an interrupted rename-aside ------------------------------------------------------------

def fake_venv(path: Path, tag: str) -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    (path / "pyvenv.cfg").write_text("version_info = 3.11.7\n")
    (path / ".bootstrap-version").write_text(tag)
    return path


def tag(venv: Path) -> str:
    return (venv / ".bootstrap-version").read_text()


# A child swaps (rename-aside forced) and is SIGKILLed at the rename of argv[1].
_KILLED_AT_RENAME = """
import os, signal, sys
from pathlib import Path
real = os.rename
def rename(src, dst):
    if str(src) == sys.argv[1]:
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
os.rename = rename
from bootstrap.env.venv import swap_into_place
swap_into_place(Path(sys.argv[2]), Path(sys.argv[3]))
"""


def killed_at_rename_of(victim: Path, staged: Path, live: Path) -> None:
    env = {**os.environ, "KERNEL_BOOTSTRAP_NO_EXCHANGE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.run([sys.executable, "-c", _KILLED_AT_RENAME, str(victim), str(staged),
                            str(live)], env=env, capture_output=True, text=True, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr


def interrupted_swap(tmp_path: Path) -> tuple[Path, Path]:
    live = fake_venv(tmp_path / "venv", "old")
    staged = fake_venv(staging_path(live), "new")
    killed_at_rename_of(staged, staged, live)  # the second rename: the old venv is aside
    # The window rename-aside has: the old venv aside, the new one not yet in place.
    assert not live.exists()
    assert (tmp_path / ".venv.swap").is_file()
    assert [p.name for p in tmp_path.glob(".venv.retired-*")] != []
    return live, staged


def test_recovery_finishes_a_swap_whose_staged_venv_is_complete(
    tmp_path: Path,
) -> None:
    live, _ = interrupted_swap(tmp_path)
    done = recover(live)
    assert tag(live) == "new" and runs(interpreter(live))
    assert any(d.startswith("finished an interrupted swap") for d in done)
    assert sorted(os.listdir(tmp_path)) == ["venv"]  # journal, aside and staging all gone


def test_recovery_rolls_back_a_swap_whose_staged_venv_is_incomplete(
    tmp_path: Path,
) -> None:
    live, staged = interrupted_swap(tmp_path)
    (staged / ".bootstrap-version").unlink()
    done = recover(live)
    assert tag(live) == "old" and runs(interpreter(live))
    assert any(d.startswith("rolled back an interrupted swap") for d in done)
    assert sorted(os.listdir(tmp_path)) == ["venv"]


def test_recovery_after_a_kill_before_the_first_rename_keeps_the_live_venv(
    tmp_path: Path,
) -> None:
    live = fake_venv(tmp_path / "venv", "old")
    staged = fake_venv(staging_path(live), "new")
    killed_at_rename_of(live, staged, live)  # journal written, nothing renamed yet
    assert (tmp_path / ".venv.swap").is_file()
    recover(live)
    assert tag(live) == "old"
    assert sorted(os.listdir(tmp_path)) == ["venv"]


def test_a_swap_that_fails_on_the_second_rename_puts_the_old_venv_back_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = fake_venv(tmp_path / "venv", "old")
    staged = fake_venv(staging_path(live), "new")
    real = os.rename

    def rename(src: str, dst: str) -> None:
        if Path(src) == staged:
            raise OSError(18, "Invalid cross-device link")
        real(src, dst)

    with monkeypatch.context() as m:
        m.setenv("KERNEL_BOOTSTRAP_NO_EXCHANGE", "1")
        m.setattr("bootstrap.env.venv.os.rename", rename)
        with pytest.raises(OSError, match="cross-device"):
            swap_into_place(staged, live)
    assert tag(live) == "old"
    assert not (tmp_path / ".venv.swap").exists()


def test_a_venv_that_cannot_be_moved_aside_is_left_as_it_was_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = fake_venv(tmp_path / "venv", "old")
    staged = fake_venv(staging_path(live), "new")

    def rename(src: str, dst: str) -> None:
        # What Windows says while a kernel runs from the venv.
        raise PermissionError(13, "Access is denied", src)

    with monkeypatch.context() as m:
        m.setenv("KERNEL_BOOTSTRAP_NO_EXCHANGE", "1")
        m.setattr("bootstrap.env.venv.os.rename", rename)
        with pytest.raises(BootstrapError, match="Is a kernel running from it"):
            swap_into_place(staged, live)
    assert tag(live) == "old"
    assert not (tmp_path / ".venv.swap").exists()


def test_a_real_process_killed_between_the_two_renames_is_finished_by_the_next_start(
    plain_world: World,
) -> None:
    world = plain_world  # only the staged swap has two renames
    # A child runs the real CLI with os.rename patched to die (os._exit: no handler, no
    # finally, exactly like SIGKILL) just as the staged venv would move into place.
    code = (
        "import os, sys\n"
        "real = os.rename\n"
        "def rename(src, dst):\n"
        "    if '.venv.stage-' in str(src) and str(dst) == sys.argv[1]:\n"
        "        os._exit(137)\n"
        "    real(src, dst)\n"
        "os.rename = rename\n"
        "from bootstrap.cli import main\n"
        "sys.exit(main(sys.argv[2:]))\n"
    )
    world.write_config(requirements=NEW_RUNTIME)
    child = subprocess.run(
        [sys.executable, "-c", code, str(world.venv), "ensure", "--config", str(world.config)],
        env={**world.env, "KERNEL_BOOTSTRAP_NO_EXCHANGE": "1"}, capture_output=True, text=True,
        check=False)
    assert child.returncode == 137, child.stderr
    assert not world.venv.exists()
    assert ".venv.swap" in beside(world)
    assert world.status()["ready"] is False  # status is read-only: it recovers nothing

    world.clear_log()
    out = json.loads(world.ensure("--json").stdout)
    # The staged venv was complete (its base marker lands before the swap): finished, not
    # rebuilt; only the skill sync is left.
    assert out["action"] == "skills"
    assert world.venv_calls() == []
    assert world.imports("six") and world.imports("alpha")
    assert beside(world) == []
    assert world.status()["ready"] is True


# -- leftovers and gc -----------------------------------------------------------------------

def plant_leftovers(world: World) -> list[Path]:
    dead = [world.venv.parent / ".venv.stage-999999-deadbeef",
            world.venv.parent / ".venv.retired-999999-cafebabe"]
    for path in dead:
        (path / "bin").mkdir(parents=True)
        (path / "pyvenv.cfg").write_text("version_info = 3.11.7\n")
    return dead


def test_the_next_rebuild_reaps_what_dead_processes_left(world: World) -> None:
    plant_leftovers(world)
    world.write_config(requirements=NEW_RUNTIME)
    world.ensure()
    assert beside(world) == []


def test_gc_removes_leftovers_and_says_what_it_removed(world: World) -> None:
    dead = plant_leftovers(world)
    result = world.run("gc")
    assert result.returncode == 0, result.stderr
    for path in dead:
        assert f"removed leftover {path}" in result.stdout
    assert beside(world) == []
    assert world.imports("alpha")  # the live venv is not a leftover

    result = world.run("gc", "--json")
    assert json.loads(result.stdout) == {"venv": str(world.venv), "done": [],
                                         "generations": {"removed": [], "in_use": []},
                                         "kernel_servers_stopped": []}
    assert world.run("gc").stdout == "nothing to remove\n"


def test_gc_on_a_cold_machine_creates_nothing(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.write_config(venv="state/venv")
    result = world.run("gc", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["done"] == []
    assert not (tmp_path / "state").exists()

"""``kernel-bootstrap run``: ready as ``ensure`` makes it, then the managed interpreter in the
same process (pid, arguments, exit code), and the earlier runtime when a rebuild fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap import warm
from bootstrap.arguments import UsageError, parse_args
from testing.seams import Seam, seam_argv, seam_env
from testing.world import World

# The interpreter reports who it is, then exits with a code of its own.
_REPORT = ("import json, os, sys; print(json.dumps({'pid': os.getpid(), 'python': "
           "sys.executable, 'argv': sys.argv[1:], 'prefix': sys.prefix})); sys.exit(7)")


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.write_config(requirements=["requests>=2"])
    w.skill("alpha")
    return w


def run_argv(world: World, *python_args: str, strict: bool = False) -> list[str]:
    return [sys.executable, "-m", "bootstrap", "run", "--config", str(world.config),
            *(["--strict"] if strict else []), "--", *python_args]


def start_run(world: World, *python_args: str, env: dict[str, str] | None = None,
              strict: bool = False) -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen(run_argv(world, *python_args, strict=strict),
                            env={**world.env, **(env or {})}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    return proc, out, err


def test_a_cold_run_makes_the_venv_ready_then_becomes_its_interpreter(world: World) -> None:
    proc, out, err = start_run(world, "-c", _REPORT, "a", "--config", "b", "--")
    assert proc.returncode == 7, err
    report = json.loads(out)
    assert report["pid"] == proc.pid  # the process we started: exec'd, nothing in between
    # The interpreter of the venv's current generation: the pin points the process at the
    # generation it started in (a rebuild later does not change what it imports).
    assert Path(report["python"]).parent.parent == world.venv.resolve()
    assert report["argv"] == ["a", "--config", "b", "--"]  # untouched after the first --
    assert world.status()["ready"] is True and world.imports("alpha")


def test_a_warm_run_starts_no_uv_and_keeps_the_pid(world: World) -> None:
    world.ensure()
    world.clear_log()
    proc, out, err = start_run(world, "-c", _REPORT)
    assert proc.returncode == 7, err
    assert json.loads(out)["pid"] == proc.pid
    assert world.uv_calls() == []
    assert err == ""


def test_a_skill_added_after_the_last_start_is_installed_before_the_interpreter_starts(
        world: World) -> None:
    world.ensure()
    world.skill("beta")
    proc, out, err = start_run(world, "-c", "import beta; print(beta.__name__)")
    assert (proc.returncode, out) == (0, "beta\n"), err


def test_strict_refuses_to_start_when_a_skill_failed(world: World, tmp_path: Path) -> None:
    world.skill("broken")
    started = tmp_path / "started"
    proc, out, err = start_run(world, "-c", f"open({str(started)!r}, 'w')", strict=True,
                               env={"FAKE_UV_FAIL": "broken"})
    assert proc.returncode == 3 and out == ""
    assert "broken" in err and "--strict" in err
    assert not started.exists()
    # Without --strict the failed skill is a warning and the interpreter starts.
    proc, out, err = start_run(world, "-c", f"open({str(started)!r}, 'w')",
                               env={"FAKE_UV_FAIL": "broken"})
    assert proc.returncode == 0 and started.exists()
    assert "broken" in err


def test_a_failed_rebuild_starts_the_earlier_runtime_with_a_warning(world: World) -> None:
    world.ensure()
    world.write_config(requirements=["requests>=2", "idna>=3"])
    proc, out, err = start_run(world, "-c", _REPORT, env={"FAKE_UV_FAIL": "idna"})
    assert proc.returncode == 7, err
    report = json.loads(out)
    assert report["pid"] == proc.pid and report["prefix"] == str(world.venv.resolve())
    assert "starting the earlier runtime" in err and "idna" in err
    # Still to be rebuilt: recorded as a failed rebuild, retried at the next start (backoff).
    assert world.status()["runtime"] == "failed"


def test_an_io_error_in_a_rebuild_starts_the_earlier_runtime(world: World) -> None:
    # The flip's rename fails (EIO): an OSError, not our error, used to end `run` with exit 1.
    world.ensure()
    earlier = str(world.venv.resolve())
    world.write_config(requirements=["requests>=2", "idna>=3"])
    done = subprocess.run(seam_argv(["run", "--config", str(world.config), "--", "-c", _REPORT]),
                          env=seam_env(world.env, Seam("rename", "EIO", match=".venv.link-")),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 7, done.stderr
    assert json.loads(done.stdout)["prefix"] == earlier == str(world.venv.resolve())
    assert "starting the earlier runtime" in done.stderr
    assert "Input/output error" in done.stderr and "Traceback" not in done.stderr


def test_with_no_usable_venv_a_failed_ensure_exits_1_without_starting(world: World,
                                                                      tmp_path: Path) -> None:
    started = tmp_path / "started"
    proc, out, err = start_run(world, "-c", f"open({str(started)!r}, 'w')",
                               env={"FAKE_UV_FAIL": "requests"})
    assert proc.returncode == 1 and out == ""
    assert any(line.startswith("error: ") for line in err.splitlines())
    assert "requests" in err
    assert not started.exists()


@pytest.fixture(params=["holding the venv", "at the venv"])
def read_only_venv(request: pytest.FixtureRequest, world: World) -> Iterator[World]:
    """A ready venv on a read-only volume (we run as root, so chmod would not do): the
    directory holding it and its lock, or the venv itself, a plain directory (an earlier
    release's, or a volume's), bound onto itself and remounted read-only."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only mount needs root and mount(8)")
    world.write_config(requirements=["requests>=2"], venv="volume/venv")
    world.venv = world.root / "volume" / "venv"
    if request.param == "at the venv":
        world.venv.mkdir(parents=True)
        world.ensure(env={"KERNEL_BOOTSTRAP_NO_GENERATIONS": "1"})
        volume = str(world.venv)
    else:
        world.ensure()
        volume = str(world.venv.parent)
    done = subprocess.run(["mount", "--bind", volume, volume], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", volume], check=True)
        yield world
    finally:
        subprocess.run(["umount", "-l", volume], check=True)


def test_a_read_only_venv_with_a_changed_config_starts_the_earlier_runtime(
        read_only_venv: World) -> None:
    world = read_only_venv
    earlier = str(world.venv.resolve())
    world.write_config(requirements=["requests>=2", "idna>=3"], venv="volume/venv")
    proc, out, err = start_run(world, "-c", _REPORT)
    assert proc.returncode == 7, err
    report = json.loads(out)
    assert report["pid"] == proc.pid and report["prefix"] == earlier
    assert "starting the earlier runtime" in err and "Traceback" not in err


def test_a_read_only_volume_holding_the_venv_says_so_naming_the_lock(world: World,
                                                                   tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only mount needs root and mount(8)")
    volume = tmp_path / "volume"
    volume.mkdir()
    world.write_config(requirements=["requests>=2"], venv="volume/venv")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "kb-test", str(volume)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        result = world.ensure(ok=False)
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    # What is wrong and what to do: "[Errno 30] Read-only file system: '…/venv.lock'" said
    # neither what the file was for nor where writing is needed.
    assert "the bootstrap lock" in line and f"{volume}/venv.lock" in line
    assert "read-only" in line.lower() and f"write access to {volume}" in line


def test_a_read_only_venv_with_an_unchanged_config_starts_warm(read_only_venv: World) -> None:
    world = read_only_venv
    world.clear_log()
    for _ in range(2):  # the first start after the mount, and the next
        proc, out, err = start_run(world, "-c", _REPORT)
        assert proc.returncode == 7, err
        assert json.loads(out)["prefix"] == str(world.venv.resolve())
        assert err == "" and world.uv_calls() == []


def test_python_arguments_need_the_separator(world: World) -> None:
    result = subprocess.run([sys.executable, "-m", "bootstrap", "run", "--config",
                             str(world.config), "script.py"], env=world.env,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "script.py" in result.stderr


def test_a_config_error_is_exit_2(world: World) -> None:
    world.config.write_text("nonsense = 1\n")
    proc, _, err = start_run(world, "-c", "pass")
    assert proc.returncode == 2 and "nonsense" in err


# -- the warm parser's forms for run ------------------------------------------------------------

RUN_FORMS = [
    ["run"], ["run", "--"], ["run", "--", "-c", "pass"], ["run", "--strict", "--", "-m", "x"],
    ["run", "--config", "k.toml", "--", "-f", "{connection_file}"], ["run", "--config=k"],
    ["--config", "k", "run", "-q", "--", "--config", "z", "--"], ["-q", "run"],
    ["--log-format", "json", "run", "--", "-h"], ["run", "--json"], ["run", "-v"],
    ["run", "--lock-timeout", "5"], ["run", "x.py"], ["run", "-h"], ["run", "--strict=1"],
    ["ensure", "--", "run"], ["--strict", "run"], ["run", "--config", "--", "-c"],
]


def _full_parse(argv: list[str]) -> tuple[str | None, bool, list[str]] | None:
    try:
        args = parse_args(argv)
    except (UsageError, SystemExit):
        return None
    if args.command != "run":
        return None
    config = str(args.config) if args.config is not None else None
    return config, args.strict, args.python_args


@pytest.mark.parametrize("argv", RUN_FORMS, ids=[" ".join(f) for f in RUN_FORMS])
def test_what_the_warm_parser_takes_for_run_the_full_parser_reads_the_same_way(
        argv: list[str]) -> None:
    warm_args = warm.parse_run(argv)
    if warm_args is not None:
        (config, _, strict, _, _), python_args = warm_args
        assert _full_parse(argv) == (config, strict, python_args)


def test_the_warm_parser_answers_the_plain_run_forms() -> None:
    assert warm.parse_run(["run"]) == ((None, False, False, 0, None), [])
    assert warm.parse_run(["run", "--config", "k", "--strict", "--", "-m", "ipykernel_launcher",
                           "-f", "{connection_file}"]) == (
        ("k", False, True, 0, None), ["-m", "ipykernel_launcher", "-f", "{connection_file}"])
    assert warm.parse_run(["-q", "run", "--", "--", "-q"]) == (
        (None, False, False, 1, None), ["--", "-q"])


def test_a_warm_run_imports_what_a_warm_ensure_imports(world: World) -> None:
    """As the console script runs it; the exec'd interpreter is not started with -X importtime,
    so only our process's imports are listed."""
    world.ensure()

    def imported(*args: str) -> set[str]:
        result = subprocess.run([sys.executable, "-X", "importtime", "-c",
                                 "from bootstrap.cli import run; run()", *args],
                                capture_output=True, text=True, env=world.env, check=False)
        return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:") and "|" in line} - {"imported package"}

    ensure = imported("ensure", "--config", str(world.config))
    assert imported("run", "--config", str(world.config), "--", "-c", "pass") == ensure

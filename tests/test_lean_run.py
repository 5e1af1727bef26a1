"""The kernelspec's lean entry (``python -I -S -c ...``, bootstrap.cli.lean_run): a warm ``run``
in an interpreter without site, and the console script's full ``run`` for anything else."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.env import kernelspec
from testing import kernels
from testing.world import World

# The interpreter reports who it is, then exits with a code of its own.
_REPORT = ("import json, os, sys; print(json.dumps({'pid': os.getpid(), 'python': "
           "sys.executable, 'argv': sys.argv[1:]})); sys.exit(7)")


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.write_config(requirements=["ipykernel>=6"])
    w.skill("alpha")
    return w


def lean_argv(world: World, tmp_path: Path) -> list[str]:
    """The installed kernelspec's argv (the install made the venv ready), its launcher swapped
    for ``-c _REPORT``, and its console script for one that logs each start to ``gate.log``
    before it execs the real one: the log says whether the full ``run`` ran."""
    result = world.run("kernelspec", "install", "--json", "--prefix", str(tmp_path / "p"))
    assert result.returncode == 0, result.stderr
    argv: list[str] = json.loads(result.stdout)["argv"]
    argv = kernels.lean_argv(argv)  # what the native stand-in, if any, execs
    gate = tmp_path / "gate"
    gate.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'gate.log'}\n"
                    f"exec {shlex.quote(argv[6])} \"$@\"\n")
    gate.chmod(0o755)
    cut = argv.index("--")
    return [*argv[:6], str(gate), *argv[7:cut + 1], "-c", _REPORT, "x"]


def start(argv: list[str], world: World,
          env: dict[str, str] | None = None) -> tuple[int, dict[str, object], str]:
    done = subprocess.run(argv, capture_output=True, text=True, env={**world.env, **(env or {})},
                          timeout=120, check=False)
    return done.returncode, json.loads(done.stdout or "{}"), done.stderr


def test_the_spec_starts_this_interpreter_without_site_on_this_package(
        world: World, tmp_path: Path) -> None:
    argv = lean_argv(world, tmp_path)
    package = Path(kernelspec.__file__).resolve().parents[2]
    assert argv[:6] == [sys.executable, "-I", "-S", "-c", kernelspec.LEAN_CODE, str(package)]


def test_a_warm_start_needs_no_console_script_and_no_site_packages(
        world: World, tmp_path: Path) -> None:
    argv = lean_argv(world, tmp_path)
    world.clear_log()
    code, report, err = start([argv[0], "-X", "importtime", *argv[1:]], world)
    assert code == 7, err
    assert Path(str(report["python"])).parent.parent == world.venv.resolve()
    assert report["argv"] == ["x"]
    assert not (tmp_path / "gate.log").exists() and world.uv_calls() == []
    # What the lean interpreter imported (the venv's interpreter it execs has no -X importtime):
    # the standard library and this package, and not site.
    imported = {line.rsplit("|", 1)[1].strip() for line in err.splitlines()
                if line.startswith("import time:") and "|" in line} - {"imported package"}
    assert {"bootstrap.cli", "bootstrap.warm"} <= imported
    assert "site" not in imported
    assert {m for m in imported if m.split(".")[0] not in sys.stdlib_module_names
            and m.split(".")[0] != "bootstrap"} == set()


def test_a_config_whose_fingerprint_does_not_hold_gets_the_full_run(
        world: World, tmp_path: Path) -> None:
    argv = lean_argv(world, tmp_path)
    world.skill("beta")  # the fingerprint no longer holds: the full check installs it
    world.clear_log()
    code, _, err = start([*argv[:-3], "-c", "import beta; print('{}')"], world)
    assert code == 0, err
    assert (tmp_path / "gate.log").read_text().split()[:3] == ["run", "--config",
                                                               str(world.config)]
    assert world.uv_calls() != [] and world.imports("beta")


@pytest.mark.parametrize("package", ["missing", "elsewhere"])
def test_a_package_directory_without_this_entry_gets_the_full_run(
        world: World, tmp_path: Path, package: str) -> None:
    # The tool moved (its site-packages is gone), or that directory holds a `bootstrap` without
    # lean_run (an older one): the console script's run, as before.
    argv = lean_argv(world, tmp_path)
    elsewhere = tmp_path / "old"
    (elsewhere / "bootstrap").mkdir(parents=True)
    (elsewhere / "bootstrap" / "__init__.py").write_text("")
    (elsewhere / "bootstrap" / "cli.py").write_text("def run(): pass\n")
    argv[5] = str(tmp_path / "gone" if package == "missing" else elsewhere)
    code, report, err = start(argv, world)
    assert code == 7, err
    assert Path(str(report["python"])).parent.parent == world.venv.resolve()
    assert (tmp_path / "gate.log").exists() and "Traceback" not in err


def test_an_override_interpreter_gets_the_full_run(world: World, tmp_path: Path) -> None:
    # KERNEL_BOOTSTRAP_PYTHON is the full path's to check (here: it lacks ipykernel).
    argv = lean_argv(world, tmp_path)
    code, _, err = start(argv, world, {"KERNEL_BOOTSTRAP_PYTHON": sys.executable})
    assert code == 1 and "KERNEL_BOOTSTRAP_PYTHON" in err and "ipykernel" in err, err
    assert (tmp_path / "gate.log").exists()

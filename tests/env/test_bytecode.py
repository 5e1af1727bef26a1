"""`compile-bytecode`: every install into the venv compiles, the key turns it off, and a change
of the key over an existing venv is honoured without a rebuild (fake uv logs every argument and
compiles what it installs, as uv does)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testing.uvlog import Call
from testing.world import World

FLAG = "--compile-bytecode"


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha", deps=["attrs"])
    return w


def venv_installs(world: World) -> list[Call]:
    """The installs into the managed venv, not into a skill build's own environment (a
    ``.work-`` directory, thrown away after the build)."""
    return [c for c in world.installs() if ".work-" not in c[c.index("--python") + 1]]


def compiled(world: World, module: str, venv: Path | None = None) -> bool:
    real = Path(os.path.realpath(venv or world.venv))
    site = next((real / "lib").glob("python*/site-packages"))
    return any((site / module / "__pycache__").glob("__init__.*.pyc"))


def ensure_json(world: World) -> dict[str, object]:
    data: dict[str, object] = json.loads(world.ensure("--json").stdout)
    return data


def build_then_add_a_skill(world: World) -> list[Call]:
    """A rebuild, then a skills-only sync: the uv calls of both into the venv."""
    world.ensure()
    world.skill("beta", deps=["idna"])
    world.ensure()
    return venv_installs(world)


def test_every_install_into_the_venv_compiles_by_default(world: World) -> None:
    world.write_config(requirements=["six"])
    installs = build_then_add_a_skill(world)
    assert len(installs) >= 2  # the runtime's, then the new skill's
    assert all(FLAG in call for call in installs), installs
    assert compiled(world, "six") and compiled(world, "attrs") and compiled(world, "idna")
    assert world.marker()["bytecode"] is True


def test_compile_bytecode_false_compiles_nothing(world: World) -> None:
    world.write_config(requirements=["six"], compile_bytecode=False)
    installs = build_then_add_a_skill(world)
    assert len(installs) >= 2
    assert not any(FLAG in call for call in installs), installs
    assert not compiled(world, "six") and not compiled(world, "idna")
    assert "bytecode" not in world.marker()


def test_the_pinned_runtime_of_a_lock_is_compiled(world: World) -> None:
    world.write_config(requirements=["six"], lock="requirements.lock")
    assert world.run("lock").returncode == 0
    world.ensure()
    locked = [c for c in venv_installs(world) if "--require-hashes" in c]
    assert len(locked) == 1 and FLAG in locked[0]
    assert compiled(world, "six")


def test_a_flag_in_uv_args_is_not_given_twice(world: World) -> None:
    world.write_config(requirements=["six"], uv_args=[FLAG])
    world.ensure()
    assert all(call.count(FLAG) == 1 for call in venv_installs(world))


def test_a_bad_value_is_a_usage_error_naming_the_key(world: World) -> None:
    world.config.write_text('venv = "venv"\ncompile-bytecode = "yes"\n')
    result = world.run("ensure")
    assert result.returncode == 2
    assert "compile-bytecode" in result.stderr and "Traceback" not in result.stderr
    assert not world.venv.exists()


def test_turning_it_on_compiles_what_is_installed_without_a_rebuild(world: World) -> None:
    world.write_config(requirements=["six"], compile_bytecode=False)
    world.ensure()
    world.clear_log()
    world.write_config(requirements=["six"])
    assert ensure_json(world)["action"] == "skills"
    assert world.uv_calls() == []  # no rebuild, no reinstall: the venv's own compileall
    assert compiled(world, "six") and compiled(world, "attrs")
    assert world.marker()["bytecode"] is True
    assert ensure_json(world)["action"] == "ready"  # recorded: nothing left to do


def test_turning_it_off_is_recorded_before_anything_is_installed_uncompiled(
        world: World) -> None:
    world.write_config(requirements=["six"])
    world.ensure()
    world.write_config(requirements=["six"], compile_bytecode=False)
    world.skill("beta", deps=["idna"])
    world.ensure()
    assert world.marker()["bytecode"] is False
    assert not compiled(world, "idna")
    world.write_config(requirements=["six"])  # on again: beta's install gets compiled too
    world.ensure()
    assert compiled(world, "idna") and world.marker()["bytecode"] is True


@pytest.mark.parametrize("built_with", [True, False])
def test_a_restored_snapshot_has_its_bytecode(world: World, built_with: bool) -> None:
    world.write_config(requirements=["six"], snapshots="store", compile_bytecode=built_with)
    world.ensure()
    world.write_config(requirements=["six"], snapshots="store")
    world.clear_log()
    other = world.root / "other"
    out = json.loads(world.ensure("--json", env={"KERNEL_BOOTSTRAP_VENV": str(other)}).stdout)
    assert out["action"] == "rebuild" and world.uv_calls() == []  # restored, not built
    assert compiled(world, "six", other) and compiled(world, "attrs", other)
    assert json.loads((other / ".bootstrap-version").read_bytes())["bytecode"] is True

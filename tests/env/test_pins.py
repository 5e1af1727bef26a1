"""`kernel-bootstrap lock` and a locked `ensure`/`status`/`repair`, against the fake uv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testing.world import World

HEADER = "# kernel-bootstrap lock: inputs=sha256:"


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.write_config(requirements=["six", "idna>=2"], lock="requirements.lock")
    return w


def lock_file(world: World, name: str = "requirements.lock") -> Path:
    return world.root / name


def relock(world: World, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = world.run("lock", "--json", *args, env=env)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def version_of(world: World, module: str) -> str:
    result = subprocess.run([str(world.python), "-c", f"import {module}; print({module}."
                             "__version__)"], capture_output=True, text=True, check=True)
    return result.stdout.strip()


def compiles(world: World) -> list[list[str]]:
    return [c for c in world.uv_calls() if c[:2] == ["pip", "compile"]]


def snapshot_of(path: Path) -> tuple[bytes, int, int]:
    st = path.stat()
    return path.read_bytes(), st.st_ino, st.st_mtime_ns


def test_lock_pins_with_hashes_and_ensure_installs_exactly_them(world: World) -> None:
    data = relock(world, env={"FAKE_UV_LATEST": "six=1.16.0"})
    assert data["changed"] and data["format"] == "requirements.txt" and data["packages"] == 2
    text = lock_file(world).read_text()
    assert text.startswith(HEADER)
    assert "six==1.16.0 \\\n    --hash=sha256:" in text and "idna==2 \\\n" in text
    world.ensure()
    assert version_of(world, "six") == "1.16.0"
    [runtime] = [c for c in world.installs() if "-r" in c and str(lock_file(world)) in c]
    assert "--require-hashes" in runtime
    assert world.status()["lockfile"] == "current"
    assert world.imports("alpha")


def test_lock_with_unchanged_inputs_leaves_the_file_alone(world: World) -> None:
    relock(world)
    before = snapshot_of(lock_file(world))
    world.clear_log()
    data = relock(world, env={"FAKE_UV_LATEST": "six=9.0"})
    assert data["changed"] is False
    assert snapshot_of(lock_file(world)) == before
    assert compiles(world) == []  # not even resolved again
    assert "unchanged" in world.run("lock").stdout


def test_upgrade_takes_newer_versions_and_a_stale_relock_keeps_fitting_pins(
        world: World) -> None:
    relock(world, env={"FAKE_UV_LATEST": "six=1.0.0"})
    world.write_config(requirements=["six", "idna>=2", "attrs"], lock="requirements.lock")
    relock(world, env={"FAKE_UV_LATEST": "six=2.0.0,attrs=23.1"})
    text = lock_file(world).read_text()
    assert "six==1.0.0" in text and "attrs==23.1" in text  # six kept its pin
    relock(world, "--upgrade", env={"FAKE_UV_LATEST": "six=2.0.0,attrs=23.1"})
    assert "six==2.0.0" in lock_file(world).read_text()
    assert any("--upgrade" in c for c in compiles(world))


def test_changed_requirements_without_relocking_are_refused_and_nothing_changes(
        world: World) -> None:
    relock(world)
    world.ensure()
    marker = (world.venv / ".bootstrap-version").read_bytes()
    world.write_config(requirements=["six", "idna>=3"], lock="requirements.lock")
    world.clear_log()
    result = world.ensure(ok=False)
    assert result.returncode == 2
    assert str(lock_file(world)) in result.stderr and "kernel-bootstrap lock" in result.stderr
    assert "Traceback" not in result.stderr
    assert world.uv_calls() == []
    assert (world.venv / ".bootstrap-version").read_bytes() == marker
    status = world.run("status")
    assert f"lock file: stale ({lock_file(world)})" in status.stdout
    assert "run `kernel-bootstrap lock`" in status.stdout
    assert world.status()["lockfile"] == "stale"


@pytest.mark.parametrize("change", [
    {"constraints": "constraints.txt"},
    {"uv_args": ["--exclude-newer", "2024-01-01"]},
])
def test_other_resolution_inputs_make_the_lock_stale(world: World,
                                                     change: dict[str, Any]) -> None:
    (world.root / "constraints.txt").write_text("six<2\n")
    relock(world)
    world.write_config(requirements=["six", "idna>=2"], lock="requirements.lock", **change)
    result = world.ensure(ok=False)
    assert result.returncode == 2, result.stderr
    assert "kernel-bootstrap lock" in result.stderr


def test_install_only_uv_args_do_not_make_the_lock_stale(world: World) -> None:
    relock(world)
    world.write_config(requirements=["six", "idna>=2"], lock="requirements.lock",
                       uv_args=["--compile-bytecode", "--link-mode", "copy"])
    assert world.status()["lockfile"] == "current"
    world.ensure()


def test_a_missing_lock_is_refused_before_anything_is_created(world: World) -> None:
    result = world.ensure(ok=False)
    assert result.returncode == 2
    assert f"lock file {lock_file(world)} does not exist" in result.stderr
    assert "kernel-bootstrap lock" in result.stderr
    assert world.uv_calls() == []
    assert sorted(p.name for p in world.root.iterdir()) == sorted(
        ["bin", "kernel-bootstrap.toml", "skills"])
    assert world.status()["lockfile"] == "missing"


def test_a_wrong_hash_fails_naming_the_package_and_keeps_the_old_venv(world: World) -> None:
    relock(world, env={"FAKE_UV_LATEST": "six=1.16.0"})
    world.ensure()
    marker = (world.venv / ".bootstrap-version").read_bytes()
    relock(world, "--upgrade", env={"FAKE_UV_LATEST": "six=1.17.0"})
    lock = lock_file(world)
    text = lock.read_text()
    start = text.index("six==1.17.0")
    hash_at = text.index("--hash=sha256:", start) + len("--hash=sha256:")
    lock.write_text(text[:hash_at] + "0" * 64 + text[hash_at + 64:])
    result = world.ensure(ok=False)
    assert result.returncode == 1
    assert "Hash mismatch for `six==1.17.0`" in result.stderr
    assert "Traceback" not in result.stderr
    assert (world.venv / ".bootstrap-version").read_bytes() == marker
    assert version_of(world, "six") == "1.16.0"


def test_a_new_lock_rebuilds_with_its_pins_even_after_a_warm_start(world: World) -> None:
    relock(world, env={"FAKE_UV_LATEST": "six=1.16.0"})
    world.ensure()
    world.ensure()  # records the warm fingerprint
    relock(world, "--upgrade", env={"FAKE_UV_LATEST": "six=1.17.0"})
    action = json.loads(world.ensure("--json").stdout)["action"]
    assert action == "rebuild"
    assert version_of(world, "six") == "1.17.0"
    assert world.imports("alpha")


def test_pylock_format_is_written_and_installed(world: World) -> None:
    world.write_config(requirements=["six"], lock="pylock.toml")
    data = relock(world, env={"FAKE_UV_LATEST": "six=1.16.0"})
    assert data["format"] == "pylock.toml"
    import tomllib

    lock = tomllib.loads((world.root / "pylock.toml").read_text())
    assert [(p["name"], p["version"]) for p in lock["packages"]] == [("six", "1.16.0")]
    world.ensure()
    assert version_of(world, "six") == "1.16.0"
    [runtime] = [c for c in world.installs() if str(world.root / "pylock.toml") in c]
    assert "--require-hashes" in runtime


def test_repair_removes_unpinned_packages_and_restores_drifted_pins(world: World) -> None:
    relock(world, env={"FAKE_UV_LATEST": "six=1.16.0"})
    world.ensure()
    uv = [str(world.uv), "pip", "install", "--python", str(world.python)]
    subprocess.run([*uv, "requests", "six==1.15.0"], env=world.env, check=True,
                   capture_output=True)
    result = world.run("repair", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert any("requests" in line and "neither pinned" in line for line in report["found"])
    assert any("reinstalled six 1.16.0 (was 1.15.0)" in line for line in report["done"])
    assert not world.imports("requests")
    assert version_of(world, "six") == "1.16.0"
    assert world.imports("alpha")  # skills stay
    again = json.loads(world.run("repair", "--json").stdout)
    assert again["found"] == [] and again["healthy"]


def test_lock_without_a_configured_lock_is_a_usage_error(world: World) -> None:
    world.write_config(requirements=["six"])
    result = world.run("lock")
    assert result.returncode == 2
    assert "no `lock` is configured" in result.stderr


def test_without_a_lock_nothing_about_it_shows_and_the_identity_keeps_its_inputs(
        world: World) -> None:
    world.write_config(requirements=["six"])
    world.ensure()
    assert set(world.marker()["runtime"]["inputs"]) == {
        "schema", "python", "python_version", "requirements", "constraints", "uv_args"}
    assert "lockfile" not in world.status()
    assert "lock file" not in world.run("status").stdout


def test_the_snapshot_key_changes_with_the_lock(world: World) -> None:
    world.write_config(requirements=["six", "idna>=2"], lock="requirements.lock",
                       snapshots="snaps")
    relock(world, env={"FAKE_UV_LATEST": "six=1.16.0"})
    world.ensure()
    first = world.status()["snapshot"]["key"]
    relock(world, "--upgrade", env={"FAKE_UV_LATEST": "six=1.17.0"})
    assert world.status()["snapshot"]["key"] != first
    assert os.path.isdir(world.root / "snaps")


def test_lock_counts_one_pin_in_the_singular(world: World) -> None:
    world.write_config(requirements=["six"], lock="requirements.lock")
    written = world.run("lock")
    assert (written.returncode, written.stdout) == (
        0, f"{lock_file(world)}: written (1 pinned package, requirements.txt)\n")
    unchanged = world.run("lock")
    assert (unchanged.returncode, unchanged.stdout) == (
        0, f"{lock_file(world)}: unchanged (the inputs are unchanged; 1 pinned package)\n")

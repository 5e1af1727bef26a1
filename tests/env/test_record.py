"""``env/record.py``: a venv's files checked against its distributions' RECORDs, reading only
what lies in the venv, never through a planted link, never unbounded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootstrap.env import record
from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.write_config(requirements=["six"])
    w.ensure()
    return w


def site(world: World) -> Path:
    [found] = world.venv.glob("lib/python*/site-packages")
    return found


def dist_info(world: World, name: str) -> Path:
    return next(site(world).glob(f"{name}-*.dist-info"))


def test_a_whole_venv_is_undamaged(world: World) -> None:
    assert record.damaged(world.venv, hashes=True) == []


def test_a_missing_file_a_truncated_one_and_a_missing_record_are_each_named(
        world: World) -> None:
    (site(world) / "six" / "__init__.py").unlink()
    metadata = dist_info(world, "alpha") / "METADATA"
    size = metadata.stat().st_size
    metadata.write_text("cut")
    (dist_info(world, "six") / "INSTALLER").unlink()
    assert [d.describe() for d in record.damaged(world.venv)] == [
        f"alpha 0.1.0: alpha-0.1.0.dist-info/METADATA has 3 bytes, its RECORD says {size}",
        "six 1.0.0: six/__init__.py is missing; six-1.0.0.dist-info/INSTALLER is missing"]
    (dist_info(world, "six") / "RECORD").unlink()
    assert record.summary(record.damaged(world.venv)) == (
        f"alpha 0.1.0: alpha-0.1.0.dist-info/METADATA has 3 bytes, its RECORD says {size}, "
        "six 1.0.0: its RECORD is missing")


def test_bytecode_the_record_itself_and_what_lies_outside_the_venv_are_not_checked(
        world: World, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    with (dist_info(world, "six") / "RECORD").open("a") as f:
        f.write("six/__pycache__/__init__.cpython-311.pyc,,\n"
                "six/gone.pyc,,9\n"
                f"{outside},sha256=AAAA,1\n"  # absolute: installed elsewhere
                "../../../../outside.txt,,5\n"  # leaves the venv
                '"six/a,comma.py",,0\n')  # CSV quoting: one path with a comma, missing
    [damage] = record.damaged(world.venv, hashes=True)
    assert damage.describe() == "six 1.0.0: six/a,comma.py is missing"


def test_a_record_planted_as_a_link_or_a_fifo_is_unreadable_not_followed(
        world: World) -> None:
    planted = dist_info(world, "six") / "RECORD"
    planted.unlink()
    planted.symlink_to("/dev/zero")
    fifo = dist_info(world, "alpha") / "RECORD"
    fifo.unlink()
    os.mkfifo(fifo)
    found = {d.name: d.problems[0] for d in record.damaged(world.venv)}
    assert found["six"].startswith("its RECORD is unreadable: ")
    assert found["alpha"].startswith("its RECORD is unreadable: ")


def test_a_record_that_is_not_csv_or_names_no_file_is_damage_not_a_crash(world: World) -> None:
    with (dist_info(world, "six") / "RECORD").open("ab") as f:
        f.write(b"six/x\x00.py,,1\n")
    [damage] = record.damaged(world.venv)
    assert damage.problems == ("'six/x\\x00.py' cannot be a file name",)
    with (dist_info(world, "six") / "RECORD").open("ab") as f:
        f.write(b'"' + b"x" * 200_000 + b'",,1\n')  # over csv's field limit
    [damage] = record.damaged(world.venv)
    assert damage.problems[0].startswith("its RECORD is unreadable: ")


def test_a_file_replaced_by_a_link_or_a_directory_is_damaged_and_never_read(
        world: World) -> None:
    target = site(world) / "six" / "__init__.py"
    size = target.stat().st_size
    target.unlink()
    target.mkdir()
    [damage] = record.damaged(world.venv, hashes=True)
    assert damage.problems == ("six/__init__.py is not a file",)
    target.rmdir()
    target.symlink_to("/dev/zero")  # a link is stat'ed (uv's symlink mode), never opened
    [damage] = record.damaged(world.venv, hashes=True)
    assert damage.problems == ("six/__init__.py is not a file",)
    assert size > 0


def test_the_number_of_damaged_files_is_counted_past_the_examples(world: World) -> None:
    (site(world) / "six" / "__init__.py").unlink()
    for path in (dist_info(world, "six")).iterdir():
        if path.name != "RECORD":
            path.unlink()
    [damage] = record.damaged(world.venv)
    assert len(damage.problems) == 3 and damage.count == 5
    assert damage.describe().endswith("is missing (and 2 more files)")


def test_a_console_script_outside_site_packages_is_checked_too(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.write_config(requirements=["six"])
    world.ensure(env={"FAKE_UV_SCRIPTS": "six"})
    (world.venv / "bin" / "six").unlink()
    [damage] = record.damaged(world.venv)
    assert damage.problems == ("../../../bin/six is missing",)

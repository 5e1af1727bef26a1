"""A rebuild never puts in place a runtime whose files did not all land (issue 31, item 1).

The fake uv tears an install as a full disk does under the real uv: the package's dist-info
lands (its RECORD listing every file), its files do not. uv takes a dist-info for "installed".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.write_config(requirements=["six"])
    w.ensure()
    w.write_config(requirements=["six", "numpy"])
    w.clear_log()
    return w


def generations(world: World) -> list[str]:
    return sorted(p.name for p in world.venv.parent.glob(f".{world.venv.name}.gen-*"))


def test_a_package_whose_files_never_landed_is_not_put_in_place(world: World) -> None:
    """uv reported success, numpy's dist-info is there, numpy's files are not: before, no
    check looked past the metadata, and the runtime was flipped in without them."""
    before = os.readlink(world.venv)
    result = world.ensure(env={"FAKE_UV_PARTIAL": "numpy"}, ok=False)
    assert result.returncode == 1, result.stderr
    assert "lacks files its packages installed (numpy 1.0.0: numpy/__init__.py is missing)" \
        in result.stderr
    assert "the old venv is unchanged" in result.stderr
    assert os.readlink(world.venv) == before and generations(world) == [before]
    assert world.imports("six") and not world.imports("numpy")
    assert world.status()["runtime"] == "failed"


def test_a_full_disk_in_the_runtime_install_keeps_the_old_runtime(world: World) -> None:
    before = os.readlink(world.venv)
    result = world.ensure(env={"FAKE_UV_ENOSPC": "numpy"}, ok=False)
    assert result.returncode == 1
    assert "No space left on device" in result.stderr
    assert os.readlink(world.venv) == before and generations(world) == [before]
    assert world.imports("six")


def test_the_next_rebuild_after_a_torn_install_is_complete(world: World) -> None:
    world.ensure(env={"FAKE_UV_PARTIAL": "numpy"}, ok=False)
    world.ensure("--retry")
    assert world.imports("six") and world.imports("numpy")
    assert len(generations(world)) == 1


# -- a cached skill riding along in the runtime's uv call: the runtime-alone call after it ----

@pytest.fixture
def riding(tmp_path: Path) -> World:
    """A venv built with six and alpha, whose wheel the build cache now holds: in the next
    rebuild alpha rides along in the runtime's uv call."""
    w = World(tmp_path)
    w.env["KERNEL_BOOTSTRAP_BATCH_BUILDS"] = "1"  # the fake index's hatchling builds
    w.skill("alpha")
    w.write_config(requirements=["six"])
    w.ensure()
    assert w.imports("alpha")
    w.write_config(requirements=["six", "numpy"])
    w.clear_log()
    return w


def test_a_full_disk_with_a_rider_never_flips_in_a_torn_runtime(riding: World) -> None:
    """The call with the rider failed in numpy, leaving its dist-info; the runtime-alone call
    ran in the same venv, took numpy for installed, and the torn runtime was flipped in."""
    before = os.readlink(riding.venv)
    result = riding.ensure(env={"FAKE_UV_ENOSPC": "numpy"}, ok=False)
    assert result.returncode == 1, result.stderr
    assert "No space left on device" in result.stderr
    together, alone = riding.installs()
    assert together.wheels == 1 and alone.wheels == 0  # the rider, then the runtime alone
    assert len(riding.venv_calls()) == 2  # the runtime alone went into a new, empty venv
    assert os.readlink(riding.venv) == before and generations(riding) == [before]
    assert riding.imports("six") and riding.imports("alpha") and not riding.imports("numpy")


def test_when_the_space_comes_back_the_runtime_alone_lands_whole(riding: World,
                                                                  tmp_path: Path) -> None:
    once = tmp_path / "disk-full-once"
    once.touch()
    out = json.loads(riding.ensure("--json", env={"FAKE_UV_ENOSPC": "numpy",
                                                  "FAKE_UV_ENOSPC_ONCE": str(once)}).stdout)
    assert out["action"] == "rebuild" and out["installed"] == ["alpha"] and not once.exists()
    first, second = riding.venv_calls()
    assert first[-1] == second[-1]  # the same staged venv, emptied and made again
    assert riding.imports("numpy") and riding.imports("six") and riding.imports("alpha")
    assert riding.status()["ready"] is True

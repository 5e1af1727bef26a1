"""A full disk during a rebuild, with the real uv on a small tmpfs (issue 31, item 1; six
and numpy from the package index, as the issue reproduced it).

The runtime's uv call, a cached skill riding along, fails half-way through numpy;
the runtime-alone call that followed ran in the same venv, where uv took the torn package's
dist-info for "installed", and a runtime without the package's files was put in place. Now
the second call starts from an empty venv and the new venv's files are checked against every
RECORD before the flip: the old runtime stays, whole.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import RealWorld

DISK_MIB = 40


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs",
                           str(mount)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_never_flips_in_a_runtime_missing_files(real: RealWorld,
                                                            disk: Path) -> None:
    real.venv = disk / "venv"
    real.skill("alpha")
    real.write_config(venv=str(real.venv), requirements=["six"])
    real.ensure()  # alpha is built into the build cache: it rides along from now on
    before = os.readlink(real.venv)

    real.write_config(venv=str(real.venv), requirements=["six", "numpy"])
    real.clear_log()
    result = real.ensure("--json", ok=False)
    assert result.returncode == 1, result.stderr
    assert "No space left on device" in result.stderr
    together, alone = [c for c in real.uv_calls() if c[:2] == ["pip", "install"]]
    assert together.wheels == 1 and alone.wheels == 0  # the rider, then the runtime alone
    assert len([c for c in real.uv_calls() if c[:1] == ["venv"]]) == 2  # each in a new venv
    # Before, uv took the torn numpy for installed: ensure exited 0, numpy did not import.
    # The old generation is current, whole, and alone beside the venv.
    assert os.readlink(real.venv) == before
    assert sorted(p.name for p in disk.glob(".venv.*")) == [before]
    assert real.imports("six") and real.imports("alpha")
    status = json.loads(real.run("status", "--json").stdout)
    assert status["runtime"] == "failed" and status["ready"] is False
    repair = json.loads(real.run("repair", "--json").stdout)
    assert not any(line.startswith("package ") for line in repair["found"])

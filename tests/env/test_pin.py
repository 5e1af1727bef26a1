"""The pin's files in a generation (fake uv): its module's bytecode, where the pin reads it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from testing.world import World


def test_the_pins_bytecode_lands_in_its_generation_under_a_pycache_prefix(
        tmp_path: Path) -> None:
    # A PYTHONPYCACHEPREFIX of ours (a CI's, a benchmark's) used to send the bytecode outside
    # the generation, so the pin fell back to compiling its source at every start.
    world = World(tmp_path / "w")
    world.write_config(requirements=["six"])
    world.ensure(env={"PYTHONPYCACHEPREFIX": str(tmp_path / "pycache")})
    generation = Path(os.path.realpath(world.venv))
    [pth] = generation.glob("lib/python*/site-packages/000-kernel-bootstrap-pin.pth")
    opened = re.search(r"open\(sys\.prefix \+ '([^']+)'", pth.read_text(encoding="utf-8"))
    assert opened is not None, pth.read_text(encoding="utf-8")
    pyc = generation / opened[1].lstrip("/")
    assert pyc.suffix == ".pyc" and pyc.is_file(), pyc
    assert not (tmp_path / "pycache").exists() or not any((tmp_path / "pycache").rglob(
        "_kernel_bootstrap_pin*.pyc"))
    # The interpreter starts with it, pinned to the generation.
    started = subprocess.run([str(world.python), "-c", "import sys; print(sys.prefix)"],
                             capture_output=True, text=True, check=True,
                             env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]})
    assert started.stdout.strip() == str(generation)

"""`compile-bytecode` with the real uv: the runtime's modules have their .pyc after `ensure`,
and none without the key; turning it on later compiles them without a uv call."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.conftest import RealWorld


def pyc_files(world: RealWorld) -> list[Path]:
    site = next((Path(os.path.realpath(world.venv)) / "lib").glob("python*/site-packages"))
    return sorted((site / "kb_runtime_demo" / "__pycache__").glob("__init__.*.pyc"))


@pytest.mark.parametrize("key", [True, False])
def test_the_runtime_is_compiled_unless_the_key_is_false(real: RealWorld, key: bool) -> None:
    requirement = real.runtime_package()
    real.write_config(requirements=[requirement], compile_bytecode=key)
    real.ensure()
    assert bool(pyc_files(real)) is key
    if key:
        return
    real.clear_log()
    real.write_config(requirements=[requirement])  # turned on: compiled where it is
    real.ensure()
    assert pyc_files(real) and real.uv_calls() == []

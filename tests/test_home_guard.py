from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import REAL_HOME


def test_home_and_caches_point_at_temporary_paths() -> None:
    for var in ("HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "UV_CACHE_DIR"):
        value = Path(os.environ[var]).resolve()
        assert value != REAL_HOME and REAL_HOME not in value.parents, var


def test_platformdirs_default_venv_is_under_the_temporary_home() -> None:
    import platformdirs

    data = Path(platformdirs.user_data_dir("kernel-bootstrap")).resolve()
    assert Path(os.environ["HOME"]).resolve() in data.parents

"""The venv on disk: one interpreter mapping for both layouts, pyvenv.cfg, leftover names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootstrap.env.venv import (
    interpreter,
    is_venv,
    leftovers,
    python_version,
    scripts_dir,
    sibling,
    staging_path,
)
from bootstrap.primitives.fs import temp_name


@pytest.mark.parametrize(("platform", "parts"), [
    ("linux", ("bin", "python")),
    ("darwin", ("bin", "python")),
    ("win32", ("Scripts", "python.exe")),
])
def test_the_interpreter_path_follows_the_platform_layout(
    platform: str, parts: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = Path("/srv/kernel/venv")
    with monkeypatch.context() as m:
        m.setattr("bootstrap.env.venv.sys.platform", platform)
        assert interpreter(venv) == venv.joinpath(*parts)
        assert scripts_dir(venv) == venv / parts[0]


def test_the_interpreter_path_is_the_same_for_the_live_venv_and_its_staging_sibling(
    tmp_path: Path,
) -> None:
    live = tmp_path / "venv"
    staged = staging_path(live)
    assert staged.parent == live.parent  # same filesystem, so the swap is a rename
    assert staged.name.startswith(f".venv.stage-{os.getpid()}-")
    assert interpreter(staged).relative_to(staged) == interpreter(live).relative_to(live)


@pytest.mark.parametrize(("text", "version"), [
    ("home = /usr/bin\nimplementation = CPython\nversion_info = 3.11.7\n", "3.11.7"),  # uv
    ("home = /usr/bin\nversion = 3.12.1\n", "3.12.1"),  # python -m venv
    ("home = /usr/bin\n", None),
])
def test_the_python_version_comes_from_pyvenv_cfg(
    tmp_path: Path, text: str, version: str | None
) -> None:
    (tmp_path / "pyvenv.cfg").write_text(text)
    assert python_version(tmp_path) == version
    assert is_venv(tmp_path)


def test_a_directory_without_pyvenv_cfg_is_not_a_venv(tmp_path: Path) -> None:
    assert python_version(tmp_path) is None
    assert not is_venv(tmp_path)


def test_leftovers_are_staging_retired_and_temp_names_of_this_venv_only(tmp_path: Path) -> None:
    live = tmp_path / "venv"
    live.mkdir()
    (live / ".bootstrap-version").write_text("{}")
    # What a SIGKILL leaves: trees named by sibling(), temp files named by write_atomic.
    ours = [staging_path(live), sibling(live, "retired"), temp_name(tmp_path / ".venv.swap"),
            temp_name(live / ".bootstrap-version")]
    theirs = [staging_path(tmp_path / "other"), tmp_path / "venv.lock", tmp_path / ".venv.swap"]
    for path in ours + theirs:
        path.mkdir()
    assert leftovers(live) == sorted(ours)
    assert leftovers(tmp_path / "missing" / "venv") == []

"""The server's directory: one per venv under the cache dir, the user's and closed to others."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootstrap.kernels import places


def test_each_venv_has_its_own_directory_under_the_cache_dir(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert places.server_dir("/a/b%c") == str(tmp_path / "cache" / "kernel-bootstrap" /
                                              "kernels" / "%2Fa%2Fb%25c")
    assert places.server_dir("/" + "x" * 300) is None


def test_the_directory_is_made_closed_to_others_and_a_symlink_or_an_open_one_is_refused(
        tmp_path: Path) -> None:
    made = tmp_path / "cache" / "kernels" / "v"
    fd = places.open_dir(str(made), create=True)
    os.close(fd)
    assert made.stat().st_mode & 0o777 == 0o700
    os.chmod(made, 0o755)
    with pytest.raises(PermissionError):
        places.open_dir(str(made), create=False)
    link = tmp_path / "link"
    link.symlink_to(made)
    with pytest.raises(OSError):
        places.open_dir(str(link), create=False)
    with pytest.raises(FileNotFoundError):
        places.open_dir(str(tmp_path / "missing"), create=False)

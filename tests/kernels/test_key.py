"""A server stops serving once what it serves is no longer what ``ensure`` would give: another
generation, other skill records in the marker, another config."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bootstrap.kernels.key import MARKER, Key


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``venv`` -> ``.venv.gen-1`` (with a marker); this process "pinned" to that generation."""
    generation = tmp_path / ".venv.gen-1"
    generation.mkdir()
    (generation / MARKER).write_text('{"skills": {}}\n')
    link = tmp_path / "venv"
    link.symlink_to(generation.name)
    (tmp_path / "k.toml").write_text("venv = 'venv'\n")
    monkeypatch.setattr(sys, "prefix", str(generation))
    return link


def key_of(venv: Path) -> Key:
    return Key.now(str(venv), str(venv.parent / "k.toml"))


def test_a_key_is_current_until_something_it_serves_changes(venv: Path) -> None:
    key = key_of(venv)
    assert key.generation == str(venv.resolve())
    assert key.stale() is None


def test_a_new_generation_makes_it_stale(venv: Path) -> None:
    key = key_of(venv)
    (venv.parent / ".venv.gen-2").mkdir()
    (venv.parent / "new").symlink_to(".venv.gen-2")
    os.replace(venv.parent / "new", venv)
    assert key.stale() == "the venv's current generation changed"


def test_other_skill_records_make_it_stale_and_the_same_bytes_rewritten_do_not(
        venv: Path) -> None:
    key = key_of(venv)
    marker = venv.resolve() / MARKER
    text = marker.read_text()
    marker.unlink()
    marker.write_text(text)  # rewritten, same records: another inode, same bytes
    assert key.stale() is None
    marker.write_text('{"skills": {"alpha": {}}}\n')
    assert key.stale() == "the skills changed"


def test_a_changed_config_makes_it_stale(venv: Path) -> None:
    key = key_of(venv)
    config = venv.parent / "k.toml"
    config.write_text("venv = 'venv'\nkernel-preload = ['numpy']\n")
    assert key.stale() == "the config changed"


def site_packages(venv: Path) -> Path:
    import site

    path = Path(site.getsitepackages([sys.prefix])[0])  # under the monkeypatched sys.prefix
    assert path.is_relative_to(venv.resolve())
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_a_package_installed_by_hand_makes_it_stale(venv: Path) -> None:
    # `uv pip install traitlets==5.14.3` (or `%pip install -U` in a notebook) swaps one
    # dist-info directory for another: no generation, marker or config changes.
    packages = site_packages(venv)
    (packages / "traitlets-5.14.0.dist-info").mkdir()
    key = key_of(venv)
    assert key.stale() is None
    (packages / "traitlets-5.14.0.dist-info").rename(packages / "traitlets-5.14.3.dist-info")
    assert key.stale() == "a package was installed or removed in the venv"


def test_a_pth_file_rewritten_in_place_makes_it_stale(venv: Path) -> None:
    packages = site_packages(venv)
    pth = packages / "_editable_skill.pth"
    pth.write_text("/old/path\n")
    key = key_of(venv)
    os.utime(packages, ns=(1, 1))  # the directory's own stat cannot tell, the file's can
    key = key_of(venv)
    pth.write_text("/new/path\n")
    os.utime(packages, ns=(1, 1))
    assert key.stale() == "a package was installed or removed in the venv"

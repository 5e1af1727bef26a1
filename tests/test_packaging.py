"""What ships: the wheel holds the package and nothing of the test double; the sdist holds the
sources and the licence, not CI or the benchmark chart."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from testing import REPO_ROOT


def _build(kind: str, out: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", kind, "-d", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0 and "No module named hatchling" in done.stderr:
        pytest.skip("hatchling is not installed in the test environment")
    assert done.returncode == 0, done.stderr
    (built,) = out.iterdir()
    return built


def test_the_wheel_ships_the_package_typed_and_licensed_without_the_uv_simulator(
        tmp_path: Path) -> None:
    wheel = _build("wheel", tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"bootstrap"}
    assert "bootstrap/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "kernel-bootstrap = bootstrap.cli:run" in scripts
    assert "fake" not in scripts


def test_the_sdist_carries_sources_and_licence_but_not_ci_or_the_chart(tmp_path: Path) -> None:
    sdist = _build("sdist", tmp_path)
    with tarfile.open(sdist) as tar:
        tops = {m.name.split("/", 2)[1] for m in tar.getmembers() if m.name.count("/")}
    assert {"bootstrap", "tests", "fake_uv", "LICENSE", "README.md", "CHANGELOG.md"} <= tops
    assert not {".ci", "benchmarks.png", ".venv"} & tops

"""What ships: the wheel holds the package and nothing of the test double, and the native
stand-in where a C compiler built it (a platform wheel; without one, the pure-Python wheel); the
sdist holds the sources and the licence, not CI, the benchmark chart or a built binary."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from testing import REPO_ROOT


def _build(kind: str, out: Path, env: dict[str, str] | None = None) -> Path:
    done = subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", kind, "-d", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
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


NATIVE = "bootstrap/kernels/kb-standin"


@pytest.mark.skipif(sys.platform != "linux" or shutil.which("cc") is None,
                    reason="the native stand-in is built on Linux with a C compiler")
def test_a_wheel_built_with_a_c_compiler_ships_the_native_stand_in_for_its_platform(
        tmp_path: Path) -> None:
    wheel = _build("wheel", tmp_path)
    assert wheel.name.endswith(".whl") and "-py3-none-linux_" in wheel.name, wheel.name
    info = zipfile.ZipFile(wheel).getinfo(NATIVE)
    assert stat.S_IMODE(info.external_attr >> 16) & 0o111, "not executable"
    extracted = tmp_path / "kb-standin"
    extracted.write_bytes(zipfile.ZipFile(wheel).read(NATIVE))
    extracted.chmod(0o755)
    usage = subprocess.run([str(extracted)], capture_output=True, text=True, check=False)
    assert (usage.returncode, usage.stderr) == (2, "usage: kb-standin VENV CONFIG FALLBACK...\n")


@pytest.mark.skipif(sys.platform != "linux" or shutil.which("cc") is None,
                    reason="the native stand-in is built on Linux with a C compiler")
def test_the_native_stand_in_compiles_without_a_warning(tmp_path: Path) -> None:
    done = subprocess.run(["cc", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-o",
                           str(tmp_path / "kb-standin"), str(REPO_ROOT / "native" / "standin.c")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_without_a_c_compiler_the_wheel_is_the_pure_python_one(tmp_path: Path) -> None:
    wheel = _build("wheel", tmp_path, env={"CC": "false"})  # a compiler that fails
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    assert NATIVE not in zipfile.ZipFile(wheel).namelist()


def test_the_sdist_carries_sources_and_licence_but_not_ci_or_the_chart(tmp_path: Path) -> None:
    sdist = _build("sdist", tmp_path)
    with tarfile.open(sdist) as tar:
        tops = {m.name.split("/", 2)[1] for m in tar.getmembers() if m.name.count("/")}
    assert {"bootstrap", "tests", "fake_uv", "LICENSE", "README.md", "CHANGELOG.md", "native",
            "hatch_build.py"} <= tops
    with tarfile.open(sdist) as tar:  # the source, never a binary built in the checkout
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert "native/standin.c" in names and NATIVE not in names
    assert not {".ci", "benchmarks.png", ".venv"} & tops

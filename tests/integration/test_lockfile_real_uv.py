"""`kernel-bootstrap lock` with the real uv and small packages from PyPI (six, idna)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.integration.conftest import RealWorld


def version_of(world: RealWorld, module: str) -> str:
    result = subprocess.run([str(world.python), "-c", f"import {module}; print({module}."
                             "__version__)"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def lock(world: RealWorld, *args: str) -> dict[str, object]:
    result = world.run("lock", "--json", *args)
    assert result.returncode == 0, result.stderr
    data: dict[str, object] = json.loads(result.stdout)
    return data


def site_files(world: RealWorld) -> list[str]:
    return sorted(str(p.relative_to(world.venv)) for p in world.venv.rglob("*")
                  if "__pycache__" not in p.parts)


@pytest.mark.parametrize("name", ["requirements.lock", "pylock.toml"])
def test_lock_ensure_stale_relock(real: RealWorld, name: str) -> None:
    real.skill("alpha")
    real.write_config(requirements=["six<1.17"], lock=name)
    path = real.root / name
    assert lock(real)["changed"] is True
    assert path.read_text().startswith("# kernel-bootstrap lock: inputs=sha256:")
    before = path.read_bytes(), path.stat().st_mtime_ns
    assert lock(real)["changed"] is False
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before  # byte-identical, untouched

    real.ensure()
    assert version_of(real, "six") == "1.16.0"
    assert real.imports("alpha")

    # Requirements changed, lock not: refused, nothing in the venv changes.
    files = site_files(real)
    marker = (real.venv / ".bootstrap-version").read_bytes()
    real.write_config(requirements=["six>=1.17"], lock=name)
    result = real.ensure(ok=False)
    assert result.returncode == 2
    assert str(path) in result.stderr and "kernel-bootstrap lock" in result.stderr
    assert site_files(real) == files
    assert (real.venv / ".bootstrap-version").read_bytes() == marker

    lock(real)
    real.ensure()
    assert version_of(real, "six") != "1.16.0"
    assert real.imports("alpha")


def test_a_wrong_hash_is_a_clear_failure_and_keeps_the_old_venv(real: RealWorld) -> None:
    real.write_config(requirements=["six==1.16.0"], lock="requirements.lock")
    lock(real)
    real.ensure()
    marker = (real.venv / ".bootstrap-version").read_bytes()
    real.write_config(requirements=["six==1.17.0"], lock="requirements.lock")
    lock(real)
    path = real.root / "requirements.lock"
    # Every hash of the pinned release: uv accepts any one file that matches.
    path.write_text(re.sub(r"--hash=sha256:[0-9a-f]{64}", "--hash=sha256:" + "0" * 64,
                           path.read_text()))
    result = real.ensure(ok=False)
    assert result.returncode == 1
    assert "six==1.17.0" in result.stderr and "Hash mismatch" in result.stderr
    assert "Traceback" not in result.stderr
    assert (real.venv / ".bootstrap-version").read_bytes() == marker
    assert version_of(real, "six") == "1.16.0"


def test_repair_removes_a_package_installed_by_hand_and_keeps_skills(real: RealWorld) -> None:
    real.skill("alpha")
    real.write_config(requirements=["six==1.16.0"], lock="pylock.toml")
    lock(real)
    real.ensure()
    subprocess.run([str(real.uv), "pip", "install", "--python", str(real.python), "idna"],
                   env=real.env, check=True, capture_output=True)
    assert real.imports("idna")
    result = real.run("repair")
    assert result.returncode == 0, result.stderr
    assert re.search(r"removed idna \S+ \(neither pinned nor required by a skill\)",
                     result.stdout), result.stdout
    assert not real.imports("idna")
    assert real.imports("alpha") and version_of(real, "six") == "1.16.0"
    assert "found: nothing wrong" in real.run("repair").stdout

"""A setuptools skill from a git source, installed editable by the real uv as a user who is not
root (uid 65534 through ``setpriv``): its tree stays read-only, hashed and clean of build
output, and the venv imports it from that tree."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.gitrepo import Repo, daemon
from testing.skills import make_skill

NOBODY = 65534
SETUPTOOLS = """\
[build-system]
requires = ["setuptools>=65"]
build-backend = "setuptools.build_meta"

[project]
name = "setupskill"
version = "0.1.0"
"""
REPO = Path(__file__).resolve().parents[2]


def _as_nobody(*argv: str, env: dict[str, str], timeout: float = 300
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                           "--clear-groups", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _interpreter(env: dict[str, str]) -> str:
    """A Python of this version that uid 65534 can run, with the package and its dependencies
    importable (this venv's interpreter may live under root's home, which it cannot enter)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("running as another user needs root and setpriv")
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    probe = ("import os, sys, bootstrap.cli, structlog, filelock, platformdirs; "
             "os.stat(os.path.realpath(sys.executable))")  # uv resolves it: every part readable
    for candidate in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if os.path.exists(candidate) and _as_nobody(candidate, "-c", probe, env=env,
                                                    timeout=60).returncode == 0:
            return candidate
    pytest.skip(f"no Python {version} that uid {NOBODY} can run with this checkout importable")


@pytest.fixture
def home() -> Iterator[Path]:
    """A home for uid 65534, outside pytest's root-only temp tree."""
    base = Path(tempfile.mkdtemp(prefix="kb-nobody-"))
    try:
        base.chmod(0o755)
        (base / "home").mkdir()
        os.chown(base / "home", NOBODY, NOBODY)
        yield base / "home"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_setuptools_skill_from_git_installs_editable_as_a_user_who_is_not_root(
        home: Path, tmp_path: Path) -> None:
    import uv

    site = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
           "XDG_DATA_HOME": str(home / ".local/share"), "XDG_STATE_HOME": str(home / ".state"),
           "XDG_CONFIG_HOME": str(home / ".config"), "UV_CACHE_DIR": str(home / "uv-cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO), *site]),
           "KERNEL_BOOTSTRAP_UV": uv.find_uv_bin(), "KERNEL_BOOTSTRAP_BATCH_BUILDS": "1"}
    python = _interpreter(env)
    repo = Repo(tmp_path / "served" / "tools")
    make_skill(repo.path / "skills", "setupskill", {
        "pyproject.toml": SETUPTOOLS, "src/setupskill/__init__.py": "VALUE = 'from git'\n"})
    repo.commit("first")
    config = home / "kernel-bootstrap.toml"
    with daemon(tmp_path / "served") as served:
        config.write_text(f'venv = "venv"\npython = "{python}"\nskills = [{{ git = '
                          f'"{served.url("tools")}", subdirectory = "skills/setupskill" }}]\n')
        os.chown(config, NOBODY, NOBODY)
        done = _as_nobody(python, "-m", "bootstrap", "ensure", "--json", "--strict",
                          "--config", str(config), env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["installed"] == ["setupskill"] and out["failed"] == []
    imported = _as_nobody(str(home / "venv" / "bin" / "python"), "-c",
                          "import setupskill; print(setupskill.VALUE, setupskill.__file__)",
                          env={**env, "PYTHONPATH": ""}, timeout=60)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith("from git "), imported.stdout
    where = imported.stdout.split()[-1]
    [tree] = (home / ".cache" / "kernel-bootstrap" / "git" / "trees").glob("*/setupskill")
    assert where == str(tree / "src" / "setupskill" / "__init__.py")
    # Built without writing into the tree: still read-only, nothing added, the hash holds.
    assert not list(tree.rglob("*.egg-info"))
    assert all(not stat.S_IMODE(p.lstat().st_mode) & 0o222 for p in [tree, *tree.rglob("*")])
    checked = _as_nobody(python, "-m", "bootstrap", "verify", "--config", str(config), env=env,
                         timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr

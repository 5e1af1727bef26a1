"""The home guard of tests/conftest.py: no test may touch the person's state in the real home;
what the person does there meanwhile is no test's failure."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from testing import innerpytest
from testing.homeguard import HomeGuard
from testing.processes import wait_for
from tests.conftest import REAL_HOME


def test_home_and_caches_point_at_temporary_paths() -> None:
    for var in ("HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "UV_CACHE_DIR"):
        value = Path(os.environ[var]).resolve()
        assert value != REAL_HOME and REAL_HOME not in value.parents, var


def test_platformdirs_default_venv_is_under_the_temporary_home() -> None:
    import platformdirs

    data = Path(platformdirs.user_data_dir("kernel-bootstrap")).resolve()
    assert Path(os.environ["HOME"]).resolve() in data.parents


# -- the guard on its own: a stand-in for the real home under tmp_path ---------------------------

def _guard(tmp_path: Path) -> tuple[HomeGuard, Path]:
    real = tmp_path / "real-home"
    real.mkdir()
    return HomeGuard(real, {}), real / ".local" / "share" / "kernel-bootstrap"


def _rename_into(data: Path) -> None:
    (data.parent / "staged").write_text("x")
    os.replace(data.parent / "staged", data / "venv.lock")


def _mkdir_by_dir_fd(data: Path) -> None:
    fd = os.open(data, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.mkdir("venv", dir_fd=fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("write", [
    lambda data: (data / "venv").mkdir(),
    lambda data: (data / "venv.lock").write_text("1"),
    lambda data: os.close(os.open(data / "venv.lock", os.O_WRONLY | os.O_CREAT)),
    _rename_into,
    _mkdir_by_dir_fd,
    lambda data: shutil.rmtree(data),
], ids=["mkdir", "write_text", "os.open", "rename-into", "mkdir-by-dir_fd", "rmtree"])
def test_a_write_by_the_test_process_under_the_persons_state_is_an_offence_naming_it(
        tmp_path: Path, write: Callable[[Path], None]) -> None:
    guard, data = _guard(tmp_path)
    data.mkdir(parents=True)
    with guard.watching() as offences:
        write(data)
    assert offences and all(str(data) in o for o in offences), offences


def test_reading_the_persons_state_and_writing_elsewhere_are_no_offence(tmp_path: Path) -> None:
    guard, data = _guard(tmp_path)
    data.mkdir(parents=True)
    (data / "config").write_text("x")
    with guard.watching() as offences:
        assert (data / "config").read_text() == "x"
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "file").write_text("x")
        subprocess.run(["true"], check=True)
    assert offences == []


@pytest.mark.parametrize(("env", "offending"), [
    ({"PATH": "/usr/bin"}, "kernel-bootstrap"),  # no HOME: the account's own
    ({"HOME": "{real}"}, "kernel-bootstrap"),
    ({"HOME": "{tmp}", "XDG_CACHE_HOME": "{real}/.cache"}, ".cache/uv"),
    ({"HOME": "{tmp}", "KERNEL_BOOTSTRAP_VENV": "{real}/.local/share/kernel-bootstrap/venv"},
     "KERNEL_BOOTSTRAP_VENV"),
])
def test_an_environment_leading_to_the_persons_state_is_an_offence(
        tmp_path: Path, env: dict[str, str], offending: str) -> None:
    guard, _ = _guard(tmp_path)
    env = {k: v.format(real=guard.real_home, tmp=tmp_path / "home") for k, v in env.items()}
    assert any(offending in o for o in guard.environment_offences(env, "a child"))
    assert guard.environment_offences({"HOME": str(tmp_path / "home")}, "a child") == []


def test_a_child_told_a_path_in_the_persons_state_is_an_offence(tmp_path: Path) -> None:
    guard, data = _guard(tmp_path)
    with guard.watching() as offences:
        subprocess.run(["true", str(data / "venv")], check=True)
    assert offences == [f"subprocess.Popen of true names {data / 'venv'}"]


# -- the guard as every test has it (tests/conftest.py), in a pytest of its own ------------------

WAITS_FOR_THE_PERSON = """
    import os, time
    from pathlib import Path

    def test_runs_while_the_person_uses_the_tool():
        here = Path(os.environ["PROBE_DIR"])
        (here / "ready").touch()
        deadline = time.monotonic() + 60
        while not (here / "go").exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
"""


def test_what_the_person_makes_in_their_home_while_a_test_runs_fails_no_test(
        tmp_path: Path) -> None:
    home = tmp_path / "person"
    home.mkdir()
    proc = innerpytest.run(tmp_path, WAITS_FOR_THE_PERSON, home, {"PROBE_DIR": str(tmp_path)})
    wait_for((tmp_path / "ready").exists, timeout=60, proc=proc)
    data = home / ".local" / "share" / "kernel-bootstrap"  # what their first `ensure` makes
    data.mkdir(parents=True)
    (data / "venv.lock").touch()
    (home / ".cache" / "kernel-bootstrap").mkdir(parents=True)
    (tmp_path / "go").touch()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out


@pytest.mark.parametrize(("body", "said"), [
    ('(REAL_HOME / ".local/share/kernel-bootstrap/venv").mkdir(parents=True)',
     "os.mkdir('{real}/.local/share/kernel-bootstrap/venv')"),
    ('subprocess.run(["true"], env={"PATH": os.environ["PATH"]}, check=True)  # no HOME',
     "subprocess.Popen of true would use {real}/.local/share/kernel-bootstrap"),
], ids=["in-process", "child"])
def test_a_test_that_touches_the_persons_state_fails_naming_what_it_did(
        tmp_path: Path, body: str, said: str) -> None:
    home = tmp_path / "person"
    home.mkdir()
    source = f"""
        import os, subprocess
        from tests.conftest import REAL_HOME

        def test_touches_the_persons_state():
            {body}
    """
    proc = innerpytest.run(tmp_path, source, home)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "the test touched the person's state in the real home directory" in out
    assert said.format(real=home) in out


def test_a_variable_as_the_person_launched_the_suite_with_it_is_theirs(tmp_path: Path) -> None:
    real = tmp_path / "real-home"
    path = f"{real}/.local/share/kernel-bootstrap/venv/bin:/usr/bin"  # their kernel venv, active
    guard = HomeGuard(real, {"PATH": path})
    assert guard.environment_offences({"HOME": str(tmp_path / "home"), "PATH": path}, "x") == []

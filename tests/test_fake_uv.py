"""fake_uv, driven the way kernel-bootstrap drives uv: as a subprocess, checked from outside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from testing.uvlog import fake_uv_shim, read_calls, read_uv_log

_FAULTS = ("FAKE_UV_FAIL", "FAKE_UV_HANG", "FAKE_UV_OFFINDEX", "FAKE_UV_DELAY",
           "FAKE_UV_DELAY_EACH", "FAKE_UV_SCRIPTS", "UV_OFFLINE", "UV_VENV_CLEAR",
           "FAKE_UV_ENOSPC", "FAKE_UV_ENOSPC_ONCE", "FAKE_UV_PARTIAL")


class Uv:
    """Runs the shim like kernel-bootstrap runs uv; `log` is this test's $FAKE_UV_LOG."""

    def __init__(self, shim: Path, log: Path) -> None:
        self.shim = shim
        self.log = log

    def __call__(self, *args: str | Path, env: Mapping[str, str] | None = None,
                 code: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.shim), *map(str, args)], capture_output=True,
                              text=True, env={**os.environ, **(env or {})}, timeout=30,
                              check=False)
        assert done.returncode == code, done.stderr
        return done

    def popen(self, *args: str | Path, env: Mapping[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen([str(self.shim), *map(str, args)], text=True,
                                env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def install(self, venv: Path, *args: str | Path, env: Mapping[str, str] | None = None,
                code: int = 0) -> subprocess.CompletedProcess[str]:
        return self(
            "pip", "install", "--python", venv / "bin" / "python", *args, env=env, code=code)


@pytest.fixture
def uv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Uv:
    log = tmp_path / "uv.log"
    monkeypatch.setenv("FAKE_UV_LOG", str(log))
    for variable in _FAULTS:
        monkeypatch.delenv(variable, raising=False)
    return Uv(fake_uv_shim(tmp_path / "shim"), log)


@pytest.fixture
def venv(uv: Uv, tmp_path: Path) -> Path:
    path = tmp_path / "venv"
    uv("venv", "--relocatable", "-q", path)
    return path


def make_project(root: Path, name: str, version: str = "0.1.0",
                 dependencies: tuple[str, ...] = (), src: bool = True) -> Path:
    """A tiny skill project whose module reports where it was imported from."""
    directory = root / name
    module = name.replace("-", "_")
    package = directory / "src" / module if src else directory / module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('VALUE = "original"\n', encoding="utf-8")
    deps = ", ".join(json.dumps(d) for d in dependencies)
    (directory / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "{version}"\ndependencies = [{deps}]\n',
        encoding="utf-8")
    return directory


def py(venv: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in the venv's own interpreter: what another process sees."""
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                          text=True, timeout=30, check=False)


def importable(venv: Path, module: str) -> bool:
    return py(venv, f"import {module}").returncode == 0


def site_packages(venv: Path) -> Path:
    return next(venv.glob("lib/python*/site-packages"))


def test_version_says_it_is_fake(uv: Uv) -> None:
    assert uv("--version").stdout == "uv 0.13.9 (fake)\n"


def test_venv_builds_a_working_interpreter(uv: Uv, tmp_path: Path) -> None:
    done = uv("venv", tmp_path / "env")
    assert "Creating virtual environment at: " in done.stderr
    prefix = py(tmp_path / "env", "import sys; print(sys.prefix)").stdout.strip()
    assert Path(prefix) == tmp_path / "env"


@pytest.mark.parametrize("is_venv", [True, False], ids=["venv", "plain-dir"])
def test_venv_refuses_an_existing_non_empty_directory_without_clear(
    uv: Uv, tmp_path: Path, is_venv: bool
) -> None:
    target = tmp_path / "env"
    if is_venv:
        uv("venv", target)
    else:
        target.mkdir()
        (target / "keep.txt").write_text("mine", encoding="utf-8")
    done = uv("venv", target, code=2)
    assert "already exists at" in done.stderr


def test_venv_clear_replaces_a_venv_but_refuses_a_plain_directory(uv: Uv, tmp_path: Path) -> None:
    uv("venv", tmp_path / "env")
    (tmp_path / "env" / "stale").write_text("x", encoding="utf-8")
    uv("venv", "--clear", tmp_path / "env")
    assert not (tmp_path / "env" / "stale").exists()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "keep.txt").write_text("mine", encoding="utf-8")
    assert "not a virtual environment" in uv("venv", "--clear", plain, code=2).stderr
    assert (plain / "keep.txt").read_text(encoding="utf-8") == "mine"


def test_venv_allow_existing_and_relocatable(uv: Uv, tmp_path: Path) -> None:
    uv("venv", tmp_path / "env")
    uv("venv", "--allow-existing", "--relocatable", tmp_path / "env")
    assert "relocatable = true" in (tmp_path / "env" / "pyvenv.cfg").read_text(encoding="utf-8")


def test_venv_rejects_a_python_version_it_cannot_provide(uv: Uv, tmp_path: Path) -> None:
    done = uv("venv", "--python", "2.7", tmp_path / "env", code=2)
    assert "No interpreter found for Python 2.7" in done.stderr
    assert not (tmp_path / "env").exists()


def test_editable_install_imports_and_records_its_source(uv: Uv, venv: Path,
                                                         tmp_path: Path) -> None:
    project = make_project(tmp_path, "demo-skill")
    done = uv.install(venv, "-e", project)
    assert f" + demo-skill==0.1.0 (from {project.as_uri()})" in done.stderr
    shown = py(venv, "import demo_skill, importlib.metadata as m; "
                     "print(demo_skill.__file__, m.version('demo-skill'))").stdout.split()
    assert shown == [str(project / "src" / "demo_skill" / "__init__.py"), "0.1.0"]
    direct_url = site_packages(venv) / "demo_skill-0.1.0.dist-info" / "direct_url.json"
    assert json.loads(direct_url.read_text(encoding="utf-8")) == {
        "url": project.as_uri(), "dir_info": {"editable": True}}
    listed = json.loads(uv("pip", "list", "--python", venv / "bin" / "python",
                           "--format", "json").stdout)
    assert listed == [{"name": "demo-skill", "version": "0.1.0",
                       "editable_project_location": str(project)}]


def test_a_source_edit_is_visible_without_reinstall(uv: Uv, venv: Path, tmp_path: Path) -> None:
    project = make_project(tmp_path, "demo-skill", src=False)
    uv.install(venv, "-e", project)
    (project / "demo_skill" / "__init__.py").write_text('VALUE = "edited"\n', encoding="utf-8")
    assert py(venv, "import demo_skill; print(demo_skill.VALUE)").stdout == "edited\n"


def test_requirements_file_editables_are_checked_not_rewritten_while_fresh(
    uv: Uv, venv: Path, tmp_path: Path
) -> None:
    first, second = make_project(tmp_path, "skill-a"), make_project(tmp_path, "skill-b")
    requirements = tmp_path / "reqs.txt"
    requirements.write_text(f"# skills\n-e {first}\n\n-e {second}\n", encoding="utf-8")
    uv.install(venv, "-r", requirements)
    assert importable(venv, "skill_a") and importable(venv, "skill_b")
    record = site_packages(venv) / "skill_a-0.1.0.dist-info" / "RECORD"
    before = record.stat().st_mtime_ns
    assert "Checked 2 packages" in uv.install(venv, "-r", requirements).stderr
    assert record.stat().st_mtime_ns == before
    # uv keys freshness on pyproject.toml's mtime: touching one rebuilds only that one.
    os.utime(second / "pyproject.toml", ns=(before + 10**9, before + 10**9))
    done = uv.install(venv, "-r", requirements)
    assert "Installed 1 package" in done.stderr and "skill-b" in done.stderr
    assert record.stat().st_mtime_ns == before


def test_command_line_editable_is_always_reinstalled(uv: Uv, venv: Path, tmp_path: Path) -> None:
    project = make_project(tmp_path, "demo-skill")
    uv.install(venv, "-e", project)
    done = uv.install(venv, "-e", project)
    assert f" ~ demo-skill==0.1.0 (from {project.as_uri()})" in done.stderr


def test_a_new_version_replaces_the_old_distribution(uv: Uv, venv: Path, tmp_path: Path) -> None:
    project = make_project(tmp_path, "demo-skill")
    uv.install(venv, "-e", project)
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text(encoding="utf-8").replace("0.1.0", "0.2.0"),
                         encoding="utf-8")
    uv.install(venv, "-e", project)
    assert sorted(p.name for p in site_packages(venv).glob("demo_skill-*")) == [
        "demo_skill-0.2.0.dist-info"]


def test_fake_uv_fail_fails_the_whole_call_and_installs_nothing(
    uv: Uv, venv: Path, tmp_path: Path
) -> None:
    good, bad = make_project(tmp_path, "good-skill"), make_project(tmp_path, "bad-skill")
    done = uv.install(venv, "-e", good, "-e", bad, "requests",
                      env={"FAKE_UV_FAIL": "bad_skill"}, code=1)
    assert f"Failed to build `bad-skill @ {bad.as_uri()}`" in done.stderr
    assert "fake build failure for bad-skill (FAKE_UV_FAIL)" in done.stderr
    assert not list(site_packages(venv).iterdir())
    assert not importable(venv, "good_skill")


def test_fake_uv_hang_is_logged_then_hangs_until_killed(uv: Uv, venv: Path,
                                                        tmp_path: Path) -> None:
    project = make_project(tmp_path, "slow-skill")
    python = venv / "bin" / "python"
    process = uv.popen("pip", "install", "--python", python, "-e", project,
                       env={"FAKE_UV_HANG": "slow-skill"})
    try:
        time.sleep(1)
        assert process.poll() is None, "FAKE_UV_HANG should keep the call running"
        assert ["pip", "install", "--python", str(python), "-e", str(project)] in read_uv_log(
            uv.log)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    assert not list(site_packages(venv).iterdir())


def test_off_index_dependency_fails_resolution_unless_a_sibling_editable_provides_it(
    uv: Uv, venv: Path, tmp_path: Path
) -> None:
    needs = make_project(tmp_path, "needs-helper", dependencies=("helper-lib>=1.0",))
    helper = make_project(tmp_path, "helper-lib", version="1.2.0")
    env = {"FAKE_UV_OFFINDEX": "helper_lib"}
    done = uv.install(venv, "-e", needs, env=env, code=1)
    assert ("Because helper-lib was not found in the package registry and needs-helper==0.1.0 "
            "depends on helper-lib>=1.0") in done.stderr
    assert not list(site_packages(venv).iterdir())
    uv.install(venv, "-e", needs, "-e", helper, env=env)
    assert importable(venv, "needs_helper") and importable(venv, "helper_lib")


def test_index_dependencies_become_fake_packages_with_console_scripts(
    uv: Uv, venv: Path, tmp_path: Path
) -> None:
    project = make_project(tmp_path, "web-skill", dependencies=("requests", "Rich>=13.1"))
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("requests==2.31.0\n", encoding="utf-8")
    uv.install(venv, "-e", project, "-c", constraints, env={"FAKE_UV_SCRIPTS": "rich"})
    versions = py(venv, "import requests, rich; print(requests.__version__, rich.__version__)")
    assert versions.stdout.split() == ["2.31.0", "13.1"]
    script = subprocess.run([str(venv / "bin" / "rich")], capture_output=True, text=True,
                            check=True)
    assert script.stdout == "rich 13.1\n"


def test_uninstall_removes_the_distribution_and_skips_unknown_names(
    uv: Uv, venv: Path, tmp_path: Path
) -> None:
    uv.install(venv, "-e", make_project(tmp_path, "demo-skill"))
    done = uv("pip", "uninstall", "--python", venv / "bin" / "python", "demo-skill", "nothing")
    assert "warning: Skipping nothing as it is not installed" in done.stderr
    assert " - demo-skill==0.1.0" in done.stderr
    assert not importable(venv, "demo_skill")
    assert not list(site_packages(venv).iterdir())


def test_a_kill_between_packages_leaves_only_whole_installs(uv: Uv, venv: Path,
                                                           tmp_path: Path) -> None:
    projects = [make_project(tmp_path, f"skill-{n}") for n in "abc"]
    args = [arg for project in projects for arg in ("-e", str(project))]
    process = uv.popen("pip", "install", "--python", venv / "bin" / "python", *args,
                       env={"FAKE_UV_DELAY_EACH": "0.4"})
    deadline = time.monotonic() + 10
    while not list(site_packages(venv).glob("*.dist-info")) and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    installed = sorted(p.name for p in site_packages(venv).glob("*.dist-info"))
    assert installed == ["skill_a-0.1.0.dist-info"]
    assert importable(venv, "skill_a")


def test_every_invocation_logs_one_line_even_when_it_fails(uv: Uv, venv: Path) -> None:
    uv("--version")
    uv("pip", "install", "--python", venv / "bin" / "python", "--bogus", "x", code=2)
    uv("pip", "list", "--python", venv / "bin" / "python")
    calls = read_uv_log(uv.log)
    assert calls[0][0] == "venv"
    assert calls[1:] == [["--version"],
                         ["pip", "install", "--python", str(venv / "bin" / "python"), "--bogus",
                          "x"],
                         ["pip", "list", "--python", str(venv / "bin" / "python")]]


def test_misuse_exits_2_like_uv(uv: Uv, venv: Path, tmp_path: Path) -> None:
    python = venv / "bin" / "python"
    assert "unexpected argument '--bogus' found" in uv(
        "pip", "install", "--python", python, "--bogus", "x", code=2).stderr
    assert "unrecognized subcommand 'sync'" in uv("sync", code=2).stderr
    assert "No virtual environment found" in uv("pip", "install", "requests", code=2).stderr
    uv("pip", "install", "-q", "requests", env={"VIRTUAL_ENV": str(venv)})
    assert importable(venv, "requests")


def test_an_editable_without_a_project_table_fails_to_build(uv: Uv, venv: Path,
                                                            tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    uv.install(venv, "-e", tmp_path / "empty", code=1)
    (tmp_path / "empty" / "pyproject.toml").write_text('[project]\nversion = "1"\n',
                                                        encoding="utf-8")
    assert "project.name" in uv.install(venv, "-e", tmp_path / "empty", code=1).stderr


def test_a_full_disk_leaves_a_dist_info_without_files_which_the_next_call_trusts(
        uv: Uv, venv: Path) -> None:
    done = uv.install(venv, "six", "numpy", env={"FAKE_UV_ENOSPC": "numpy"}, code=2)
    assert "No space left on device (os error 28)" in done.stderr
    site = site_packages(venv)
    assert (site / "numpy-1.0.0.dist-info" / "RECORD").is_file()
    assert "numpy/__init__.py,sha256=" in (site / "numpy-1.0.0.dist-info" / "RECORD").read_text()
    assert not (site / "numpy").exists() and importable(venv, "six")
    again = uv.install(venv, "six", "numpy")  # as the real uv: "installed" by its dist-info
    assert "Checked 2 packages" in again.stderr and not importable(venv, "numpy")


def test_a_full_disk_once_fails_one_call_and_a_partial_install_reports_success(
        uv: Uv, venv: Path, tmp_path: Path) -> None:
    once = tmp_path / "once"
    once.touch()
    faults = {"FAKE_UV_ENOSPC": "numpy", "FAKE_UV_ENOSPC_ONCE": str(once)}
    uv.install(venv, "numpy", env=faults, code=2)
    assert not once.exists()
    uv.install(venv, "numpy", "--reinstall", env=faults)
    assert importable(venv, "numpy")
    uv.install(venv, "requests", env={"FAKE_UV_PARTIAL": "requests"})
    assert (site_packages(venv) / "requests-1.0.0.dist-info").is_dir()
    assert not importable(venv, "requests")


def test_the_index_hatchling_builds_an_editable_wheel_that_installs(uv: Uv, venv: Path,
                                                                    tmp_path: Path) -> None:
    project = make_project(tmp_path, "wheel-skill", dependencies=("six",))
    build_env = tmp_path / "build-env"
    uv("venv", "-q", build_env)
    uv.install(build_env, "hatchling")
    out = tmp_path / "out"
    out.mkdir()
    built = subprocess.run([str(build_env / "bin" / "python"), "-I", "-c",
                            f"import hatchling.build as b; print(b.build_editable({str(out)!r}))"],
                           cwd=project, capture_output=True, text=True, check=True)
    wheel = out / built.stdout.strip()
    assert wheel.name == "wheel_skill-0.1.0-py3-none-any.whl"
    uv.install(venv, f"wheel-skill @ {wheel.as_uri()}")
    assert py(venv, "import wheel_skill; print(wheel_skill.VALUE)").stdout == "original\n"
    info = site_packages(venv) / "wheel_skill-0.1.0.dist-info"
    assert (info / "INSTALLER").read_text() == "uv"
    assert "Requires-Dist: six" in (info / "METADATA").read_text()
    [call] = [c for c in read_calls(uv.log) if c.wheels]
    assert call.requirements == ["wheel-skill"] and call.wheels == 1


def test_compile_bytecode_compiles_what_the_call_installed_and_only_that(
        uv: Uv, venv: Path) -> None:
    site = next(venv.glob("lib/python*/site-packages"))
    uv.install(venv, "six")
    done = uv.install(venv, "--compile-bytecode", "idna", "six")
    assert "Bytecode compiled 1 file" in done.stderr
    assert list((site / "idna" / "__pycache__").glob("__init__.*.pyc"))
    assert not (site / "six" / "__pycache__").exists()  # installed before, uncompiled: as uv
    assert ["pip", "install", "--python", str(venv / "bin" / "python"), "--compile-bytecode",
            "idna", "six"] in read_uv_log(uv.log)

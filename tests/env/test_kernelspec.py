"""`kernelspec install`: ensure, then a kernel.json that runs the venv, written atomically."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bootstrap import warm
from bootstrap.config import config_from_dict
from bootstrap.env import kernelspec
from bootstrap.errors import ConfigError
from testing.seams import Seam, seam_env
from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.write_config(requirements=["ipykernel>=6"])
    return w


def install(world: World, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = world.run("kernelspec", "install", "--json", *args, env=env)
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def spec_at(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path / "kernel.json").read_text())
    return data


def test_install_ensures_then_writes_a_spec_that_starts_the_kernel_through_run(
        world: World, tmp_path: Path) -> None:
    out = install(world, "--prefix", str(tmp_path / "prefix"))
    path = tmp_path / "prefix" / "share" / "jupyter" / "kernels" / "kernel-bootstrap"
    # The interpreter running the CLI, without site, on the directory this package came from
    # (bootstrap.cli.lean_run), then the gate: the console script installed beside that
    # interpreter (python -m bootstrap here), by absolute path, so Jupyter's PATH does not
    # matter; the lean entry execs it for anything it does not answer warm.
    # Before them, where this install has it, the native stand-in (it asks the server itself,
    # and execs the rest for anything else): with the venv and config it asks for.
    script = Path(sys.executable).parent / "kernel-bootstrap"
    package = Path(kernelspec.__file__).resolve().parents[2]
    native = package / "bootstrap" / "kernels" / "kb-standin"
    first = [str(native), str(world.venv), str(world.config)] if native.exists() else []
    assert out == {"name": "kernel-bootstrap", "path": str(path),
                   "argv": [*first, sys.executable, "-I", "-S", "-c", kernelspec.LEAN_CODE,
                            str(package), str(script), "run", "--config", str(world.config),
                            "--", "-m", "ipykernel_launcher", "-f", "{connection_file}"]}
    assert world.imports("ipykernel") and world.imports("alpha")
    spec = spec_at(path)
    assert spec["argv"] == out["argv"]
    assert spec["language"] == "python"
    assert spec["display_name"] == "Python (kernel-bootstrap)"
    assert spec["metadata"] == {"kernel_bootstrap": {"config": str(world.config),
                                                     "venv": str(world.venv)}}
    assert sorted(p.name for p in path.iterdir()) == ["kernel.json"]


def test_direct_writes_a_spec_that_starts_the_managed_interpreter_itself(
        world: World, tmp_path: Path) -> None:
    out = install(world, "--prefix", str(tmp_path), "--direct")
    spec = spec_at(Path(out["path"]))
    assert spec["argv"] == out["argv"] == [str(world.python), "-m", "ipykernel_launcher", "-f",
                                           "{connection_file}"]
    assert "env" not in spec


def test_provisioner_names_ours_in_the_spec_and_keeps_the_gates_argv_as_its_fallback(
        world: World, tmp_path: Path) -> None:
    plain = install(world, "--prefix", str(tmp_path / "a"))
    out = install(world, "--prefix", str(tmp_path / "b"), "--provisioner")
    spec = spec_at(Path(out["path"]))
    assert spec["argv"] == out["argv"] == plain["argv"]
    assert spec["metadata"] == {"kernel_bootstrap": {"config": str(world.config),
                                                     "venv": str(world.venv)},
                                "kernel_provisioner": {"provisioner_name": kernelspec.PROVISIONER}}


def test_provisioner_and_direct_together_are_a_usage_error(world: World, tmp_path: Path) -> None:
    # --direct has no gate: nothing to fall back to, and no fingerprint kept for the provisioner.
    result = world.run("kernelspec", "install", "--prefix", str(tmp_path), "--direct",
                       "--provisioner")
    assert result.returncode == 2
    assert "--provisioner: not allowed with argument --direct" in result.stderr
    assert not (tmp_path / "share").exists()


def test_the_spec_carries_the_overrides_in_force_and_no_credentials(
        world: World, tmp_path: Path) -> None:
    venv = tmp_path / "elsewhere"
    out = install(world, "--prefix", str(tmp_path), env={
        "KERNEL_BOOTSTRAP_VENV": str(venv),
        "KERNEL_BOOTSTRAP_SNAPSHOTS": "s3://alice:hunter2@bucket/envs",
        "AWS_SECRET_ACCESS_KEY": "hunter2", "UV_INDEX_URL": "https://u:hunter2@index/simple",
    })
    text = (Path(out["path"]) / "kernel.json").read_text()
    assert "hunter2" not in text
    assert json.loads(text)["env"] == {"KERNEL_BOOTSTRAP_VENV": str(venv),
                                       "KERNEL_BOOTSTRAP_UV": world.env["KERNEL_BOOTSTRAP_UV"],
                                       "KERNEL_BOOTSTRAP_BATCH_BUILDS": "0"}


def test_the_user_location_is_the_jupyter_data_dir(world: World, tmp_path: Path) -> None:
    data_dir = tmp_path / "jupyter-data"
    out = install(world, "--user", "--name", "agent", env={"JUPYTER_DATA_DIR": str(data_dir)})
    assert out["path"] == str(data_dir / "kernels" / "agent")
    assert spec_at(Path(out["path"]))["display_name"] == "Python (agent)"


def test_without_a_location_it_installs_for_the_user(world: World, tmp_path: Path) -> None:
    env = {k: v for k, v in world.env.items() if k != "JUPYTER_DATA_DIR"}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    world.env = env
    out = install(world, "--display-name", "My agent")
    assert out["path"] == str(tmp_path / "xdg" / "jupyter" / "kernels" / "kernel-bootstrap")
    assert spec_at(Path(out["path"]))["display_name"] == "My agent"


def test_reinstalling_replaces_the_spec_and_leaves_nothing_beside_it(
        world: World, tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    first = Path(install(world, "--prefix", str(prefix))["path"])
    (first / "logo-64x64.png").write_bytes(b"old")
    install(world, "--prefix", str(prefix), "--display-name", "Second")
    assert spec_at(first)["display_name"] == "Second"
    assert sorted(p.name for p in first.iterdir()) == ["kernel.json"]
    jupyter = prefix / "share" / "jupyter"
    assert sorted(p.name for p in jupyter.iterdir()) == ["kernels"]
    assert sorted(p.name for p in (jupyter / "kernels").iterdir()) == ["kernel-bootstrap"]


def test_a_name_is_lower_cased_as_jupyter_does(world: World, tmp_path: Path) -> None:
    out = install(world, "--prefix", str(tmp_path), "--name", "Agent.Py_3-x")
    assert out["name"] == "agent.py_3-x" and out["path"].endswith("/kernels/agent.py_3-x")


def test_no_ipykernel_requirement_is_refused_before_anything_is_built(world: World,
                                                                      tmp_path: Path) -> None:
    world.write_config(requirements=["requests>=2", "ipykernel-helpers"])
    result = world.run("kernelspec", "install", "--prefix", str(tmp_path / "prefix"))
    assert result.returncode == 2
    assert "ipykernel" in result.stderr and "`requirements`" in result.stderr
    assert str(world.config) in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert world.uv_calls() == [] and not world.venv.exists()
    assert not (tmp_path / "prefix").exists()


@pytest.mark.parametrize("name", ["..", ".", "a/b", "a b", "", "ünï", "x" * 201, "../evil"])
def test_an_invalid_name_is_a_usage_error_before_anything_is_built(
        world: World, tmp_path: Path, name: str) -> None:
    result = world.run("kernelspec", "install", "--prefix", str(tmp_path / "p"), "--name", name)
    assert result.returncode == 2, result.stderr
    assert "invalid kernel name" in result.stderr and "Traceback" not in result.stderr
    assert world.uv_calls() == [] and not (tmp_path / "p").exists()


def test_the_ipykernel_check_understands_requirement_syntax(tmp_path: Path) -> None:
    file = tmp_path / "kernel-bootstrap.toml"
    for ok in (["IPyKernel"], ["ipykernel[test] >= 6 ; python_version >= '3.8'"], ["ipykernel"]):
        kernelspec.require_ipykernel(config_from_dict({"requirements": ok}, file))
    for bad in ([], ["ipykernel_extra"], ["jupyter"]):
        with pytest.raises(ConfigError, match="ipykernel"):
            kernelspec.require_ipykernel(config_from_dict({"requirements": bad}, file))


def test_user_data_dir_follows_jupyter_core(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    home = Path(os.path.expanduser("~"))
    with monkeypatch.context() as patch:
        patch.delenv("JUPYTER_DATA_DIR", raising=False)
        patch.delenv("XDG_DATA_HOME", raising=False)
        patch.setattr(sys, "platform", "linux")
        assert kernelspec.user_data_dir() == home / ".local" / "share" / "jupyter"
        patch.setattr(sys, "platform", "darwin")
        assert kernelspec.user_data_dir() == home / "Library" / "Jupyter"
        patch.setattr(sys, "platform", "win32")
        patch.setenv("APPDATA", str(tmp_path / "Roaming"))
        assert kernelspec.user_data_dir() == tmp_path / "Roaming" / "jupyter"
        patch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "explicit"))
        assert kernelspec.user_data_dir() == tmp_path / "explicit"


SPEC: kernelspec.KernelSpec = {"argv": ["/v/bin/python", *kernelspec.LAUNCHER],
                               "display_name": "new", "language": "python", "metadata": {}}


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    path = tmp_path / "share" / "jupyter" / "kernels"
    old = path / "agent"
    old.mkdir(parents=True)
    (old / "kernel.json").write_text('{"display_name": "old"}')
    return path


@pytest.mark.parametrize("no_exchange", ["", "1"])
def test_replacing_works_with_and_without_rename_exchange(
        kernels: Path, monkeypatch: pytest.MonkeyPatch, no_exchange: str) -> None:
    with monkeypatch.context() as patch:
        patch.setenv("KERNEL_BOOTSTRAP_NO_EXCHANGE", no_exchange)
        path = kernelspec.install_spec(kernels, "agent", SPEC)
    assert spec_at(path)["display_name"] == "new"
    assert sorted(p.name for p in kernels.parent.iterdir()) == ["kernels"]


def test_a_symlinked_spec_is_replaced_without_touching_its_target(kernels: Path,
                                                                  tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kernel.json").write_text("{}")
    (kernels / "linked").symlink_to(elsewhere)
    path = kernelspec.install_spec(kernels, "linked", SPEC)
    assert not path.is_symlink() and spec_at(path)["display_name"] == "new"
    assert (elsewhere / "kernel.json").read_text() == "{}"


class Interrupt(KeyboardInterrupt):
    """^C at a narrow seam, as a person at the shell would press it."""


@pytest.mark.parametrize("fault", [Interrupt(), OSError(errno.ENOSPC, "No space left on device")])
@pytest.mark.parametrize(("seam", "calls_before"), [("fsync", 0), ("rename", 0), ("rename", 1)])
def test_a_failed_install_keeps_the_old_spec_and_leaves_no_staging(
        kernels: Path, monkeypatch: pytest.MonkeyPatch, fault: BaseException, seam: str,
        calls_before: int) -> None:
    """``("rename", 1)`` fails the second rename: the old spec is already aside by then."""
    before = (kernels / "agent" / "kernel.json").read_bytes()
    real = getattr(os, seam)
    calls = {"n": 0}

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == calls_before + 1:
            raise fault
        return real(*args, **kwargs)

    with monkeypatch.context() as patch, pytest.raises(type(fault)):
        patch.setenv("KERNEL_BOOTSTRAP_NO_EXCHANGE", "1")
        patch.setattr(os, seam, broken)
        kernelspec.install_spec(kernels, "agent", SPEC)
    assert (kernels / "agent" / "kernel.json").read_bytes() == before
    assert sorted(p.name for p in kernels.parent.iterdir()) == ["kernels"]
    assert sorted(p.name for p in kernels.iterdir()) == ["agent"]


# --- a kill during the swap (rename-aside), with the seams of the fault tests ------------------

_KILLED_INSTALL = """
import json, sys
from pathlib import Path
from testing.seams import install_seams_from_env
install_seams_from_env()
from bootstrap.env import kernelspec
spec = json.loads(sys.argv[2])
kernelspec.install_spec(Path(sys.argv[1]), "agent", spec)
"""

KILL_POINTS = {
    # id: (call, a path substring, before/after)
    "journal written": ("replace", ".kernelspec-agent.swap.tmp-", "after"),
    "old spec aside": ("rename", "/kernels/agent", "after"),
    "before the new spec moves in": ("rename", ".kernelspec-agent.stage-", "before"),
    "new spec in, journal not yet removed": ("rename", ".kernelspec-agent.stage-", "after"),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_kill_between_the_renames_is_recovered_by_the_next_install(
        kernels: Path, point: str) -> None:
    call, match, when = KILL_POINTS[point]
    rule = Seam(call, "kill", match=match, when=when, times=1)
    env = seam_env({**os.environ, "KERNEL_BOOTSTRAP_NO_EXCHANGE": "1"}, rule)
    child = subprocess.run([sys.executable, "-c", _KILLED_INSTALL, str(kernels), json.dumps(SPEC)],
                           env=env, capture_output=True, text=True, check=False,
                           start_new_session=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    beside = sorted(p.name for p in kernels.parent.iterdir() if p.name != "kernels")
    assert beside, "a kill mid-swap leaves its staging or journal behind"

    # The next install finishes or undoes that swap before anything else, so even one that
    # then fails itself leaves a kernel.json in place.
    with pytest.MonkeyPatch.context() as patch, pytest.raises(OSError):
        patch.setattr(kernelspec, "write_file", _fails)
        kernelspec.install_spec(kernels, "agent", {**SPEC, "display_name": "newer"})
    assert spec_at(kernels / "agent")["display_name"] in ("old", "new")
    path = kernelspec.install_spec(kernels, "agent", {**SPEC, "display_name": "newer"})
    assert spec_at(path)["display_name"] == "newer"
    assert sorted(p.name for p in kernels.parent.iterdir()) == ["kernels"]
    assert sorted(p.name for p in kernels.iterdir()) == ["agent"]


def _fails(*_: object, **__: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_default_venv_is_written_into_the_spec_so_another_home_starts_the_same_one(
        world: World, tmp_path: Path) -> None:
    # A config naming no venv gets one under the user data dir: a launcher with another
    # XDG_DATA_HOME silently built a second venv there, while the metadata named the first.
    world.write_config(venv=None, requirements=["ipykernel>=6"])
    installed_with = tmp_path / "data-a"
    out = install(world, "--prefix", str(tmp_path / "prefix"),
                  env={"XDG_DATA_HOME": str(installed_with)})
    spec = spec_at(Path(out["path"]))
    venv = spec["metadata"]["kernel_bootstrap"]["venv"]
    assert venv.startswith(str(installed_with))
    world.clear_log()
    # The launcher: another HOME, no XDG_* (its cache holds no warm fingerprint either).
    launcher = tmp_path / "home-b"
    env = {k: v for k, v in world.env.items() if not k.startswith("XDG_")}
    env.update(HOME=str(launcher), **spec.get("env", {}))
    argv = [*spec["argv"][:spec["argv"].index("--") + 1], "-c", "import sys; print(sys.prefix)"]
    started = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120,
                             check=False)
    assert started.returncode == 0, started.stderr
    assert world.venv_calls() == [], "a second venv was built"
    assert started.stdout == f"{os.path.realpath(venv)}\n"
    assert spec["env"]["KERNEL_BOOTSTRAP_VENV"] == venv
    with pytest.MonkeyPatch.context() as patch:  # a launcher sharing the install's HOME
        patch.setenv("KERNEL_BOOTSTRAP_VENV", venv)
        assert warm.holds(str(world.config)) is not None, "its first start is warm"

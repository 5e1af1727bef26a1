"""The kernel server's ring, against the fake uv: its three config keys and the switch in the
environment, what the warm fingerprint records of them, ``serve`` when serving is off, and the
``status``/``gc`` reports with no server running. (A real server: tests/integration/
test_kernel_lifecycle.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap import warm
from bootstrap.config import load_config
from testing.world import World

SWITCH = "KERNEL_BOOTSTRAP_KERNEL_SERVER"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.delenv(SWITCH, raising=False)
    w = World(tmp_path)
    w.env.pop(SWITCH, None)
    w.skill("alpha")
    return w


def configure(world: World, extra: str) -> None:
    world.config.write_text(f'venv = "venv"\nskills = ["skills/*"]\n{extra}\n')


# -- the keys ----------------------------------------------------------------------------------

def test_the_kernel_keys_default_to_a_server_with_nothing_preloaded_and_15_minutes(
        world: World) -> None:
    config = load_config(world.config)
    assert (config.kernel_server, config.kernel_preload, config.kernel_idle_timeout) == (
        True, (), 900.0)


def test_the_kernel_keys_are_read(world: World) -> None:
    configure(world, 'kernel-server = false\nkernel-preload = ["numpy", "os.path", "_x1"]\n'
                     "kernel-idle-timeout = 2.5")
    config = load_config(world.config)
    assert (config.kernel_server, config.kernel_preload, config.kernel_idle_timeout) == (
        False, ("numpy", "os.path", "_x1"), 2.5)
    configure(world, "kernel-idle-timeout = 60")
    assert load_config(world.config).kernel_idle_timeout == 60.0


def test_a_preload_has_a_minute_unless_configured(world: World) -> None:
    assert load_config(world.config).kernel_preload_timeout == 60.0
    configure(world, "kernel-preload-timeout = 2")
    assert load_config(world.config).kernel_preload_timeout == 2.0


def test_one_spare_unless_configured(world: World) -> None:
    assert load_config(world.config).kernel_spares == 1
    configure(world, "kernel-spares = 0")
    assert load_config(world.config).kernel_spares == 0
    configure(world, "kernel-spares = 8")
    assert load_config(world.config).kernel_spares == 8


def assert_exit_2(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


_NOT_A_MODULE = "not a module name"
_NOT_SECONDS = "must be a number of seconds greater than 0"
_NOT_SPARES = "must be a whole number from 0 (off) to 8"


@pytest.mark.parametrize(("extra", "needles"), [
    ('kernel-preload = ["numpy", "not a module"]', ("kernel-preload[1]", _NOT_A_MODULE)),
    ('kernel-preload = ["numpy", "pandas/"]', ("kernel-preload[1]", _NOT_A_MODULE)),
    ('kernel-preload = ["", "numpy"]', ("kernel-preload[0]", _NOT_A_MODULE)),
    ('kernel-preload = ["a..b"]', ("kernel-preload[0]", _NOT_A_MODULE)),
    ('kernel-preload = ["1st"]', ("kernel-preload[0]", _NOT_A_MODULE)),
    ('kernel-preload = "numpy"', ("'kernel-preload'", "must be a list of strings")),
    ("kernel-preload = [1]", ("'kernel-preload'", "must be a list of strings")),
    ("kernel-idle-timeout = 0", ("'kernel-idle-timeout'", _NOT_SECONDS)),
    ("kernel-idle-timeout = -5", ("'kernel-idle-timeout'", _NOT_SECONDS)),
    ("kernel-idle-timeout = nan", ("'kernel-idle-timeout'", _NOT_SECONDS)),
    ("kernel-idle-timeout = inf", ("'kernel-idle-timeout'", _NOT_SECONDS)),
    ('kernel-idle-timeout = "900"', ("'kernel-idle-timeout'", _NOT_SECONDS)),
    ("kernel-idle-timeout = true", ("'kernel-idle-timeout'", _NOT_SECONDS)),
    ("kernel-preload-timeout = 0", ("'kernel-preload-timeout'", _NOT_SECONDS)),
    ('kernel-preload-timeout = "60"', ("'kernel-preload-timeout'", _NOT_SECONDS)),
    ("kernel-spares = -1", ("'kernel-spares'", _NOT_SPARES)),
    ("kernel-spares = 9", ("'kernel-spares'", _NOT_SPARES)),
    ("kernel-spares = 1.5", ("'kernel-spares'", _NOT_SPARES)),
    ('kernel-spares = "1"', ("'kernel-spares'", _NOT_SPARES)),
    ("kernel-spares = true", ("'kernel-spares'", _NOT_SPARES)),
    ('kernel-server = "no"', ("'kernel-server'", "must be true or false")),
    ("kernel-server = 0", ("'kernel-server'", "must be true or false")),
])
def test_a_bad_kernel_key_is_exit_2_naming_it_and_builds_nothing(
        world: World, extra: str, needles: tuple[str, ...]) -> None:
    configure(world, extra)
    assert_exit_2(world.run("ensure"), str(world.config), *needles)
    assert world.uv_calls() == [] and not world.venv.exists()


@pytest.mark.parametrize("value", ["yes", "2", "off", " 1"])
def test_a_bad_switch_in_the_environment_is_exit_2_naming_it_even_when_warm(
        world: World, value: str) -> None:
    world.ensure()  # warm from now on: the variable's change must still reach the full check
    assert_exit_2(world.run("ensure", env={SWITCH: value}), SWITCH)
    run = subprocess.run([sys.executable, "-m", "bootstrap", "--config", str(world.config),
                          "run", "--", "-c", "pass"], capture_output=True, text=True,
                         env={**world.env, SWITCH: value}, check=False)
    assert_exit_2(run, SWITCH)


@pytest.mark.parametrize("value", ["0", "1", ""])
def test_the_switch_takes_0_and_1(world: World, value: str) -> None:
    assert world.ensure(env={SWITCH: value}).stdout == f"{world.python}\n"


def test_the_starter_config_names_the_kernel_keys_commented() -> None:
    from bootstrap.commands.init import STARTER

    for key in ("kernel-server", "kernel-preload", "kernel-idle-timeout"):
        assert f"\n# {key} = " in STARTER, key


# -- what the warm path knows of them ---------------------------------------------------------

def fingerprint(world: World) -> list[str]:
    path = warm.fingerprint_path(str(world.config))
    assert path is not None
    return Path(path).read_text(encoding="utf-8").splitlines()


def test_the_fingerprint_records_a_config_that_turns_the_server_off(world: World) -> None:
    # The warm `run` reads no TOML: without this line it would hand kernels to a server the
    # config turned off.
    configure(world, "kernel-server = false")
    world.ensure()
    assert "kernel-server\toff" in fingerprint(world)
    assert warm.holds(str(world.config)) is not None  # and the start stays warm
    configure(world, "kernel-server = true")
    world.ensure()
    assert not [line for line in fingerprint(world) if line.startswith("kernel-server")]


def test_a_fingerprint_of_the_previous_format_is_not_believed(world: World) -> None:
    world.ensure()
    path = warm.fingerprint_path(str(world.config))
    assert path is not None
    text = Path(path).read_text(encoding="utf-8")
    assert text.startswith(f"{warm.FORMAT}\n")
    Path(path).write_text(text.replace(warm.FORMAT, "kernel-bootstrap-warm 4"))
    assert warm.holds(str(world.config)) is None


def _imports(world: World, *args: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a warm start imported, run as the console script runs it."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-c",
                             "from bootstrap.cli import run; run()", "--config",
                             str(world.config), *args],
                            capture_output=True, text=True, env={**world.env, **(env or {})},
                            check=False)
    return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def test_a_warm_run_that_is_no_kernel_launch_imports_nothing_of_the_server(
        world: World) -> None:
    world.ensure()
    ensure_imports = _imports(world, "ensure")
    assert _imports(world, "run", "--", "-c", "pass") == ensure_imports


@pytest.mark.parametrize(("extra", "env"), [("kernel-server = false", {}),
                                            ("", {SWITCH: "0"})])
def test_a_warm_kernel_launch_with_the_server_off_never_asks_one(
        world: World, extra: str, env: dict[str, str]) -> None:
    configure(world, extra)
    world.ensure(env=env)
    # `-m site` stands in for ipykernel_launcher (the fake venv has no ipykernel).
    imported = _imports(world, "run", "--", "-m", "site", "-f", "conn.json", env=env)
    assert "bootstrap.warm" in imported and "bootstrap.config" not in imported  # warm
    assert "bootstrap.kernels.client" not in imported


# -- serve, status, gc -------------------------------------------------------------------------

def test_serve_with_the_server_turned_off_is_exit_2_saying_how(world: World) -> None:
    assert_exit_2(world.run("serve", env={SWITCH: "0"}), f"{SWITCH}=0")
    configure(world, "kernel-server = false")
    assert_exit_2(world.run("serve"), "kernel-server = false", str(world.config))
    assert world.uv_calls() == [] and not world.venv.exists()  # refused before anything


def test_serve_with_a_provided_interpreter_is_exit_2(world: World) -> None:
    # KERNEL_BOOTSTRAP_PYTHON: no venv is managed, so there is no generation to serve.
    assert_exit_2(world.run("serve", env={"KERNEL_BOOTSTRAP_PYTHON": sys.executable}),
                  "KERNEL_BOOTSTRAP_PYTHON")


def test_status_and_gc_report_no_kernel_server(world: World) -> None:
    world.ensure()
    assert world.status()["kernel_server"] is None
    text = world.run("status")
    assert "\nkernel server: none\n" in text.stdout
    assert text.stdout.splitlines()[-1] == "ready:   yes"
    gc = world.run("gc", "--json")
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["kernel_servers_stopped"] == []

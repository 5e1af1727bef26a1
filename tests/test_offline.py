"""Offline against fake uv: ``offline`` (and its environment variables) puts ``--offline`` on
every uv call; an unreachable index makes the session offline, said once; locked runtimes and
build requirements go to the caches first. The real uv in a network namespace:
tests/integration/test_offline_real_uv.py."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("beta")
    w.write_config(requirements=["six"])
    return w


def _every_call_offline(world: World) -> None:
    calls = world.uv_calls()
    assert calls and all("--offline" in c for c in calls), calls


@pytest.mark.parametrize("how", ["config", "KERNEL_BOOTSTRAP_OFFLINE", "UV_OFFLINE"])
def test_offline_puts_offline_on_every_uv_call(world: World, how: str) -> None:
    env = {} if how == "config" else {how: "1"}
    if how == "config":
        world.write_config(requirements=["six"], offline=True)
    world.ensure(env=env)
    _every_call_offline(world)
    world.clear_log()
    world.write_config(requirements=["six"], offline=True, skills=["skills/alpha"])
    world.ensure(env=env)  # beta is uninstalled: that call too
    assert [c[:2] for c in world.uv_calls()] == [["pip", "uninstall"]]
    _every_call_offline(world)


def test_offline_with_an_uncached_requirement_fails_naming_it(world: World) -> None:
    world.write_config(requirements=["six", "notcached"], offline=True)
    result = world.run("ensure", env={"FAKE_UV_OFFINDEX": "notcached"})
    assert result.returncode == 1 and result.stdout == ""
    assert "notcached was not found in the cache" in result.stderr
    assert "offline: nothing it lacks is in the cache" in result.stderr
    assert "Traceback" not in result.stderr


def test_offline_must_be_a_boolean(world: World) -> None:
    world.config.write_text(world.config.read_text() + 'offline = "yes"\n')
    result = world.run("ensure")
    assert result.returncode == 2
    assert "key 'offline' must be true or false" in result.stderr


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local port nothing listens on: connecting to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_an_unreachable_index_makes_the_session_offline_and_says_so_once(
        world: World, closed_port: int) -> None:
    index = f"http://127.0.0.1:{closed_port}/simple"
    world.write_config(requirements=["six"], uv_args=["--index-url", index])
    result = world.ensure("--log-format", "json")
    warnings = [json.loads(line) for line in result.stderr.splitlines()
                if '"warning"' in line and "unreachable" in line]
    assert len(warnings) == 1
    assert warnings[0]["index"] == f"127.0.0.1:{closed_port}"
    assert "newest the caches hold" in warnings[0]["event"]
    installs = world.installs()
    assert installs and all("--offline" in c and index in c for c in installs)
    assert world.imports("alpha") and world.imports("six")


def test_a_reachable_index_is_used_as_configured(world: World) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        index = f"http://127.0.0.1:{server.getsockname()[1]}/simple"
        world.write_config(requirements=["six"], uv_args=["--index-url", index])
        result = world.ensure()
    assert "unreachable" not in result.stderr
    installs = world.installs()
    assert installs and all("--offline" not in c and index in c for c in installs)


def test_a_locked_runtime_installs_from_the_cache_first(world: World) -> None:
    world.write_config(requirements=["six"], lock="requirements.lock")
    assert world.run("lock").returncode == 0
    world.clear_log()
    world.ensure()
    pinned = [c for c in world.installs() if "--require-hashes" in c]
    assert len(pinned) == 1 and "--offline" in pinned[0]


def test_find_links_and_indexes_reach_uv_offline_too(world: World) -> None:
    links = world.root / "wheels"
    links.mkdir()
    args = ["--find-links", str(links), "--extra-index-url", "https://example.invalid/simple"]
    world.write_config(requirements=["six"], uv_args=args, offline=True)
    world.ensure()
    installs = world.installs()
    assert installs and all(str(links) in c and "https://example.invalid/simple" in c
                            and "--offline" in c for c in installs)


def test_lock_and_a_locked_ensure_stay_offline_when_configured(world: World) -> None:
    world.write_config(requirements=["six"], lock="requirements.lock", offline=True)
    assert world.run("lock").returncode == 0
    compiles = [c for c in world.uv_calls() if c[:2] == ["pip", "compile"]]
    assert compiles and all("--offline" in c for c in compiles)
    world.clear_log()
    world.ensure()
    _every_call_offline(world)


def test_offline_in_uv_args_means_offline_and_is_never_passed_twice(world: World) -> None:
    # The real uv refuses `--offline --offline` ("cannot be used multiple times").
    world.write_config(requirements=["six"], uv_args=["--offline"])
    world.ensure()
    _every_call_offline(world)
    assert all(c.count("--offline") == 1 for c in world.uv_calls()), world.uv_calls()

"""Integration tests: the real uv (the `uv` package's binary) on real local skill packages."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing import kernels, reaper
from testing.kernelworlds import KernelWorlds
from testing.uvlog import Call, real_uv_shim
from testing.world import World

# An in-tree build backend: hatchling, except that building the editable hangs while a HANG
# file sits in the project (and says so, with its pid, in HANGING). It lets a test SIGKILL a
# real uv in the middle of a real build.
HANG_BACKEND = '''
import os, time
from hatchling.build import *  # noqa: F403
from hatchling.build import build_editable as _build_editable

def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    here = os.path.dirname(__file__)
    if os.path.exists(os.path.join(here, "HANG")):
        with open(os.path.join(here, "HANGING.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(here, "HANGING.tmp"), os.path.join(here, "HANGING"))
    while os.path.exists(os.path.join(here, "HANG")):
        time.sleep(0.1)
    return _build_editable(wheel_directory, config_settings, metadata_directory)
'''


def _builds(call: Call) -> bool:
    """Whether ``call`` creates or fills a build environment of bootstrap.skills.builds."""
    return any(re.search(r"\.work-\d+-[0-9a-f]+/build-\d+/env", arg) for arg in call)


class RealWorld(World):
    """A World whose uv is the real one, behind a shim that logs each call as fake_uv does."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        import uv

        self.uv = real_uv_shim(root / "bin" / "uv-logged", uv.find_uv_bin())
        self.env["KERNEL_BOOTSTRAP_UV"] = str(self.uv)
        self.env.pop("UV_OFFLINE", None)
        self.env.pop("KERNEL_BOOTSTRAP_BATCH_BUILDS", None)  # what users get

    def uv_calls(self) -> list[Call]:
        """The calls about the managed venv; those filling a build environment are apart."""
        return [c for c in super().uv_calls() if not _builds(c)]

    def build_env_calls(self) -> list[Call]:
        return [c for c in super().uv_calls() if _builds(c)]

    def hanging_skill(self, name: str) -> Path:
        path = self.skill(name)
        text = (path / "pyproject.toml").read_text()
        text = text.replace('build-backend = "hatchling.build"',
                            'build-backend = "hang_backend"\nbackend-path = ["."]')
        (path / "pyproject.toml").write_text(text)
        (path / "hang_backend.py").write_text(HANG_BACKEND)
        return path

    def runtime_package(self, name: str = "kb-runtime-demo") -> str:
        """A local package used as a runtime requirement (no index needed but hatchling)."""
        path = self.root / "runtime" / name
        module = name.replace("-", "_")
        (path / module).mkdir(parents=True, exist_ok=True)
        (path / module / "__init__.py").write_text("READY = True\n")
        (path / "pyproject.toml").write_text(textwrap.dedent(f"""\
            [build-system]
            requires = ["hatchling"]
            build-backend = "hatchling.build"
            [project]
            name = "{name}"
            version = "1.0.0"
            [project.scripts]
            {name} = "{module}:main"
            """))
        (path / module / "__init__.py").write_text(
            "READY = True\n\ndef main():\n    print('runtime ok')\n")
        return f"{name} @ {path.as_uri()}"


@pytest.fixture
def real(tmp_path: Path) -> RealWorld:
    world = RealWorld(tmp_path)
    world.env.update({"UV_CACHE_DIR": os.environ["UV_CACHE_DIR"]})
    return world


def with_kernelspec(world: RealWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    *options: str) -> RealWorld:
    """``world`` with its kernelspec installed for the user (``options``: install's, e.g.
    ``--provisioner``), in a Jupyter data dir of the test's (which jupyter_client then searches
    too); the test process's environment becomes the world's, so that what jupyter_client
    starts (stand-ins, kernels, the servers they spawn) uses its uv and caches."""
    data = tmp_path / "jupyter-data"
    world.env["JUPYTER_DATA_DIR"] = str(data)
    result = world.run("kernelspec", "install", "--json", *options, timeout=600)
    assert result.returncode == 0, result.stderr
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(data))
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    return world


@pytest.fixture(scope="session")
def kernel_worlds(tmp_path_factory: pytest.TempPathFactory) -> KernelWorlds[RealWorld]:
    """ipykernel worlds, each built once per worker and copied for each test (see
    testing.kernelworlds)."""
    return KernelWorlds(_kernel_worlds_base(tmp_path_factory), RealWorld)


def _kernel_worlds_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.getbasetemp() / "kernel-worlds"  # the worker's
    base.mkdir(exist_ok=True)
    return base


def kernel_world_copy(worlds: KernelWorlds[RealWorld], monkeypatch: pytest.MonkeyPatch,
                      skills: tuple[str, ...] = (),
                      options: tuple[str, ...] = ("--json",)) -> RealWorld:
    """What :func:`with_kernelspec` makes of a world with ``skills`` and ipykernel as its
    runtime, a copy of one built once (``world/jupyter-data`` its Jupyter data dir); the test
    process's environment becomes the world's."""
    world = worlds.world(skills, options)
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    return world


@pytest.fixture(autouse=True)
def no_kernel_left(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After each test, no kernel, stand-in or kernel server of the test is left running: its
    servers get SIGTERM (they outlive a test by design, up to their idle timeout), its kernels a
    few seconds to end; whatever is left is killed and fails the test (testing.kernels).
    prime-agent's kernel template once leaked 55 orphaned kernels (issue 29): here a leak is a
    failure, not something the suite's reaper quietly cleans up."""
    tag = os.environ.get(reaper.TAG)
    home = Path(os.environ["HOME"])
    yield
    if sys.platform == "linux":  # the test's world may be a copy in the worker's kernel worlds
        kernels.assert_no_orphans(tag, [tmp_path, home, _kernel_worlds_base(tmp_path_factory)])


def _worker_ports() -> None:
    """Each xdist worker's kernels on ports of their own, below the ephemeral range
    (/proc/sys/net/ipv4/ip_local_port_range: 32768 by default), so no kernel of the suite loses
    its port to another process under load (testing.kernels.reserve_ports)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    kernels.reserve_ports(20000 + (index % 6) * 2000, 2000)


_worker_ports()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


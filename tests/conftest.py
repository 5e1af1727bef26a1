"""Test-wide guards: no test may touch the real home directory, caches or config."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing import reaper
from testing.homeguard import HomeGuard

# Read before any fixture rewrites the environment: this is what we must never touch.
REAL_HOME = Path(os.path.expanduser("~")).resolve()
HOME_GUARD = HomeGuard(REAL_HOME, dict(os.environ))
_GUARDED = ("HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
            "UV_CACHE_DIR")


@pytest.fixture(scope="session")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uv cache for the whole run, its xdist workers' too (uv locks its cache for use by
    concurrent processes): the real-uv tests download ipykernel and the build backend once."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "uv-cache"  # the run's, not a worker's
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("uv-cache")


@pytest.fixture(autouse=True)
def isolated_home(
    tmp_path_factory: pytest.TempPathFactory, uv_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Point HOME, the XDG dirs and uv's cache at temporary paths, and fail loudly if the test
    wrote the person's state in the real home or started a child that would (testing.homeguard:
    what others write there meanwhile, the person included, is not the test's doing)."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    for var, sub in (("XDG_DATA_HOME", ".local/share"), ("XDG_CACHE_HOME", ".cache"),
                     ("XDG_CONFIG_HOME", ".config"), ("XDG_STATE_HOME", ".local/state")):
        monkeypatch.setenv(var, str(home / sub))
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    # The fake uv cannot run a real build backend, so its tests take uv's own editable builds;
    # the batched builds are tested against the real uv (tests/integration, RealWorld turns
    # them back on) and directly (tests/integration/test_batched_builds.py).
    monkeypatch.setenv("KERNEL_BOOTSTRAP_BATCH_BUILDS", "0")
    for var in ("KERNEL_BOOTSTRAP_CONFIG", "KERNEL_BOOTSTRAP_VENV", "KERNEL_BOOTSTRAP_PYTHON",
                "KERNEL_BOOTSTRAP_UV", "KERNEL_BOOTSTRAP_SNAPSHOTS", "VIRTUAL_ENV",
                "KERNEL_BOOTSTRAP_OFFLINE", "UV_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    with HOME_GUARD.watching() as offences:
        yield home
    for var in _GUARDED:
        value = os.environ.get(var, "")
        if value and Path(value).resolve() == REAL_HOME:
            pytest.fail(f"{var} points at the real home directory {REAL_HOME}")
    offences += HOME_GUARD.environment_offences(os.environ, "the test's environment")
    if offences:
        pytest.fail("the test touched the person's state in the real home directory:\n  "
                    + "\n  ".join(dict.fromkeys(offences)))


@pytest.fixture(autouse=True)
def no_process_left(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every process the test started and left running is killed when it ends, passed or
    failed: a failed signal test used to leave ``ensure`` and its uv running for good."""
    tag = reaper.new_tag()
    monkeypatch.setenv(reaper.TAG, tag)
    yield
    reaper.kill_tagged(tag)


@pytest.fixture(autouse=True)
def library_logging() -> Iterator[None]:
    """Each test starts as a library user does: logging through `logging`, nothing on stderr.

    The log module is configured once per process (the CLI calls ``configure``); a test that
    ran the CLI in process would otherwise decide where the next test's warnings go, and which
    test ran before depends on how the suite is split over workers.
    """
    from bootstrap.primitives import log
    log.use_stdlib_logging()
    yield
    log.use_stdlib_logging()

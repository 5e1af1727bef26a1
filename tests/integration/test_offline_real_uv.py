"""Offline with the real uv, in a network namespace of its own (``unshare -n``: no route, no
DNS), as agent benchmark sandboxes often are."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.integration.conftest import RealWorld


@pytest.fixture(scope="module")
def unshare() -> list[str]:
    """The prefix that runs a command without a network; skips where it cannot."""
    exe = shutil.which("unshare")
    if exe is None:
        pytest.skip("unshare(1) is not installed")
    probe = subprocess.run([exe, "-n", "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"unshare -n is not permitted here: {probe.stderr.strip()}")
    return [exe, "-n", "--"]


def _offline_ensure(real: RealWorld, prefix: list[str],
                    *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *real.command("ensure", *args)], capture_output=True,
                          text=True, env=real.env, timeout=120, check=False)


def test_with_everything_cached_a_cold_ensure_succeeds_without_a_network(
        real: RealWorld, unshare: list[str]) -> None:
    real.write_config(requirements=["six"])
    real.skill("alpha")
    real.skill("beta")
    real.ensure()  # online: fills uv's cache (six, hatchling) and the build cache
    real.write_config(requirements=["six"], venv="venv2")  # a new venv: cold
    real.skill("gamma")  # never built: needs hatchling, from uv's cache
    result = _offline_ensure(real, unshare, "--json", "--log-format", "json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["action"] == "rebuild" and out["failed"] == []
    assert sorted(out["installed"]) == ["alpha", "beta", "gamma"]
    warnings = [json.loads(line) for line in result.stderr.splitlines()
                if '"level": "warning"' in line]
    assert [w["event"] for w in warnings if "unreachable" in w["event"]] != []
    assert len(warnings) == 1, warnings  # said once
    python = real.root / "venv2" / "bin" / "python"
    imported = subprocess.run([python, "-c", "import six, alpha, beta, gamma"],
                              capture_output=True, text=True, check=False)
    assert imported.returncode == 0, imported.stderr


def test_offline_with_an_uncached_requirement_fails_fast_naming_it(
        real: RealWorld, unshare: list[str]) -> None:
    real.write_config(requirements=["kb-surely-not-cached-anywhere"], offline=True)
    real.clear_log()
    result = _offline_ensure(real, unshare)
    assert result.returncode == 1 and result.stdout == ""
    assert "kb-surely-not-cached-anywhere" in result.stderr
    assert "not found in the cache" in result.stderr
    assert "Traceback" not in result.stderr
    # Fast because it never waits on the network (uv's own retries took 16-19 s): one install
    # attempt, told --offline, and no retry. How fast is a benchmark's (scripts/), not a test's.
    installs = real.installs()
    assert len(installs) == 1 and "--offline" in installs[0], installs

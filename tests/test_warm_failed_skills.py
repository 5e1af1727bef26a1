"""A start with failed skills is warm: an invalid SKILL.md, like a failure backing off, is held in
the fingerprint while its file is unchanged, and the warm path repeats the full path's answer
word for word (its warning, rendered by the same renderer; ``--json``'s ``failed``; exit 3
with ``--strict``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap import warm
from bootstrap.primitives import lock
from testing.clock import at
from testing.world import World

NO_FRONT_MATTER = "# broken\n\nNo front matter at all.\n"


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    (w.skill("broken") / "SKILL.md").write_text(NO_FRONT_MATTER)
    return w


def _fingerprint(world: World) -> Path:
    path = warm.fingerprint_path(str(world.config))
    assert path is not None
    return Path(path)


def _settle(world: World, env: dict[str, str] | None = None) -> None:
    """A first start (builds), then a full check that finds it settled; files settle too (a
    stamp taken within a clock tick of an edit is not trusted)."""
    world.ensure(env=env)
    time.sleep(0.05)
    _fingerprint(world).unlink(missing_ok=True)
    world.ensure(env=env)
    world.clear_log()


def _stamp(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def test_an_invalid_skill_md_leaves_the_next_start_warm(world: World) -> None:
    _settle(world)
    fingerprint = _stamp(_fingerprint(world))
    holder = lock.holder_path(world.venv)
    # Another process holds the bootstrap lock: a start that needed it would wait, then fail.
    with lock.hold(lock.lock_path(world.venv), 5):
        before = holder.read_bytes()
        result = world.ensure("--lock-timeout", "0", ok=False)
        assert result.returncode == 0, result.stderr
        assert holder.read_bytes() == before
    assert result.stdout == f"{world.python}\n"
    assert "skill is invalid" in result.stderr and "skill=broken" in result.stderr
    assert world.uv_calls() == []
    assert _stamp(_fingerprint(world)) == fingerprint, "the warm path writes nothing"
    assert world.ensure("--strict", ok=False).returncode == 3
    out = json.loads(world.ensure("--json").stdout)
    assert out["action"] == "ready"
    assert [f["name"] for f in out["failed"]] == ["broken"]
    assert "front matter" in out["failed"][0]["error"]


def test_a_fixed_skill_md_is_seen_at_the_next_start(world: World) -> None:
    _settle(world)
    world.skill("broken")  # a valid SKILL.md again
    out = json.loads(world.ensure("--json").stdout)
    assert out["failed"] == [] and out["action"] in ("ready", "skills")
    assert world.imports("broken")


def _full_and_warm(world: World, *args: str,
                   env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                             subprocess.CompletedProcess[str]]:
    """The same command answered by the full path (no fingerprint) and then by the warm one."""
    _fingerprint(world).unlink(missing_ok=True)
    full = world.run("ensure", *args, env=env)
    warm_run = _warm(world, *args, env=env)
    return full, warm_run


def _warm(world: World, *args: str,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``ensure`` asserting that the warm path answered: it imports none of the full path's
    modules (python -X importtime)."""
    cmd = [sys.executable, "-X", "importtime", "-m", "bootstrap", "ensure", *args,
           "--config", str(world.config)]
    result = subprocess.run(cmd, capture_output=True, text=True,
                            env={**world.env, **(env or {})}, check=False)
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "bootstrap.warm" in imported and "bootstrap.config" not in imported
    assert "json" not in imported or "--json" in args, "the warnings cost no json import"
    text = "".join(line + "\n" for line in result.stderr.splitlines()
                   if not line.startswith("import time:"))
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, text)


def _without_timestamps(stderr: str) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in stderr.splitlines()]
    for line in lines:
        assert isinstance(line.pop("timestamp"), str)
    return lines


@pytest.mark.parametrize("args", [(), ("--strict",), ("--json",), ("-q",)])
def test_the_warm_answer_for_an_invalid_skill_is_the_full_paths(world: World,
                                                                 args: tuple[str, ...]) -> None:
    _settle(world)
    full, warm_run = _full_and_warm(world, *args, "--log-format", "console")
    assert (warm_run.returncode, warm_run.stdout, warm_run.stderr) == (
        full.returncode, full.stdout, full.stderr)
    assert "skill is invalid" in full.stderr and "hint=" not in full.stderr.split("\n")[0][:10]
    full, warm_run = _full_and_warm(world, *args, "--log-format", "json")
    assert (warm_run.returncode, warm_run.stdout) == (full.returncode, full.stdout)
    assert _without_timestamps(warm_run.stderr) == _without_timestamps(full.stderr)


def test_the_warm_warning_for_a_failure_backing_off_is_the_full_paths(world: World) -> None:
    (world.skill("broken") / "SKILL.md").write_text(  # valid again: this one fails in uv
        "---\nname: broken\ndescription: fails\n---\n")
    for _ in range(2):
        world.ensure(env=at(0, FAKE_UV_FAIL="broken"))
    time.sleep(0.05)
    world.clear_log()
    for fmt in ("console", "json"):
        full, warm_run = _full_and_warm(world, "--log-format", fmt, env=at(1))
        assert world.uv_calls() == []
        assert (warm_run.returncode, warm_run.stdout) == (full.returncode, full.stdout)
        if fmt == "console":
            assert warm_run.stderr == full.stderr
            assert "fake build failure" in warm_run.stderr and "--retry" in warm_run.stderr
        else:
            assert _without_timestamps(warm_run.stderr) == _without_timestamps(full.stderr)


def test_a_fingerprint_line_not_as_written_is_no_fingerprint(world: World) -> None:
    """Forged counts and errors (digits int() refuses, an escape that does not decode) make
    the full path answer: no traceback."""
    _settle(world)
    path = _fingerprint(world)
    text = path.read_text()
    assert "\ninvalid\tbroken\t" in text
    for forged in ("failed\tbroken\t\u00b2\t2026-01-01T00:00:00Z\tx\n",
                   "failed\tbroken\t" + "9" * 5000 + "\t2026-01-01T00:00:00Z\tx\n",
                   "invalid\tbroken\t\\x\n", "invalid\tbroken\t\u00e9\n", "refused\t\\N{x}\n"):
        path.write_text(text + forged)
        os.chmod(path, 0o600)
        result = world.ensure("--json", ok=False)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert [f["name"] for f in json.loads(result.stdout)["failed"]] == ["broken"]


def test_run_with_an_invalid_skill_answers_warm_as_the_full_path(world: World) -> None:
    _settle(world)
    _fingerprint(world).unlink()
    base = [sys.executable, "-m", "bootstrap", "--config", str(world.config), "run"]
    strict = [*base, "--strict", "--", "-c", "print('kernel up')"]
    full = subprocess.run(strict, capture_output=True, text=True, env=world.env, check=False)
    warm_run = subprocess.run([sys.executable, "-X", "importtime", *strict[1:]],
                              capture_output=True, text=True, env=world.env, check=False)
    stderr = "".join(line + "\n" for line in warm_run.stderr.splitlines()
                     if not line.startswith("import time:"))
    assert "bootstrap.config" not in warm_run.stderr, "answered warm"
    assert (warm_run.returncode, warm_run.stdout, stderr) == (3, "", full.stderr)
    assert "skill(s) failed: broken" in stderr
    started = subprocess.run([*base, "--", "-c", "print('kernel up')"], capture_output=True,
                             text=True, env=world.env, check=False)
    assert (started.returncode, started.stdout) == (0, "kernel up\n")
    assert "skill is invalid" in started.stderr
    assert world.uv_calls() == []

"""The ready gate (engine/status.py) called directly: what it concludes from what lies on disk,
without the lock, uv or a child process. Each case changes one thing another process could."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bootstrap.config import load_config
from bootstrap.engine.status import Status, status
from bootstrap.skills.backoff import iso
from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("notes", python=False)
    w.write_config(requirements=["requests>=2"])
    return w


def _status(world: World) -> Status:
    return status(load_config(world.config))


def _ready(world: World) -> World:
    result = world.ensure()
    assert result.returncode == 0, result.stderr
    return world


def test_a_venv_never_built_is_missing_and_not_ready(world: World) -> None:
    found = _status(world)
    assert (found.ready, found.marker.state, found.runtime) == (False, "missing", "missing")
    assert found.why == [f"no marker in {world.venv}"]
    assert {s.name: s.state for s in found.skills} == {"alpha": "pending", "notes": "installed"}


def test_a_built_venv_is_ready_and_nothing_is_written_by_asking(world: World) -> None:
    _ready(world)
    before = sorted((p, p.stat().st_mtime_ns) for p in world.root.rglob("*") if p.is_file())
    found = _status(world)
    assert found.ready and found.runtime == "current" and found.python == world.python
    assert [(s.name, s.python, s.state) for s in found.skills] == [
        ("alpha", True, "installed"), ("notes", False, "installed")]
    assert sorted((p, p.stat().st_mtime_ns) for p in world.root.rglob("*")
                  if p.is_file()) == before
    calls = len(world.uv_calls())
    _status(world)
    assert len(world.uv_calls()) == calls


def test_an_edited_pyproject_makes_its_skill_stale_and_the_base_stays_current(
        world: World) -> None:
    _ready(world)
    pyproject = world.skills_dir / "alpha" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# edited\n")
    found = _status(world)
    assert not found.ready and found.base_current
    assert found.pending == ["alpha"]


def test_a_changed_requirement_makes_the_runtime_stale_and_says_what_changed(
        world: World) -> None:
    _ready(world)
    world.write_config(requirements=["requests>=2", "six"])
    found = _status(world)
    assert found.runtime == "stale" and not found.base_current
    assert any("six" in line for line in found.why), found.why


def test_a_torn_marker_is_corrupt_and_named(world: World) -> None:
    _ready(world)
    (world.venv / ".bootstrap-version").write_bytes(b'{"schema": 1, "runti')
    found = _status(world)
    assert found.marker.state == "corrupt" and found.runtime == "missing"
    assert str(world.venv / ".bootstrap-version") in found.why[0]


def test_a_missing_interpreter_means_the_runtime_is_missing(world: World) -> None:
    _ready(world)
    world.python.unlink()
    found = _status(world)
    assert found.runtime == "missing"
    assert found.why == [f"interpreter {world.python} does not exist"]


def test_a_skill_no_longer_configured_is_stray(world: World) -> None:
    _ready(world)
    world.write_config(requirements=["requests>=2"], skills=["skills/notes"])
    found = _status(world)
    assert found.stray == ("alpha",) and not found.ready


# -- what `kernel-bootstrap status` prints (issue 31: hints a person can follow as written) ----

T0 = 2_000_000_000.0  # "now" for these tests, moved with $KERNEL_BOOTSTRAP_TEST_NOW


def _at(seconds: float, **env: str) -> dict[str, str]:
    return {"KERNEL_BOOTSTRAP_TEST_NOW": repr(T0 + seconds), **env}


def _text(world: World, seconds: float = 1) -> tuple[int, str, str]:
    result = world.run("status", env=_at(seconds))
    return result.returncode, result.stdout, result.stderr


def _generation(world: World) -> str:
    return str(world.venv.parent / os.readlink(world.venv))


def _two_skills_one_failing(tmp_path: Path) -> World:
    world = World(tmp_path)
    world.skill("alpha")
    world.skill("beta")
    for _ in range(2):  # the second failure backs off for a minute
        world.ensure(env=_at(0, FAKE_UV_FAIL="beta"))
    return world


def test_status_during_a_skill_back_off_says_to_retry(tmp_path: Path) -> None:
    # It said `kernel-bootstrap ensure`, which does not retry a skill backing off. Ready, as
    # `ensure` says (exit 0), and exit 3 for the failed skill, as `ensure --strict`.
    world = _two_skills_one_failing(tmp_path)
    assert _text(world) == (3, "\n".join([
        f"venv:    {world.venv}",
        f"python:  {world.python}",
        "marker:  ok",
        "runtime: current",
        "busy:    no",
        "skills:",
        "  alpha  installed  python",
        "  beta   failed     python  cause: fake build failure for beta (FAKE_UV_FAIL) "
        f"(2 times; next try after {iso(T0 + 60)})",
        f"generation: {_generation(world)}",
        "kernel server: none",
        "ready:   yes, without the failed skill(s) beta (exit 3); after fixing them, run "
        "`kernel-bootstrap ensure --retry` or `kernel-bootstrap repair`", ""]), "")


def test_status_of_a_failed_rebuild_backing_off_has_no_stray_backtick(tmp_path: Path) -> None:
    world = _two_skills_one_failing(tmp_path)
    world.write_config(requirements=["requests"])
    for _ in range(2):
        assert world.run("ensure", env=_at(0, FAKE_UV_FAIL="requests")).returncode == 1
    code, stdout, _ = _text(world)
    assert code == 1
    assert stdout.splitlines()[-1] == ("ready:   no; run `kernel-bootstrap ensure --retry` after "
                                       "fixing what made the rebuild fail")


def test_status_lists_a_skill_no_longer_configured_under_its_heading(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.skill("greeter")
    world.ensure()
    world.write_config(skills=[])
    assert _text(world) == (1, f"""\
venv:    {world.venv}
python:  {world.python}
marker:  ok
runtime: current
busy:    no
skills:
  greeter  recorded but no longer configured (ensure uninstalls it)
generation: {_generation(world)}
kernel server: none
ready:   no; run `kernel-bootstrap ensure`
""", "")


# -- "ready" is one answer: `ensure` and `status` agree (issue 38) ---------------------------------

def test_ensure_and_status_agree_on_ready_with_a_failed_skill(world: World) -> None:
    world.skill("beta")
    ensured = world.ensure("--json", env={"FAKE_UV_FAIL": "beta"})
    failed = json.loads(ensured.stdout)["failed"]
    assert ensured.returncode == 0 and [f["name"] for f in failed] == ["beta"]
    # `status` said "ready: no" (exit 1) where `ensure` said ready (exit 0): ready, exit 3 for
    # the failed skill, as `ensure --strict`.
    assert world.run("ensure", "--strict", env={"FAKE_UV_FAIL": "beta"}).returncode == 3
    text = world.run("status")
    assert text.returncode == 3
    assert text.stdout.splitlines()[-1].startswith("ready:   yes, without the failed skill(s) beta")
    as_json = world.run("status", "--json")
    assert as_json.returncode == 3 and json.loads(as_json.stdout)["ready"] is True
    world.skill("gamma")  # pending: `ensure` has work to do, so not ready
    assert world.run("status").returncode == 1
    assert json.loads(world.run("status", "--json").stdout)["ready"] is False


def test_status_names_the_package_uv_could_not_find(world: World) -> None:
    world.skill("broken", deps=["kb-no-such-package"])
    env = {"FAKE_UV_OFFINDEX": "kb-no-such-package"}
    world.ensure(env=env)
    line = next(x for x in world.run("status").stdout.splitlines() if "broken" in x)
    # uv's last line ("And because only broken==0.1.0 is available ...") named only the skill.
    assert "kb-no-such-package was not found in the package registry" in line
    assert "And because" not in line
    verbose = world.run("status", "-v").stdout.splitlines()
    below = verbose[verbose.index(line) + 1:]
    assert below[0].strip() == "error: No solution found when resolving dependencies"
    assert any("And because only broken==0.1.0 is available" in x for x in below[:4])


def test_a_skill_whose_skill_md_became_invalid_is_uninstalled_by_the_next_ensure(
        world: World) -> None:
    world.skill("beta", deps=["alpha"])  # beta needs alpha: alpha's distribution stays
    world.skill("gamma")
    _ready(world)
    for name in ("alpha", "gamma"):
        (world.skills_dir / name / "SKILL.md").write_text("# no front matter\n")
    world.clear_log()
    status_before = world.status()
    assert status_before["ready"] is False, "still installed: `ensure` has work to do"
    out = json.loads(world.ensure("--json").stdout)
    assert sorted(f["name"] for f in out["failed"]) == ["alpha", "gamma"]
    uninstalls = [c for c in world.uv_calls() if c[:2] == ["pip", "uninstall"]]
    assert len(uninstalls) == 1 and "gamma" in uninstalls[0] and "alpha" not in uninstalls[0]
    assert not world.imports("gamma") and world.imports("beta")
    assert {"alpha", "gamma"}.isdisjoint(world.marker()["skills"])
    world.clear_log()
    assert world.run("status").returncode == 3  # ready, with two failed skills
    world.ensure()
    assert world.uv_calls() == [], "settled: nothing left to do"


def test_status_calls_the_held_lock_busy_beside_the_lock_file(world: World) -> None:
    # `lock:` (the venv's lock, held by a process) sat beside `lock file:` (the pins).
    from bootstrap.primitives import lock

    _ready(world)
    world.write_config(requirements=["requests>=2"], lock="pylock.toml")
    with lock.hold(lock.lock_path(world.venv), 5):
        lines = world.run("status").stdout.splitlines()
    assert f"busy:    yes, pid {os.getpid()} holds the venv's lock (ensure, repair or gc)" in lines
    assert [x for x in lines if x.startswith("lock")] == [
        f"lock file: missing ({world.root / 'pylock.toml'})"]

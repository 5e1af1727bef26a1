"""Skill sync: how big a group goes to uv after an earlier session died; renamed projects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bootstrap.config import Skill
from bootstrap.env import marker as m
from bootstrap.skills.python_skill import PythonSkill
from bootstrap.skills.sync import _group_size
from testing.processes import kill_group, start, wait_for
from testing.world import World

RUNTIME: m.RuntimeRecord = {"identity": "sha256:abc", "inputs": {}, "python": "/v/bin/python"}


def skills(*names: str) -> list[PythonSkill]:
    return [PythonSkill(Skill(n, Path("/s") / n), "sha256:1", n, frozenset()) for n in names]


def marker_with(attempt: Any = None) -> m.MarkerData:
    data = m.base_marker(RUNTIME)
    if attempt is not None:
        data["attempt"] = attempt
    return data


def attempt(names: list[str], first: bool = True) -> dict[str, Any]:
    return {"skills": names, "first": first, "pid": 123, "started": 1.0}


EIGHT = [f"s{i}" for i in range(8)]


def test_without_an_attempt_everything_goes_in_one_call() -> None:
    assert _group_size(None, skills(*EIGHT)) == 8
    assert _group_size(marker_with(), skills(*EIGHT)) == 8


@pytest.mark.parametrize(("tried", "size"), [(8, 4), (4, 2), (3, 2), (2, 1), (1, 1)])
def test_a_session_that_died_inside_its_first_call_halves_the_group(tried: int,
                                                                    size: int) -> None:
    assert _group_size(marker_with(attempt(EIGHT[:tried])), skills(*EIGHT)) == size


def test_a_session_that_died_inside_a_later_call_keeps_the_size() -> None:
    # It had spent part of its time on earlier calls: the size was not the problem.
    assert _group_size(marker_with(attempt(EIGHT[:4], first=False)), skills(*EIGHT)) == 4


def test_a_session_that_died_after_its_group_landed_keeps_the_size() -> None:
    # None of the attempted skills is still pending: it died between calls.
    assert _group_size(marker_with(attempt(["gone1", "gone2", "gone3", "gone4"])),
                       skills(*EIGHT)) == 4


@pytest.mark.parametrize("junk", [
    "text", [], {"skills": "s0"}, {"skills": []}, {"skills": [1, 2]}, {"first": True},
])
def test_a_malformed_attempt_counts_as_none(junk: Any) -> None:
    assert _group_size(marker_with(junk), skills(*EIGHT)) == 8


def test_note_and_clear_attempt_round_trip_through_the_marker(tmp_path: Path) -> None:
    m.write_marker(tmp_path, m.base_marker(RUNTIME))
    m.note_attempt(tmp_path, RUNTIME["identity"], ["a", "b"], first=False)
    found = m.attempt_of(m.read_marker(tmp_path).data)
    assert found is not None and found["skills"] == ["a", "b"] and found["first"] is False
    m.clear_attempt(tmp_path, RUNTIME["identity"])
    data = m.read_marker(tmp_path).data
    assert data is not None and "attempt" not in data


def test_an_attempt_is_never_noted_on_a_marker_of_another_runtime(tmp_path: Path) -> None:
    m.write_marker(tmp_path, m.base_marker(RUNTIME))
    m.note_attempt(tmp_path, "sha256:other", ["a"], first=True)
    assert m.attempt_of(m.read_marker(tmp_path).data) is None


# -- a renamed distribution ---------------------------------------------------------------------


def _distributions(world: World) -> list[str]:
    site = next(world.venv.glob("lib/python*/site-packages"))
    return sorted(p.name.split("-")[0] for p in site.glob("*.dist-info"))


def test_a_renamed_project_uninstalls_the_old_distribution_in_the_same_sync(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    world.skill("alpha")
    world.skill("beta")
    world.ensure()
    assert _distributions(world) == ["alpha", "beta"]
    world.clear_log()
    world.skill("alpha", project="alpha-tools")
    out = json.loads(world.ensure("--json").stdout)
    assert out["installed"] == ["alpha"] and out["failed"] == []
    assert _distributions(world) == ["alpha_tools", "beta"]
    calls = world.uv_calls()
    assert [c[:2] for c in calls] == [["pip", "uninstall"], ["pip", "install"]]
    assert calls[0][-1] == "alpha"
    assert world.marker()["skills"]["alpha"]["project"] == "alpha-tools"
    assert world.imports("alpha") and world.status()["ready"] is True


def test_two_skills_that_swap_names_keep_both_distributions(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.skill("alpha", project="one")
    world.skill("beta", project="two")
    world.ensure()
    world.clear_log()
    world.skill("alpha", project="two")
    world.skill("beta", project="one")
    world.ensure()
    assert _distributions(world) == ["one", "two"]
    assert [c[:2] for c in world.uv_calls()] == [["pip", "install"]]


def test_a_rename_killed_before_the_new_install_lands_is_finished_next_time(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    world.skill("alpha")
    world.ensure()
    world.skill("alpha", project="alpha-tools")
    proc = start(world, env={"FAKE_UV_HANG": "alpha-tools"})
    try:
        wait_for(lambda: ["pip", "install"] in [c[:2] for c in world.installs()])
    finally:
        kill_group(proc)
    assert world.marker()["skills"]["alpha"]["project"] == "alpha"
    out = json.loads(world.ensure("--json").stdout)
    assert out["installed"] == ["alpha"]
    assert _distributions(world) == ["alpha_tools"]

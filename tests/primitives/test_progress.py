"""What a person at a terminal sees from `ensure`: each step once, then what the run changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from testing.processes import run_with_tty_stderr
from testing.world import World


def screen(stderr: str) -> list[str]:
    """What a terminal shows: each line's text after its last carriage return."""
    shown = (line.rpartition("\r")[2].replace("\033[K", "") for line in stderr.split("\n"))
    return [line for line in shown if line]


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("beta", version="0.2.0")
    w.write_config(requirements=["requests>=2"])
    return w


def tty_ensure(world: World, **env: str) -> list[str]:
    code, stdout, stderr = run_with_tty_stderr(world.command("ensure"),
                                               {**world.env, "NO_COLOR": "1", **env})
    assert code == 0 and stdout == f"{world.python}\n", stderr
    return screen(stderr)


def test_a_cold_ensure_shows_each_step_once_then_what_it_installed(world: World) -> None:
    lines = tty_ensure(world)
    steps = [line.rsplit(" (", 1)[0] for line in lines if line.startswith("[")]
    assert [step[:20] for step in steps] == ["[1/4] creating the v", "[2/4] installing the",
                                             "[3/4] checking the n", "[4/4] installing 2 s"]
    assert not any(line.startswith(("installing skills", "installing the runtime"))
                   for line in lines), "a step is not told twice (progress and log)"
    summary = [line for line in lines if line.startswith(("+ ", "- "))]
    assert "+ alpha==0.1.0" in summary and "+ beta==0.2.0" in summary
    assert any(line.startswith("+ requests==") for line in summary)
    assert lines.index("+ alpha==0.1.0") > max(i for i, line in enumerate(lines)
                                               if line.startswith("ready"))


def test_the_summary_shows_removed_and_upgraded_skills(world: World) -> None:
    world.ensure()
    world.skill("beta", version="0.3.0")
    (world.skills_dir / "alpha" / "SKILL.md").unlink()
    lines = tty_ensure(world)
    summary = [line for line in lines if line.startswith(("+ ", "- "))]
    assert summary == ["- alpha==0.1.0", "- beta==0.2.0", "+ beta==0.3.0"]


def test_a_warm_ensure_and_a_pipe_show_no_progress_and_no_summary(world: World) -> None:
    piped = world.ensure()
    assert "+ alpha" not in piped.stderr and "[1/" not in piped.stderr
    assert tty_ensure(world) == []


def test_quiet_on_a_terminal_shows_no_progress_or_summary(world: World) -> None:
    code, _, stderr = run_with_tty_stderr(world.command("ensure", "-q"), world.env)
    assert code == 0 and stderr == ""


def test_a_failed_skill_shows_its_own_error_once_from_uvs_error_line(world: World) -> None:
    world.ensure()
    world.skill("alpha", version="0.5.0")
    world.skill("beta", version="0.6.0")
    lines = tty_ensure(world, FAKE_UV_FAIL="alpha")
    text = "\n".join(lines)
    assert text.count("fake build failure for alpha") == 1, text
    assert text.count("error: Failed to build `alpha") == 1, text
    assert "+ beta==0.6.0" in lines


def test_error_is_coloured_like_a_warning_on_a_terminal(tmp_path: Path) -> None:
    world = World(tmp_path)
    env = {k: v for k, v in world.env.items() if k != "NO_COLOR"}
    code, _, stderr = run_with_tty_stderr(
        [*world.command("status"), "--config", str(tmp_path / "nope.toml")],
        {**env, "TERM": "xterm"})
    assert code == 2
    assert stderr.startswith("\033[31;1merror:\033[0m config file ")
    code, _, stderr = run_with_tty_stderr(
        [*world.command("status"), "--config", str(tmp_path / "nope.toml")],
        {**env, "TERM": "xterm", "NO_COLOR": "1"})
    assert stderr.startswith("error: config file ")

"""Logs and progress: readable lines by default (colour and progress for a person at a terminal),
JSON lines when asked for, silence when warm."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.primitives import log
from testing.processes import run_with_tty_stderr
from testing.world import World

ANSI = "\033["


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("beta")
    w.write_config(requirements=["requests>=2"])
    return w


def json_lines(stderr: str) -> list[dict[str, object]]:
    lines = stderr.splitlines()
    assert lines, "expected log lines"
    return [json.loads(line) for line in lines]


# Asks for JSON lines the way a CI job or a launcher does, for every command at once.
JSON_ENV = {"KERNEL_BOOTSTRAP_LOG_FORMAT": "json"}


def test_a_cold_ensure_on_a_pipe_logs_readable_lines_without_colour(world: World) -> None:
    # JSON lines on every pipe put them beside uv's, pip's and pre-commit's text in CI logs
    # and `2> file` (issue 31): a pipe gets the console lines, without colour or progress.
    env = {k: v for k, v in world.env.items() if k not in ("NO_COLOR", "TERM")}
    result = subprocess.run(world.command("ensure"), capture_output=True, text=True,
                            env={**env, "TERM": "xterm"}, check=True)
    lines = result.stderr.splitlines()
    assert lines[0].startswith("building the runtime")
    assert "installing the runtime requirements=requests>=2" in lines
    assert 'installing skills count=2 skills="alpha, beta"' in lines
    assert ANSI not in result.stderr and "\r" not in result.stderr
    for line in result.stderr.splitlines():
        with pytest.raises(ValueError):
            json.loads(line)


def test_the_environment_asks_for_one_json_object_per_line(world: World) -> None:
    events = json_lines(world.ensure(env=JSON_ENV).stderr)
    assert all({"event", "level", "timestamp"} <= set(e) for e in events)
    names = [e["event"] for e in events]
    assert "building the runtime" in names and "installing skills" in names
    installing = next(e for e in events if e["event"] == "installing skills")
    assert installing["skills"] == ["alpha", "beta"] and installing["level"] == "info"


def test_log_format_console_gives_readable_lines_even_on_a_pipe(world: World) -> None:
    stderr = world.ensure("--log-format", "console").stderr
    assert "building the runtime" in stderr and "installing skills" in stderr
    for line in stderr.splitlines():
        with pytest.raises(ValueError):
            json.loads(line)
    assert ANSI not in stderr, "no colour on a pipe"


def test_log_format_json_wins_on_a_terminal(world: World) -> None:
    code, _, stderr = run_with_tty_stderr(world.command("ensure", "--log-format", "json"),
                                          world.env)
    assert code == 0
    assert json_lines(stderr)[0]["event"] == "building the runtime"


def test_quiet_silences_info_and_verbose_adds_debug(world: World) -> None:
    assert world.ensure("-q").stderr == ""
    world.skill("gamma")
    events = json_lines(world.ensure("-v", env=JSON_ENV).stderr)
    assert any(e["level"] == "debug" and e["event"] == "uv" for e in events)


def test_quiet_still_shows_a_failed_skill(world: World) -> None:
    world.skill("gamma")
    world.ensure()
    world.skill("gamma", version="0.2.0")
    result = world.ensure("-q", env={"FAKE_UV_FAIL": "gamma", **JSON_ENV})
    events = json_lines(result.stderr)
    assert {e["level"] for e in events} == {"warning"}
    assert any(e.get("skill") == "gamma" for e in events)


def test_a_terminal_gets_colour_unless_no_color(world: World) -> None:
    env = {k: v for k, v in world.env.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm"
    code, stdout, stderr = run_with_tty_stderr(world.command("ensure"), env)
    assert code == 0 and stdout == f"{world.python}\n"
    assert "building the runtime" in stderr and ANSI in stderr

    world.skill("gamma")
    code, _, stderr = run_with_tty_stderr(world.command("ensure"), {**env, "NO_COLOR": "1"})
    assert code == 0 and "[1/1] installing 1 skill" in screen(stderr)[0]
    assert ANSI not in stderr.replace("\r\033[K", ""), "only the line clearing, no colour"
    for line in stderr.splitlines():
        assert not line.startswith("{"), "a terminal gets console lines, not JSON"


def test_a_warm_ensure_prints_nothing_on_stderr_on_a_pipe_or_a_terminal(world: World) -> None:
    world.ensure()
    assert world.ensure().stderr == ""
    assert world.ensure("--json").stderr == ""
    code, stdout, stderr = run_with_tty_stderr(world.command("ensure"), world.env)
    assert (code, stdout, stderr) == (0, f"{world.python}\n", "")


def test_console_lines_put_a_multi_line_value_under_the_event() -> None:
    line = log.render_console({"event": "skill failed to install", "level": "warning",
                               "skill": "alpha", "error": "Failed to build `alpha`\n  boom",
                               "hint": "run `kernel-bootstrap repair`"})
    assert line == textwrap.dedent("""\
        warning: skill failed to install skill=alpha hint="run `kernel-bootstrap repair`"
          error:
            Failed to build `alpha`
              boom""")


def test_console_lines_leave_out_empty_lists_and_keep_a_long_value_beside_its_key() -> None:
    # Not a terminal: `in_use=""` (nothing), and `venv:` alone on a line with its path below.
    path = "/tmp/" + "x" * 70
    line = log.render_console({"event": "old generations", "level": "info", "venv": path,
                               "removed": [f"{path}.gen-1"], "in_use": []})
    assert line == f"old generations\n  venv: {path}\n  removed: {path}.gen-1"


def test_a_rebuild_logs_the_generations_it_removed_without_empty_fields(world: World) -> None:
    world.ensure()
    world.write_config(requirements=["requests>=2", "six"])
    lines = world.ensure().stderr.splitlines()  # a pipe: no terminal
    event = next(i for i, x in enumerate(lines) if x.startswith("old generations"))
    assert 'in_use=""' not in lines[event] and 'removed=""' not in lines[event]
    assert f"venv={world.venv}" in lines[event] or f"  venv: {world.venv}" in lines[event:]
    assert [x for x in lines if x.strip() in ("venv:", "removed:")] == []


def test_console_lines_quote_values_with_spaces_and_join_lists() -> None:
    line = log.render_console({"event": "installing skills", "level": "info", "count": 2,
                               "skills": ["a", "b"], "name": "Python (x)"})
    assert line == 'installing skills count=2 skills="a, b" name="Python (x)"'


def test_colour_marks_the_level_and_dims_the_fields() -> None:
    line = log.render_console({"event": "e", "level": "warning", "k": "v"}, colour=True)
    assert line.startswith("\033[33;1mwarning: e\033[0m") and "\033[2mk=v\033[0m" in line


def test_is_json_only_when_asked_for_by_the_flag_or_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(sys, "stderr", io.StringIO())  # not a terminal
        patch.delenv("KERNEL_BOOTSTRAP_LOG_FORMAT", raising=False)
        log.configure(0, None)
        assert not log.is_json()
        log.configure(0, "json")
        assert log.is_json()
        patch.setenv("KERNEL_BOOTSTRAP_LOG_FORMAT", "json")
        log.configure(0, None)
        assert log.is_json()
        log.configure(0, "console")  # the flag wins over the environment
        assert not log.is_json()
    log.configure()


def test_the_flag_wins_over_the_environment_on_a_pipe(world: World) -> None:
    stderr = world.ensure("--log-format", "console", env=JSON_ENV).stderr
    assert "building the runtime" in stderr and not stderr.startswith("{")


@pytest.mark.parametrize("warm", [False, True])
def test_an_unknown_log_format_in_the_environment_is_a_usage_error(world: World,
                                                                   warm: bool) -> None:
    if warm:
        world.ensure()  # the warm path must refuse it too, not answer "ready"
    result = world.run("ensure", env={"KERNEL_BOOTSTRAP_LOG_FORMAT": "yaml"})
    assert (result.returncode, result.stdout, result.stderr) == (
        2, "", "error: KERNEL_BOOTSTRAP_LOG_FORMAT='yaml': must be console or json\n")


PROGRESS_SCRIPT = """
import sys, time
from bootstrap.primitives import log, progress
log.configure(int(sys.argv[1]), None if sys.argv[2] == "-" else sys.argv[2])
progress.note("waiting for pid 123")
progress.start(3)
progress.step("creating the venv")
progress.step("installing the runtime")
progress.step("installing 8 skills")
progress.note("isolating a failed group")
progress.step("installing beta alone")
progress.finish("ready")
"""


def run_progress(verbosity: int = 0, fmt: str = "-", tty: bool = True,
                 env: dict[str, str] | None = None) -> str:
    import os
    import subprocess

    cmd = [sys.executable, "-c", PROGRESS_SCRIPT, str(verbosity), fmt]
    full_env = {**os.environ, **(env or {})}
    if tty:
        code, _, stderr = run_with_tty_stderr(cmd, full_env)
        assert code == 0, stderr
        return stderr
    result = subprocess.run(cmd, capture_output=True, text=True, env=full_env, check=True)
    return result.stderr


def screen(stderr: str) -> list[str]:
    """What a terminal shows: each line's text after its last carriage return."""
    return [line.rpartition("\r")[2].replace("\033[K", "") for line in stderr.split("\n")
            if line.rpartition("\r")[2].replace("\033[K", "")]


def test_progress_on_a_terminal_shows_one_finished_line_per_step_with_its_time() -> None:
    lines = screen(run_progress(env={"NO_COLOR": "1"}))
    assert [line.rsplit(" (", 1)[0] for line in lines] == [
        "waiting for pid 123",
        "[1/3] creating the venv",
        "[2/3] installing the runtime",
        "      isolating a failed group",  # said while step 3 runs, above its live line
        "[3/3] installing 8 skills",
        "[4/4] installing beta alone",
        "ready",
    ]
    assert all(line.endswith("s)") for line in lines)


def test_progress_is_coloured_on_a_terminal_unless_no_color() -> None:
    coloured = run_progress(env={"TERM": "xterm"})
    assert ANSI in coloured.replace("\r\033[K", "")
    assert ANSI not in run_progress(env={"NO_COLOR": "1"}).replace("\r\033[K", "")
    # The closing line starts at the margin, colour or not.
    assert all(not line.startswith(" ") or "isolating" in line
               for line in screen(coloured) + screen(run_progress(env={"NO_COLOR": "1"})))


SLOW_STEP = """
import sys, time
from bootstrap.primitives import log, progress
log.configure(0, None)
progress.start(1)
progress.step("slow step")
time.sleep(1.2)
progress.finish("ready")
"""


def test_a_long_step_has_a_live_line_with_a_spinner_and_the_time_so_far() -> None:
    import os

    code, _, stderr = run_with_tty_stderr([sys.executable, "-c", SLOW_STEP],
                                          {**os.environ, "NO_COLOR": "1"})
    assert code == 0, stderr
    redraws = [part.replace("\033[K", "") for part in stderr.split("\r") if "slow step" in part]
    live = [r for r in redraws if not r.startswith("[1/1]")]
    assert len(live) >= 4, redraws  # a few times a second for over a second
    assert len({r.split(" ", 1)[0] for r in live}) >= 3, "the spinner turns"
    assert len({r.rsplit(" (", 1)[1] for r in live}) >= 3, "the clock moves"
    assert screen(stderr)[0].startswith("[1/1] slow step (1.")


@pytest.mark.parametrize(("verbosity", "fmt", "tty"), [
    (0, "-", False),  # piped: a launcher's log does not want progress
    (-1, "-", True),  # -q
    (0, "json", True),  # JSON logs asked for: machine readers on a terminal too
])
def test_progress_says_nothing_when_piped_quiet_or_json(verbosity: int, fmt: str,
                                                        tty: bool) -> None:
    assert run_progress(verbosity, fmt, tty) == ""


def test_progress_never_raises_on_a_closed_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    from bootstrap.primitives import progress
    class ClosedTerminal(io.StringIO):
        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> int:
            raise OSError(5, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(sys, "stderr", ClosedTerminal())
        log.configure(0, None)
        assert progress.enabled()
        progress.start(1)
        progress.step("creating the venv")
        progress.finish()
    log.configure()


# -- as a library: the standard logging module, nothing on stderr by itself ------------------------


@pytest.fixture
def library(world: World, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.setenv("KERNEL_BOOTSTRAP_UV", world.env["KERNEL_BOOTSTRAP_UV"])
    monkeypatch.setenv("FAKE_UV_LOG", world.env["FAKE_UV_LOG"])
    log.use_stdlib_logging()
    yield world
    log.use_stdlib_logging()


def test_in_process_ensure_logs_through_the_kernel_bootstrap_logger(
        library: World, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from bootstrap import ensure, load_config

    with caplog.at_level(logging.INFO, logger="kernel_bootstrap"):
        result = ensure(load_config(library.config))
    assert result.python == library.python
    records = [r for r in caplog.records if r.name == "kernel_bootstrap"]
    messages = [r.getMessage() for r in records]
    assert any(m.startswith("building the runtime") for m in messages), messages
    assert any(m.startswith("installing skills") and "alpha, beta" in m for m in messages)
    assert {r.levelno for r in records} == {logging.INFO}


def test_in_process_ensure_writes_nothing_to_stderr_without_a_handler(
        library: World, capfd: pytest.CaptureFixture[str]) -> None:
    import logging

    from bootstrap import ensure, load_config

    logging.getLogger("kernel_bootstrap").setLevel(logging.DEBUG)
    try:
        library.skill("gamma")
        result = ensure(load_config(library.config))
        library.skill("gamma", version="0.2.0")
        import os

        os.environ["FAKE_UV_FAIL"] = "gamma"
        try:
            failed = ensure(load_config(library.config))  # a warning, with no handler attached
        finally:
            del os.environ["FAKE_UV_FAIL"]
    finally:
        logging.getLogger("kernel_bootstrap").setLevel(logging.NOTSET)
    assert result.failed == {} and "gamma" in failed.failed
    assert capfd.readouterr().err == ""


def test_log_lines_follow_stderr_when_the_host_swaps_and_closes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A test runner's capture or a notebook replaces sys.stderr and closes the old stream; the
    # next warning must land on the new one, not fail with "I/O operation on closed file".
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    log.configure(fmt="json")
    log.warning("first", n=1)
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    log.warning("second", n=2)
    log.configure()
    assert json.loads(second.getvalue())["event"] == "second"


def test_a_step_counts_one_thing_in_the_singular(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.skill("alpha")
    world.write_config(requirements=["requests>=2"])
    code, _, stderr = run_with_tty_stderr(world.command("ensure"),
                                          {**world.env, "NO_COLOR": "1"})
    assert code == 0, stderr
    steps = [line.rsplit(" (", 1)[0] for line in screen(stderr) if line.startswith("[")]
    assert steps == ["[1/4] creating the venv",
                     "[2/4] installing the runtime (1 requirement); building 1 skill",
                     "[3/4] checking the new venv", "[4/4] installing 1 skill"]

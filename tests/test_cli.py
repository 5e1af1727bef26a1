"""CLI conventions, as uv's: global options anywhere, -V, help that lists and explains."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap import __version__
from testing.world import World


def cli(*args: str, cwd: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "bootstrap", *args], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, **(env or {})}, check=False)


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag: str) -> None:
    result = cli(flag)
    assert (result.returncode, result.stdout) == (0, f"kernel-bootstrap {__version__}\n")


def test_no_arguments_prints_the_help_listing_every_command_and_exits_2() -> None:
    result = cli()
    assert result.returncode == 2 and result.stdout == ""
    for command in ("ensure", "status", "repair", "gc", "init", "publish", "push",
                    "kernelspec", "snapshot"):
        assert f"\n    {command} " in result.stderr
    assert "exit codes:" in result.stderr


@pytest.mark.parametrize(("family", "words"), [("kernelspec", "install"),
                                               ("snapshot", "list, prune")])
def test_a_family_without_its_subcommand_names_it_in_words(family: str, words: str) -> None:
    result = cli(family)
    assert result.returncode == 2
    assert result.stderr == f"error: {family} needs a subcommand: {words}\n"


def test_top_level_help_describes_the_tool_and_ends_with_exit_codes_and_environment() -> None:
    out = cli("--help").stdout
    assert "Keep a Jupyter kernel's venv" in out and "Command line:" not in out
    codes = out.index("exit codes:")
    assert all(f"\n  {code}  " in out[codes:] for code in "0123")
    assert "KERNEL_BOOTSTRAP_CONFIG" in out[codes:]


@pytest.mark.parametrize("command", [["ensure"], ["status"], ["repair"], ["gc"], ["init"],
                                     ["publish"], ["push"], ["kernelspec", "install"],
                                     ["snapshot", "list"], ["snapshot", "prune"]])
def test_every_option_has_help_and_every_value_option_its_default(command: list[str]) -> None:
    from bootstrap.arguments import build_parser

    parser = build_parser()
    for name in command:
        sub = next(a for a in parser._actions if a.dest.endswith("command"))
        assert isinstance(sub, argparse._SubParsersAction)
        parser = sub.choices[name]
    assert parser.description
    for action in parser._actions:
        if action.dest == "help" or not action.option_strings:
            continue
        assert action.help, f"{command} {action.option_strings} has no help"
        if action.nargs != 0 and not action.required and action.dest != "roots":
            assert "default" in action.help, f"{command} {action.option_strings}"
    assert "$KERNEL_BOOTSTRAP_CONFIG" in parser.format_help()


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    return w


def forms(config: str) -> list[list[str]]:
    return [
        ["ensure", "--json", "-q", "--config", config],
        ["-q", "--config", config, "ensure", "--json"],
        ["--config", config, "-q", "ensure", "--json"],
        ["--log-format", "json", "ensure", "--json", "--config", config],
        ["-q", "ensure", "--json", "--config=" + config],
        ["--config=" + config, "ensure", "--json", "--log-format=console"],
    ]


def test_global_options_go_before_or_after_the_subcommand_cold_and_warm(world: World) -> None:
    for args in forms(str(world.config)):
        for _ in ("cold or first", "warm"):
            result = subprocess.run([sys.executable, "-m", "bootstrap", *args],
                                    capture_output=True, text=True, env=world.env, check=False)
            assert result.returncode == 0, (args, result.stderr)
            assert json.loads(result.stdout)["python"] == str(world.python)
            if "-q" in args:
                assert result.stderr == "", args


def test_quiet_before_and_after_the_subcommand_add_up(world: World) -> None:
    world.ensure()
    world.skill("beta")
    result = subprocess.run([sys.executable, "-m", "bootstrap", "-q", "ensure", "-q",
                             "--config", str(world.config)], capture_output=True, text=True,
                            env={**world.env, "FAKE_UV_FAIL": "beta"}, check=False)
    assert result.returncode == 0 and result.stderr == "", "-q -q hides warnings too"


def test_the_later_config_wins_as_argparse_reads_it(world: World, tmp_path: Path) -> None:
    result = cli("--config", str(tmp_path / "nope.toml"), "status", "--config",
                 str(world.config), env={k: v for k, v in world.env.items()})
    assert result.returncode in (0, 1), result.stderr


def test_gc_help_says_everything_gc_does() -> None:
    # It said only "remove leftovers of dead processes".
    for out in (cli("gc", "-h").stdout, cli("-h").stdout):
        words = " ".join(out.split())
        for does in ("leftovers", "unused generations", "old cache entries",
                     "stale kernel servers"):
            assert does in words, does


def test_snapshot_prune_help_says_what_plain_prune_needs(tmp_path: Path) -> None:
    # Its help said the defaults kept everything ("keep all", "any age"), yet a plain
    # `snapshot prune` exits 2.
    words = " ".join(cli("snapshot", "prune", "-h").stdout.split())
    assert "keep all" not in words and "any age" not in words
    assert "give --keep, --older-than or both" in words
    (tmp_path / "kernel-bootstrap.toml").write_text('snapshots = "store"\n')
    plain = cli("snapshot", "prune", cwd=tmp_path)
    assert plain.returncode == 2 and "--keep N and/or --older-than DAYS" in plain.stderr


@pytest.mark.parametrize("argv", [["run", "-c", "print(1)"],
                                  ["--config", "k.toml", "run", "--strict", "-m", "x y"]])
def test_run_with_python_args_before_double_dash_says_to_put_it_first(argv: list[str],
                                                                       tmp_path: Path) -> None:
    result = cli(*argv, cwd=tmp_path)
    assert result.returncode == 2 and "unrecognized arguments" in result.stderr
    assert ("the interpreter's arguments go after `--`: `kernel-bootstrap run -- -c 'print(1)'`"
            in result.stderr)


def test_ensure_json_with_a_config_error_prints_an_object_as_status_json_does(
        tmp_path: Path) -> None:
    config = tmp_path / "kernel-bootstrap.toml"
    config.write_text('venv = "v"\nbogus = 1\n')
    for command in ("ensure", "status"):
        result = cli(command, "--json", "--config", str(config))
        assert result.returncode == 2 and "unknown key 'bogus'" in result.stderr
        out = json.loads(result.stdout)
        assert "unknown key 'bogus'" in out["error"], command


def test_kernelspec_prefix_empty_is_a_usage_error_not_the_current_directory(
        tmp_path: Path) -> None:
    result = cli("kernelspec", "install", "--prefix", "", cwd=tmp_path)
    assert result.returncode == 2 and "$CONDA_PREFIX" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_push_json_is_one_line(tmp_path: Path) -> None:
    from testing.skills import make_skill

    skill = make_skill(tmp_path / "src", "demo")
    result = cli("push", str(skill), "--dest", str(tmp_path / "dest"), "--json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and json.loads(result.stdout)["runtimes"]


def test_republishing_an_unchanged_skill_says_unchanged_once(tmp_path: Path) -> None:
    from testing.skills import make_skill

    skill = make_skill(tmp_path / "src", "demo")
    root = tmp_path / "root"
    first = cli("publish", str(skill), "--into", str(root))
    assert first.returncode == 0 and "(changed, " in first.stdout
    again = cli("publish", str(skill), "--into", str(root))
    assert again.stdout == f"published demo -> {root.resolve() / 'demo'} (unchanged)\n"


def test_the_readme_python_push_example_runs_as_written(tmp_path: Path) -> None:
    import os
    import re

    from testing.skills import make_skill

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    example = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S)
                   if "asyncio.run(push(" in block)
    make_skill(tmp_path / "skills", "pdf")
    # A stand-in `docker` on PATH: `docker exec -i box CMD...` runs CMD here. Only the
    # destination moves, from the sandbox's /skills to a directory of this test.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text('#!/bin/sh\nshift 3\nexec "$@"\n')
    (bin_dir / "docker").chmod(0o755)
    dest = tmp_path / "sandbox-skills"
    script = example.replace('"/skills"', repr(str(dest)))
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                            text=True, check=False,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("docker exec -i box True")
    assert (dest / "pdf" / "SKILL.md").is_file()


@pytest.mark.parametrize("command", ["ensure", "status"])
def test_a_run_started_with_stdout_closed_still_succeeds(world: World, command: str) -> None:
    """A launcher that closes our stdout (`>&-`) gets the exit code, not a traceback: the
    console script's fast exit flushes only the streams that exist."""
    import os

    world.ensure()  # then ensure answers on the warm path, status on the full one
    result = subprocess.run(
        [sys.executable, "-c", "from bootstrap.cli import run; run()", command,
         "--config", str(world.config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=world.env,
        preexec_fn=lambda: os.close(1), check=False)
    assert (result.returncode, "Traceback" in result.stderr) == (0, False), result.stderr


# Read by the code for tests and debugging only: no user sets them.
_INTERNAL_VARIABLES = {"KERNEL_BOOTSTRAP_TEST_NOW", "KERNEL_BOOTSTRAP_NO_EXCHANGE"}


def test_readmes_environment_table_and_help_name_the_same_variables_the_code_reads() -> None:
    # The table lacked KERNEL_BOOTSTRAP_CONFIG, _SNAPSHOTS and _SNAPSHOT_TIMEOUT, which -h named.
    import re

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    table = readme[readme.index("| environment | effect |"):]
    table = table[:table.index("\n\n")]
    in_readme = re.findall(r"^\| `(KERNEL_BOOTSTRAP_[A-Z_]+)`", table, flags=re.MULTILINE)
    out = cli("--help").stdout
    environment = out[out.index("\nenvironment:\n"):]
    in_help = re.findall(r"^  (KERNEL_BOOTSTRAP_[A-Z_]+)", environment, flags=re.MULTILINE)
    read = {name for path in (root / "bootstrap").rglob("*.py")
            for name in re.findall(r"KERNEL_BOOTSTRAP_[A-Z_]+[A-Z]", path.read_text())}
    assert sorted(in_readme) == sorted(in_help) == sorted(read - _INTERNAL_VARIABLES)

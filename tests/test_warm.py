"""The warm path: its copies of platformdirs, config discovery and argparse agree with the
originals, and its fingerprint check holds only while nothing it stamped has changed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import platformdirs
import pytest

from bootstrap import fingerprint, warm
from bootstrap.arguments import UsageError, build_parser, parse_args
from bootstrap.config_file import find_config_file
from testing.world import World

# -- parity with what warm.py copies -----------------------------------------------------------


@pytest.mark.parametrize("xdg", [None, "relative/cache", "/somewhere/cache"])
def test_the_cache_dir_is_platformdirs_user_cache_dir(monkeypatch: pytest.MonkeyPatch,
                                                      xdg: str | None) -> None:
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert warm.cache_dir() == platformdirs.user_cache_dir("kernel-bootstrap")


@pytest.mark.parametrize(("explicit", "env"), [
    (None, None), (None, "from-env.toml"), ("given.toml", "from-env.toml"),
    ("/abs/given.toml", None), ("sub/../x.toml", None), (None, ""), ("./x.toml", None),
    ("a//b.toml", None), ("//x.toml", None), ("///x.toml", None), ("dir/", None),
    (None, "sub/./e.toml"),
])
def test_config_discovery_is_the_full_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            explicit: str | None, env: str | None) -> None:
    monkeypatch.chdir(tmp_path)
    if env is None:
        monkeypatch.delenv("KERNEL_BOOTSTRAP_CONFIG", raising=False)
    else:
        monkeypatch.setenv("KERNEL_BOOTSTRAP_CONFIG", env)
    full = find_config_file(Path(explicit) if explicit is not None else None).absolute()
    found = warm.config_file_for(explicit)
    # None leaves it to the full path; an answer must be the very file it would read.
    assert found is None or found == str(full)


def test_config_discovery_answers_the_plain_spellings(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KERNEL_BOOTSTRAP_CONFIG", raising=False)
    assert warm.config_file_for(None) == str(tmp_path / "kernel-bootstrap.toml")
    assert warm.config_file_for("sub/k.toml") == str(tmp_path / "sub" / "k.toml")
    assert warm.config_file_for("/abs/k.toml") == "/abs/k.toml"


# Every form the warm path answers, and near misses it must leave to the full parser.
FORMS = [
    ["ensure"], ["ensure", "--json"], ["ensure", "--strict"], ["ensure", "--json", "--strict"],
    ["ensure", "--config", "k.toml"], ["ensure", "--config=k.toml"], ["ensure", "--config=a=b"],
    ["ensure", "--config", "a", "--config", "b"], ["ensure", "--config", "a", "--config=b"],
    ["ensure", "--lock-timeout", "5"], ["ensure", "--lock-timeout", "0"],
    ["ensure", "--lock-timeout", "2.5e1"], ["ensure", "--lock-timeout", " 7 "],
    ["ensure", "--lock-timeout", "inf"], ["ensure", "--lock-timeout", "1_000"],
    ["ensure", "--lock-timeout", "abc"], ["ensure", "--lock-timeout", "-1"],
    ["ensure", "--lock-timeout", "nan"], ["ensure", "--lock-timeout", ""],
    ["ensure", "--lock-timeout"], ["ensure", "--lock-timeout=5"], ["ensure", "--config"],
    ["ensure", "--config", "--json"], ["ensure", "--config="], ["ensure", "--config", ""],
    ["ensure", "--config", "-x.toml"], ["ensure", "--js"], ["ensure", "--conf", "k.toml"],
    ["ensure", "-v"], ["ensure", "--json=1"], ["ensure", "extra"], ["ensure", "--"],
    ["ensure", "-h"], ["status"], [], ["--config", "k.toml", "ensure"],
    ["ensure", "--strict", "--config", "k.toml", "--lock-timeout", "3", "--json"],
    # global options before or after the subcommand
    ["-q", "--config", "k.toml", "ensure"], ["ensure", "-q", "--config", "k.toml"],
    ["--config=k.toml", "ensure", "--json"], ["-q", "ensure", "-q"], ["-qq", "ensure"],
    ["--quiet", "ensure", "--quiet"], ["--log-format", "json", "ensure"],
    ["ensure", "--log-format", "console"], ["--log-format=json", "ensure"],
    ["--log-format", "xml", "ensure"], ["ensure", "--log-format", "xml"],
    ["--log-format", "ensure"], ["--config", "a", "ensure", "--config", "b"],
    ["--config", "ensure", "ensure"], ["--json", "ensure"], ["--strict", "ensure"],
    ["--lock-timeout", "5", "ensure"], ["-v", "ensure"], ["ensure", "ensure"],
    ["-q", "status"], ["--config", "k.toml"], ["-q"], ["-V"], ["ensure", "-V"],
    ["ensure", "--retry"], ["-qq", "ensure", "-q"], ["--log-format", "json", "ensure",
                                                     "--log-format", "console"],
]


def _real_parse(argv: list[str]) -> warm.Options | None:
    try:
        args = parse_args(argv)
    except (UsageError, SystemExit):
        return None
    if args.command != "ensure":
        return None
    return ((str(args.config) if args.config is not None else None), bool(args.json),
            bool(args.strict), args.quiet, args.log_format)


@pytest.mark.parametrize("argv", FORMS, ids=[" ".join(f) or "(none)" for f in FORMS])
def test_what_the_warm_parser_accepts_the_full_parser_reads_the_same_way(
        argv: list[str]) -> None:
    warm_args = warm.parse_args(argv)
    if warm_args is None:
        return  # the full parser answers: same arguments, same answer by construction
    assert _real_parse(argv) == warm_args


def test_the_warm_parser_answers_the_plain_forms() -> None:
    # Parity alone would hold for a warm parser that answers nothing: it must stay useful.
    assert warm.parse_args(["ensure"]) == (None, False, False, 0, None)
    assert warm.parse_args(["ensure", "--config", "k", "--json", "--strict",
                            "--lock-timeout", "5"]) == ("k", True, True, 0, None)
    assert warm.parse_args(["ensure", "--config=k"]) == ("k", False, False, 0, None)
    assert warm.parse_args(["-q", "--config", "k", "ensure", "--json"]) == ("k", True, False,
                                                                            1, None)
    assert warm.parse_args(["--config", "a", "ensure", "--config", "b"]) == ("b", False, False,
                                                                             0, None)
    assert warm.parse_args(["--log-format", "json", "ensure", "-qq"]) == (None, False, False,
                                                                          2, "json")


def test_the_warm_path_imports_nothing_but_what_it_did(tmp_path: Path) -> None:
    """Every global-option form is answered with the same imports (python -X importtime)."""
    import subprocess
    import sys

    world = World(tmp_path)
    world.ensure()

    def imported(*args: str) -> set[str]:
        result = subprocess.run([sys.executable, "-X", "importtime", "-m", "bootstrap", *args],
                                capture_output=True, text=True, env=world.env, check=True)
        assert result.stdout == f"{world.python}\n"
        return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:") and "|" in line} - {"imported package"}

    plain = imported("ensure", "--config", str(world.config))
    assert not {"argparse", "json", "tomllib", "structlog", "bootstrap.config"} & plain
    assert imported("-q", "--config", str(world.config), "ensure", "-q") == plain
    assert imported("--log-format", "json", "ensure", "--config", str(world.config)) == plain


def test_the_console_script_warm_imports_only_our_three_modules(tmp_path: Path) -> None:
    """As the console script runs it (`from bootstrap.cli import run; run()`), a warm ensure
    imports nothing beyond what `python -c pass` does but bootstrap, its cli and warm modules
    (-m would hide it: runpy itself imports contextlib, functools and more)."""
    import subprocess
    import sys

    world = World(tmp_path)
    world.ensure()

    def imported(code: str, *args: str) -> set[str]:
        result = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *args],
                                capture_output=True, text=True, env=world.env, check=True)
        return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:") and "|" in line} - {"imported package"}

    baseline = imported("pass")
    warm_start = imported("from bootstrap.cli import run; run()", "ensure", "--config",
                          str(world.config))
    assert warm_start - baseline == {"__future__", "bootstrap", "bootstrap.cli",
                                     "bootstrap.warm"}


def test_a_pyproject_config_is_warm_and_editing_it_invalidates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(tmp_path)
    world.skill("alpha")
    table = world.config.read_text()
    world.config.unlink()
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(f'[project]\nname = "x"\n\n[tool.kernel-bootstrap]\n{table}')
    monkeypatch.chdir(tmp_path)
    assert warm.config_file_for(None) == str(pyproject)
    import subprocess
    import sys

    def ensure() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "bootstrap", "ensure"], cwd=tmp_path,
                              capture_output=True, text=True, env=world.env, check=False)

    assert ensure().returncode == 0
    assert warm.check(str(pyproject)) is not None, "the pyproject is the fingerprinted config"
    pyproject.write_text(pyproject.read_text().replace('venv = "venv"', 'venv = "venv2"'))
    assert warm.check(str(pyproject)) is None
    result = ensure()
    assert result.returncode == 0 and result.stdout.startswith(str(tmp_path / "venv2"))


def test_warm_discovery_takes_a_pyproject_only_when_the_full_path_could(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KERNEL_BOOTSTRAP_CONFIG", raising=False)
    (tmp_path / "pyproject.toml").write_text("[tool.kernel-bootstrap]\n")
    assert warm.config_file_for(None) == str(find_config_file(None).absolute())
    (tmp_path / "kernel-bootstrap.toml").write_text("")
    assert warm.config_file_for(None) == str(find_config_file(None).absolute())


@pytest.mark.parametrize("text", ["5", "0", "0.5", "1e3", "inf", " 7 ", "abc", "-1", "nan",
                                  "", "-0", "1_0"])
def test_lock_timeout_values_are_judged_by_one_rule(text: str) -> None:
    try:
        real: float | None = build_parser().parse_args(
            ["ensure", "--lock-timeout", text]).lock_timeout
    except (UsageError, SystemExit):
        real = None
    assert warm.parse_seconds(text) == real


def test_a_warm_ensure_with_an_invalid_lock_timeout_exits_2_as_a_cold_one(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    cold = world.run("ensure", "--lock-timeout", "abc")
    world.ensure()
    assert world.ensure("--json").returncode == 0  # warm now
    warm_run = world.run("ensure", "--lock-timeout", "abc")
    assert cold.returncode == warm_run.returncode == 2
    assert warm_run.stdout == "" and "--lock-timeout" in warm_run.stderr


# -- the fingerprint check, in process -----------------------------------------------------------


@pytest.fixture
def stamped(tmp_path: Path) -> tuple[str, list[str]]:
    config = tmp_path / "kernel-bootstrap.toml"
    config.write_text("")
    other = tmp_path / "pyproject.toml"
    other.write_text("[project]\n")
    paths = [str(config), str(other), str(tmp_path / "absent")]
    fingerprint.save(str(config), "/v", "/v/bin/python",
                     fingerprint.stamps([*paths, "/v/bin/python"]))
    return str(config), paths


def test_an_unchanged_fingerprint_answers_with_the_venv_and_interpreter(
        stamped: tuple[str, list[str]]) -> None:
    config, _ = stamped
    assert warm.check(config) == ("/v", "/v/bin/python")


@pytest.mark.parametrize("change", ["edit", "touch", "create", "delete", "replace"])
def test_any_change_to_a_stamped_path_falls_through(stamped: tuple[str, list[str]],
                                                    change: str) -> None:
    config, (_, other, absent) = stamped
    if change == "edit":
        Path(other).write_text("[project]\nname = 'x'\n")
    elif change == "touch":
        os.utime(other, ns=(time.time_ns(), time.time_ns() + 10**9))
    elif change == "create":
        Path(absent).write_text("")
    elif change == "delete":
        os.unlink(other)
    else:
        Path(other + ".new").write_text("[project]\n")
        os.replace(other + ".new", other)
    assert warm.check(config) is None


def test_a_changed_environment_falls_through(stamped: tuple[str, list[str]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    config, _ = stamped
    monkeypatch.setenv("KERNEL_BOOTSTRAP_VENV", "/elsewhere")
    assert warm.check(config) is None


def test_the_environment_checked_may_be_another_processs(stamped: tuple[str, list[str]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The provisioner checks for the kernel's environment (the kernelspec's env added), not its
    # own: only the one given counts.
    config, _ = stamped
    monkeypatch.setenv("KERNEL_BOOTSTRAP_VENV", "/elsewhere")
    assert warm.holds(config, {})[:2] == ("/v", "/v/bin/python")  # type: ignore[index]
    monkeypatch.delenv("KERNEL_BOOTSTRAP_VENV")
    assert warm.holds(config, {"KERNEL_BOOTSTRAP_VENV": "/elsewhere"}) is None


def test_a_fingerprint_for_another_config_or_in_another_format_falls_through(
        stamped: tuple[str, list[str]]) -> None:
    config, _ = stamped
    path = Path(str(warm.fingerprint_path(config)))
    text = path.read_text()
    for bad in (text.replace(warm.FORMAT, "kernel-bootstrap-warm 0"),
                text.replace(f"config\t{config}", "config\t/other.toml"),
                text + "surprise\tline\n", text.rstrip("\n"), text.replace("venv\t/v\n", "")):
        path.write_text(bad)
        assert warm.check(config) is None, bad


@pytest.mark.parametrize("kind", ["symlink to /dev/zero", "FIFO", "directory"])
def test_a_planted_fingerprint_is_ignored_without_blocking_or_reading_it_whole(
        stamped: tuple[str, list[str]], kind: str) -> None:
    config, _ = stamped
    path = Path(str(warm.fingerprint_path(config)))
    text = path.read_text()
    path.unlink()
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    assert warm.check(config) is None
    # Nor through a symlink to a valid fingerprint: it is not one we wrote there.
    if kind != "directory":
        path.unlink()
        real = path.with_name("elsewhere")
        real.write_text(text)
        path.symlink_to(real)
        assert warm.check(config) is None


def test_a_config_path_too_long_for_a_file_name_is_never_fingerprinted(tmp_path: Path) -> None:
    config = str(tmp_path / ("c" * 250) / "kernel-bootstrap.toml")
    assert warm.fingerprint_path(config) is None
    fingerprint.save(config, "/v", "/v/bin/python", [])
    assert warm.check(config) is None


def test_save_does_not_rewrite_an_identical_fingerprint(stamped: tuple[str, list[str]]) -> None:
    config, paths = stamped
    path = Path(str(warm.fingerprint_path(config)))
    before = os.stat(path)
    fingerprint.save(config, "/v", "/v/bin/python", fingerprint.stamps([*paths, "/v/bin/python"]))
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_the_warm_cli_prints_what_the_full_ensure_prints(tmp_path: Path) -> None:
    world = World(tmp_path)
    cold = json.loads(world.ensure("--json").stdout)
    world.clear_log()
    warm_out = json.loads(world.ensure("--json").stdout)
    assert world.uv_calls() == []
    assert warm_out == {**cold, "action": "ready", "installed": [], "failed": [], "removed": []}


# -- what the warm path believes (issue 22) ------------------------------------------------------


def warm_world(tmp_path: Path) -> tuple[World, Path]:
    world = World(tmp_path / "w")
    world.ensure()
    fingerprint = Path(str(warm.fingerprint_path(str(world.config))))
    assert fingerprint.is_file()
    return world, fingerprint


def fake_venv(tmp_path: Path) -> Path:
    """Another program spelled as a venv's interpreter: what an edited fingerprint names."""
    evil = tmp_path / "evil"
    (evil / "bin").mkdir(parents=True)
    (evil / "bin" / "python").write_text("#!/bin/sh\necho pwned\n")
    (evil / "bin" / "python").chmod(0o755)
    return evil


@pytest.mark.parametrize("edit", ["python line", "venv and python lines", "no stat lines"])
def test_an_edited_fingerprint_never_names_another_interpreter(tmp_path: Path,
                                                               edit: str) -> None:
    world, fingerprint = warm_world(tmp_path)
    evil = fake_venv(tmp_path)
    text = fingerprint.read_text()
    real = str(world.python)
    if edit == "python line":
        text = text.replace(f"python\t{real}\n", "python\t/bin/sh\n")
    elif edit == "venv and python lines":
        text = text.replace(f"venv\t{world.venv}\n", f"venv\t{evil}\n").replace(
            f"python\t{real}\n", f"python\t{evil}/bin/python\n")
    else:
        text = "".join(line + "\n" for line in text.splitlines() if not line.startswith("stat"))
        text = text.replace(f"venv\t{world.venv}\n", f"venv\t{evil}\n").replace(
            f"python\t{real}\n", f"python\t{evil}/bin/python\n")
    fingerprint.write_text(text)
    world.clear_log()
    assert world.ensure().stdout == f"{real}\n"


@pytest.mark.parametrize("whose", ["file of another user", "file others can write",
                                   "directory others can write", "directory of another user"])
def test_a_fingerprint_someone_else_could_write_is_not_believed(tmp_path: Path,
                                                                whose: str) -> None:
    # A fingerprint consistent in itself (interpreter, stamps) but for a venv not configured:
    # believed only when nobody but this user could have written it.
    world, fingerprint = warm_world(tmp_path)
    evil = fake_venv(tmp_path)
    evil_python = str(evil / "bin" / "python")
    text = fingerprint.read_text().replace(f"venv\t{world.venv}\n", f"venv\t{evil}\n").replace(
        f"python\t{world.python}\n",
        f"python\t{evil_python}\nstat\t{evil_python}\t{warm.stamp(evil_python)}\n")
    fingerprint.write_text(text)
    assert warm.check(str(world.config)) == (str(evil), evil_python)  # the control
    if whose == "file of another user":
        os.chown(fingerprint, 12345, 12345)
    elif whose == "file others can write":
        fingerprint.chmod(0o646)
    elif whose == "directory others can write":
        fingerprint.parent.chmod(0o777)
    else:
        os.chown(fingerprint.parent, 12345, 12345)
    result = world.ensure()
    assert result.stdout == f"{world.python}\n"
    if whose.startswith("directory"):
        assert "no warm start" in result.stderr and str(fingerprint.parent) in result.stderr


def test_a_symlinked_fingerprint_directory_is_never_written_through(tmp_path: Path) -> None:
    world, fingerprint = warm_world(tmp_path)
    victims = tmp_path / "victims"
    victims.mkdir()
    warm_dir = fingerprint.parent
    os.rename(warm_dir, tmp_path / "old-warm")
    warm_dir.symlink_to(victims)  # no fingerprint there: a full check, which saves one
    result = world.ensure()
    assert result.stdout == f"{world.python}\n"
    assert list(victims.iterdir()) == []
    assert "no warm start" in result.stderr


def test_a_file_stamped_within_its_clock_tick_is_checked_fully_next_time(
        tmp_path: Path) -> None:
    # A same-size rewrite within one timestamp tick keeps inode, size, mtime and ctime: the
    # fingerprint must not vouch for a file that was that fresh when stamped (issue 22).
    config = tmp_path / "kernel-bootstrap.toml"
    config.write_text("")
    skill_md = tmp_path / "SKILL.md"
    skill_md.write_text("name: a\n")  # changed just now, as an agent may have
    fingerprint.save(str(config), "/v", "/v/bin/python",
                     fingerprint.input_stamps([str(config), str(skill_md)])
                     + fingerprint.stamps(["/v/bin/python"]))
    assert warm.check(str(config)) is None
    for path in (config, skill_md):  # settled: stamped as they are, and believed
        old = time.time_ns() - 60 * 10**9
        os.utime(path, ns=(old, old))
    time.sleep(0.05)  # ctime is set by utime itself: let it age past the tick
    fingerprint.save(str(config), "/v", "/v/bin/python",
                     fingerprint.input_stamps([str(config), str(skill_md)])
                     + fingerprint.stamps(["/v/bin/python"]))
    assert warm.check(str(config)) == ("/v", "/v/bin/python")


def test_an_edit_just_before_a_check_makes_the_next_start_check_fully(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    from bootstrap.config import load_config
    from bootstrap.engine.ensure import ensure

    world = World(tmp_path)
    world.skill("alpha")
    world.ensure()
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    config = load_config(world.config)
    skill_md = world.skills_dir / "alpha" / "SKILL.md"
    skill_md.write_bytes(skill_md.read_bytes())  # same size, fresh times: then at once a check
    assert ensure(config).action == "ready"

    def full_check() -> bool:
        result = subprocess.run([sys.executable, "-X", "importtime", *world.command("ensure")[1:]],
                                capture_output=True, text=True, env=world.env, check=True)
        assert result.stdout == f"{world.python}\n"
        return "bootstrap.config" in result.stderr

    assert full_check()  # the racy stamp is not believed ...
    assert not full_check()  # ... and once settled, the start is warm again


# -- the warm warning for a failure backing off, in the format the full path would use ----------

def test_a_warm_start_warns_in_console_lines_on_a_pipe_and_json_only_when_asked(
        tmp_path: Path) -> None:
    # A pipe used to get a JSON line (issue 31: CI logs are read by people).
    world = World(tmp_path)
    world.skill("alpha")
    world.skill("beta")
    start = time.time() + 10 * 86400

    def at(seconds: float, **env: str) -> dict[str, str]:
        return {"KERNEL_BOOTSTRAP_TEST_NOW": repr(start + seconds), **env}

    for _ in range(2):  # the second failure backs off for a minute
        world.ensure(env=at(0, FAKE_UV_FAIL="beta"))
    world.ensure(env=at(1))  # a full check: saves the fingerprint that records the failure
    world.clear_log()
    retry_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + 60))
    console = world.ensure(env=at(2)).stderr
    assert console.startswith("warning: skill failed to install earlier; not retried before "
                              f"retry_at skill=beta failures=2 retry_at={retry_at}")
    for line in console.splitlines():
        with pytest.raises(ValueError):
            json.loads(line)
    as_json = world.ensure(env=at(2, KERNEL_BOOTSTRAP_LOG_FORMAT="json"))
    event = json.loads(as_json.stderr)
    assert (event["event"], event["skill"], event["retry_at"]) == (
        "skill failed to install earlier; not retried before retry_at", "beta", retry_at)
    assert world.uv_calls() == [], "both answered warm"

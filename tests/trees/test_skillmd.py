"""SKILL.md under the Agent Skills spec: each rule with a valid and an invalid case, and what
publish, push, ensure and status do with a skill that breaks one."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.cli import main
from bootstrap.trees.skillmd import check_file, check_text
from testing.skills import make_skill
from testing.world import World

LONG_DESCRIPTION = "Build apps with the Claude API. " * 34  # 1,088 characters, as claude-api


def check(front_matter: str, directory: str | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings) of a SKILL.md with this front matter, each as "key: rule"; in the
    directory its name names, unless ``directory`` says otherwise."""
    named = re.search(r"^name: (.+)$", front_matter, re.MULTILINE)
    directory = directory or (named.group(1) if named else "demo")
    result = check_text(Path(f"/s/{directory}/SKILL.md"), f"---\n{front_matter}---\n# body\n",
                        directory)
    return ([f"{e.key}: {e.rule}" for e in result.errors],
            [f"{w.key}: {w.rule}" for w in result.warnings])


VALID = "name: demo\ndescription: does things\n"

# (rule, a front matter that keeps it, one that breaks it, what the error says)
ERRORS = [
    ("name required", VALID, "description: d\n", "name: is required"),
    ("name a string", VALID, "name: 12\ndescription: d\n", "name: must be a string"),
    ("name not empty", VALID, "name: ''\ndescription: d\n", "name: must not be empty"),
    ("name length", "name: " + "a" * 64 + "\ndescription: d\n",
     "name: " + "a" * 65 + "\ndescription: d\n", "longer than 64 characters"),
    ("name lowercase", VALID, "name: Demo\ndescription: d\n", "uppercase"),
    ("name leading hyphen", "name: a-b\ndescription: d\n", "name: -ab\ndescription: d\n",
     "start or end with a hyphen"),
    ("name trailing hyphen", "name: a-b\ndescription: d\n", "name: ab-\ndescription: d\n",
     "start or end with a hyphen"),
    ("name double hyphen", "name: a-b\ndescription: d\n", "name: a--b\ndescription: d\n",
     "must not contain '--'"),
    ("name characters", VALID, "name: de mo\ndescription: d\n", "only lowercase letters"),
    ("description required", VALID, "name: demo\n", "description: is required"),
    ("description a string", VALID, "name: demo\ndescription: [a, b]\n",
     "description: must be a string, not a list"),
    ("description not empty", VALID, "name: demo\ndescription: '  '\n",
     "description: must not be empty"),
    ("license a string", VALID + "license: MIT\n", VALID + "license: [MIT]\n",
     "license: must be a string"),
    ("compatibility a string", VALID + "compatibility: Python 3.11\n",
     VALID + "compatibility: 3.11\n", "compatibility: must be a string, not a number"),
    ("allowed-tools a string", VALID + "allowed-tools: Bash Read\n",
     VALID + "allowed-tools:\n  - Bash\n", "allowed-tools: must be a string, not a list"),
    ("metadata a mapping", VALID + "metadata:\n  author: me\n", VALID + "metadata: me\n",
     "metadata: must be a mapping of strings to strings"),
    ("metadata values strings", VALID + "metadata:\n  version: '1.0'\n",
     VALID + "metadata:\n  version: 1.0\n", "metadata.version: must be a string"),
    ("metadata keys strings", VALID + "metadata:\n  '1': x\n", VALID + "metadata:\n  1: x\n",
     "metadata: keys must be strings"),
    ("YAML that parses", VALID, "name: demo\ndescription: [unclosed\n", "not valid YAML"),
    ("a mapping", VALID, "- name\n- demo\n", "must be a mapping of keys to values, not a list"),
    ("not empty", VALID, "", "must be a mapping of keys to values, not empty"),
    ("a real date", VALID + "metadata:\n  d: '2024-02-30'\n",
     VALID + "metadata:\n  d: !!timestamp 2024-02-30\n", "not valid YAML"),
    ("compatibility not empty", VALID + "compatibility: Python 3.11\n",
     VALID + "compatibility: ''\n", "compatibility: must not be empty"),
    ("a key once", VALID + "license: MIT\n", VALID + "license: MIT\nlicense: MIT\n",
     "license: appears twice (lines 4 and 5)"),
]


@pytest.mark.parametrize(("valid", "invalid", "says"),
                         [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_each_error_rule_refuses_its_invalid_case_and_keeps_its_valid_one(
        valid: str, invalid: str, says: str) -> None:
    assert check(valid)[0] == []
    errors, _ = check(invalid)
    assert any(says in e for e in errors), errors


# (rule, a front matter that keeps it, one that breaks it, what the warning says)
WARNINGS = [
    ("description length", VALID, "name: demo\ndescription: |-\n  " + LONG_DESCRIPTION + "\n",
     "description: is longer than 1024 characters"),
    ("compatibility length", VALID + "compatibility: " + "c" * 500 + "\n",
     VALID + "compatibility: " + "c" * 501 + "\n", "compatibility: is longer than 500"),
    ("unknown key", VALID + "license: MIT\n", VALID + "version: 2\n",
     "version: is not a key the spec defines"),
    ("unknown empty key", VALID + "license: MIT\n", VALID + "'': 2\n",
     "'': is not a key the spec defines"),
]


@pytest.mark.parametrize(("valid", "advised", "says"),
                         [w[1:] for w in WARNINGS], ids=[w[0] for w in WARNINGS])
def test_each_advisory_rule_warns_and_still_accepts(valid: str, advised: str, says: str) -> None:
    assert check(valid) == ([], [])
    errors, warnings = check(advised)
    assert errors == [] and any(says in w for w in warnings), warnings


def test_the_name_must_be_the_directory_s() -> None:
    assert check(VALID, directory="demo") == ([], [])
    assert check(VALID, directory="other")[0] == [
        "name: 'demo' differs from the directory name 'other'"]


@pytest.mark.parametrize("name", ["my_skill", "my.skill"])
def test_underscore_or_dot_in_a_name_is_a_warning(name: str) -> None:
    errors, warnings = check(f"name: {name}\ndescription: d\n", directory=name)
    assert errors == [] and len(warnings) == 1 and warnings[0].startswith("name: contains")


def test_a_block_description_is_read_as_yaml_reads_it() -> None:
    # Read line by line, this was the description "|-" (and "|" with a clip indicator).
    result = check_text(Path("/s/demo/SKILL.md"),
                        "---\nname: demo\ndescription: |-\n  first line\n  second\n---\n", "demo")
    assert result.errors == () and result.warnings == ()
    assert check("name: demo\ndescription: |-\n")[0] == ["description: must not be empty"]


@pytest.mark.parametrize(("text", "says"), [
    ("# no front matter\n", "missing: SKILL.md must start with a '---' line"),
    ("---\nname: demo\ndescription: d\n", "not closed"),
    ("", "missing"),
])
def test_missing_or_unclosed_front_matter_is_an_error(text: str, says: str) -> None:
    result = check_text(Path("/s/demo/SKILL.md"), text, "demo")
    assert [e.key for e in result.errors] == ["front matter"]
    assert says in result.errors[0].rule


def test_crlf_and_a_byte_order_mark_are_front_matter_too() -> None:
    text = "\ufeff---\r\nname: demo\r\ndescription: d\r\n---\r\nbody\r\n"
    assert check_text(Path("/s/demo/SKILL.md"), text, "demo").errors == ()


def test_lone_cr_line_endings_are_front_matter_too() -> None:
    # The first line used to be split at "\n" only: the whole file, so "missing".
    text = "---\rname: demo\rdescription: d\r---\rbody\r"
    assert check_text(Path("/s/demo/SKILL.md"), text, "demo").errors == ()


def _long_front_matter(tmp_path: Path, closed: bool) -> Path:
    """A SKILL.md whose front matter runs past 64 KiB: a block description of 70 KiB."""
    skill_md = tmp_path / "demo" / "SKILL.md"
    skill_md.parent.mkdir()
    block = "  a line of a very long description\n" * 2000
    skill_md.write_text("---\nname: demo\ndescription: |\n" + block
                        + ("---\n# body\n" if closed else ""))
    assert skill_md.stat().st_size > 64 * 1024
    return skill_md


@pytest.mark.parametrize("closed", [True, False])
def test_a_front_matter_over_64_kib_is_too_large_not_unclosed(
        tmp_path: Path, closed: bool) -> None:
    # A properly closed one was reported as "not closed".
    result = check_file(_long_front_matter(tmp_path, closed), "demo")
    assert [e.key for e in result.errors] == ["front matter"]
    assert result.errors[0].rule.startswith("too large:") and "64 KiB" in result.errors[0].rule


def test_a_short_unclosed_front_matter_is_not_closed(tmp_path: Path) -> None:
    skill_md = tmp_path / "demo" / "SKILL.md"
    skill_md.parent.mkdir()
    skill_md.write_text("---\nname: demo\ndescription: d\n")
    assert [e.rule for e in check_file(skill_md, "demo").errors] == [
        "not closed: no second '---' line"]


# -- YAML 1.2, as agents' loaders read it ----------------------------------------------------


def test_a_key_given_twice_is_refused_naming_the_key() -> None:
    # The last one used to win: the invalid first name was never looked at.
    errors, _ = check("name: Not Valid\ndescription: d\nname: demo\n", directory="demo")
    assert errors == ["name: appears twice (lines 2 and 4): "
                      "each key of a YAML mapping must be unique"]
    errors, _ = check(VALID + "metadata:\n  author: a\n  author: b\n")
    assert errors == ["author: appears twice (lines 5 and 6): "
                      "each key of a YAML mapping must be unique"]


def test_a_date_or_a_yes_no_word_is_a_plain_string() -> None:
    # YAML 1.1 read the first as an impossible date (an error), the second as a boolean.
    assert check("name: demo\ndescription: 2024-02-30\n") == ([], [])
    assert check("name: no\ndescription: d\n", directory="no") == ([], [])
    assert check("name: demo\ndescription: yes\ncompatibility: on\n") == ([], [])


# A scalar as YAML 1.1 (PyYAML's default) and YAML 1.2's core schema read it; the table holds
# 1.2's reading (a str is a plain string). Read as a metadata key, whose findings show it.
YAML_12 = [("yes", "yes"), ("no", "no"), ("on", "on"), ("off", "off"), ("y", "y"), ("n", "n"),
           ("Yes", "Yes"), ("NO", "NO"), ("true", True), ("False", False), ("0777", 777),
           ("0o17", 15), ("0x1F", 31), ("1_000", "1_000"), ("1:20", "1:20"),
           ("2024-01-01", "2024-01-01"), ("2024-01-01 10:00:00", "2024-01-01 10:00:00"),
           (".5", 0.5), ("1e3", 1000.0), ("-1.5E-2", -0.015), (".inf", math.inf),
           ("+12", 12), ("~", None), ("Null", None), ("=", "="), ("<<", "<<")]


@pytest.mark.parametrize(("scalar", "value"), YAML_12, ids=[s for s, _ in YAML_12])
def test_scalars_are_read_as_yaml_1_2_s_core_schema(scalar: str, value: object) -> None:
    errors, _ = check(f"{VALID}metadata:\n  {scalar}: x\n")
    if isinstance(value, str):
        assert errors == []
    else:
        assert errors == [f"metadata: keys must be strings, not {_kind(value)} ({value!r})"]


def _kind(value: object) -> str:
    return ("empty" if value is None else "a boolean" if isinstance(value, bool)
            else "a number")


@pytest.mark.parametrize("tagged", ["!!timestamp x", "!!bool x", "!!bool yes", "!!int 1_0",
                                    "!!int 0b1", "!!float 1_0.5", "!!float x"])
def test_an_explicit_tag_on_a_value_it_cannot_hold_is_an_error_not_a_crash(
        tagged: str) -> None:
    # !!timestamp x and !!bool x used to escape as an AttributeError and a KeyError.
    errors, _ = check(f"name: demo\ndescription: {tagged}\n")
    assert len(errors) == 1 and errors[0].startswith("front matter: not valid YAML"), errors


def test_a_yaml_error_names_the_line_of_the_file() -> None:
    result = check_text(Path("/s/demo/SKILL.md"),
                        "---\nname: demo\ndescription: d\nbad: [\n---\n", "demo")
    assert "not valid YAML" in result.problem and "(line " in result.problem


def test_python_tags_are_not_constructed() -> None:
    result = check_text(Path("/s/demo/SKILL.md"),
                        "---\nname: demo\ndescription: !!python/object/apply:os.getpid []\n"
                        "---\n", "demo")
    assert "not valid YAML" in result.problem


# -- publish and push: exit 2 naming the file, the key and the rule; nothing written ----------


def test_publish_refuses_a_spec_error_naming_file_key_and_rule(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = make_skill(tmp_path / "src", "good")
    bad = make_skill(tmp_path / "src", "bad", {"SKILL.md": "---\nname: bad\n---\n"})
    root = tmp_path / "root"
    assert main(["publish", str(good), str(bad), "--into", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{bad / 'SKILL.md'}: description: is required" in err
    assert "Traceback" not in err
    assert not root.exists()


def test_publish_accepts_a_long_block_description_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = f"---\nname: api\ndescription: |-\n  {LONG_DESCRIPTION}\nversion: 3\n---\n# api\n"
    src = make_skill(tmp_path / "src", "api", {"SKILL.md": text})
    root = tmp_path / "root"
    assert main(["publish", str(src), "--into", str(root)]) == 0
    err = capsys.readouterr().err
    assert (root / "api" / "SKILL.md").read_text() == text
    assert "description" in err and "longer than 1024" in err and str(src / "SKILL.md") in err
    assert "version" in err and "is not a key the spec defines" in err


def test_push_refuses_invalid_yaml_and_sends_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = make_skill(tmp_path / "src", "good")
    bad = make_skill(tmp_path / "src", "bad",
                     {"SKILL.md": "---\nname: bad\ndescription: a: b: c\n---\n"})
    log = tmp_path / "calls"
    prefix = f"sh -c 'echo x >> {log}; exec \"$@\"' sh"
    dest = tmp_path / "dest"
    assert main(["push", str(good), str(bad), "--dest", str(dest), "--exec", prefix]) == 2
    err = capsys.readouterr().err
    assert f"{bad / 'SKILL.md'}: front matter: not valid YAML" in err
    assert not log.exists() and not dest.exists()


# -- ensure and status: an invalid skill is a failed skill, never a stop ----------------------


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.skill("alpha")
    w.skill("notes", python=False)
    return w


def _break(skill: Path, text: str = "---\nname: notes\n---\n") -> Path:
    (skill / "SKILL.md").write_text(text)
    return skill / "SKILL.md"


def test_an_invalid_plain_skill_fails_alone_and_the_runtime_and_others_install(
        world: World) -> None:
    broken = _break(world.skills_dir / "notes")
    world.write_config(requirements=["six"])
    result = world.ensure("--json")
    out = json.loads(result.stdout)
    assert out["failed"] == [{"name": "notes", "error": f"{broken}: description: is required"}]
    assert out["installed"] == ["alpha"] and out["action"] == "rebuild"
    assert world.imports("alpha") and world.imports("six")
    assert "skill is invalid" in result.stderr and str(broken) in result.stderr
    assert world.run("ensure", "--strict").returncode == 3
    plain = world.ensure()
    assert plain.stdout == f"{world.python}\n" and "description: is required" in plain.stderr


def test_status_shows_the_invalid_skill_as_failed_with_its_rule(world: World) -> None:
    world.ensure()
    broken = _break(world.skills_dir / "notes", "---\nname: Notes\ndescription: d\n---\n")
    status = world.status()
    notes = {s["name"]: s for s in status["skills"]}["notes"]
    # Ready, as `ensure` says (it exits 0), and exit 3 for the failed skill.
    assert status["ready"] is True and notes["state"] == "failed"
    assert f"{broken}: name: invalid skill name 'Notes'" in notes["error"]
    text = world.run("status")
    assert text.returncode == 3 and "failed" in text.stdout and "'Notes'" in text.stdout


def test_a_front_matter_name_mismatch_is_a_failed_skill_not_a_config_error(
        world: World) -> None:
    # It used to stop everything: exit 2 before the runtime was even looked at.
    _break(world.skills_dir / "notes", "---\nname: other\ndescription: d\n---\n")
    result = world.ensure("--json")
    failed = json.loads(result.stdout)["failed"]
    assert [f["name"] for f in failed] == ["notes"]
    assert "'other' differs from the directory name 'notes'" in failed[0]["error"]
    assert world.imports("alpha")


def test_an_invalid_python_skill_is_not_installed_and_the_others_are(world: World) -> None:
    world.skill("beta")
    _break(world.skills_dir / "beta", "---\nname: beta\ndescription: [\n---\n")
    out = json.loads(world.ensure("--json").stdout)
    assert [f["name"] for f in out["failed"]] == ["beta"]
    assert "not valid YAML" in out["failed"][0]["error"]
    assert world.imports("alpha") and not world.imports("beta")
    assert all("beta" not in " ".join(c.editables) for c in world.installs())


def test_fixing_the_skill_makes_it_ready_and_warm_again(world: World) -> None:
    _break(world.skills_dir / "notes")
    world.ensure()
    world.skill("notes", python=False)
    out = json.loads(world.ensure("--json").stdout)
    assert out["failed"] == [] and world.status()["ready"] is True


def test_warnings_leave_the_skill_ready_and_are_shown(world: World) -> None:
    skill_md = _break(world.skills_dir / "notes",
                      "---\nname: notes\ndescription: d\nversion: 2\n---\n")
    result = world.ensure("--json")
    assert json.loads(result.stdout)["failed"] == []
    assert "version" in result.stderr and "is not a key the spec defines" in result.stderr
    notes = {s["name"]: s for s in world.status()["skills"]}["notes"]
    assert notes["state"] == "installed"
    assert notes["warnings"] == [f"{skill_md}: version: is not a key the spec defines "
                                 "(name, description, license, compatibility, metadata, "
                                 "allowed-tools)"]


def test_a_warm_ensure_does_not_import_yaml(world: World) -> None:
    def imported() -> set[str]:
        result = subprocess.run([sys.executable, "-X", "importtime",
                                 *world.command("ensure")[1:]],
                                capture_output=True, text=True, env=world.env, check=True)
        assert result.stdout == f"{world.python}\n"
        return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}

    world.ensure()
    warm = imported()
    assert "bootstrap.warm" in warm and "yaml" not in warm and "bootstrap.config" not in warm
    # A changed SKILL.md is checked again, by the parser (the test would prove nothing else).
    os.utime(world.skills_dir / "notes" / "SKILL.md", (1, 1))
    assert "yaml" in imported()


def test_a_fifo_at_skill_md_is_an_error_not_a_hang(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    os.mkfifo(tmp_path / "demo" / "SKILL.md")
    result = check_file(tmp_path / "demo" / "SKILL.md", "demo")
    assert [(e.key, e.rule) for e in result.errors] == [
        ("file", "cannot read: is a FIFO, not a regular file")]

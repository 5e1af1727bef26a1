"""Fuzzing every file we read: garbage is missing, legacy or a clean exit-2 error, never a crash.

Profiles: ``ci`` (the default, a few hundred examples per test) and ``fuzz`` (10,000 per test):
``KB_HYPOTHESIS_PROFILE=fuzz .venv/bin/python -m pytest tests/test_fuzz.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from bootstrap.commands.status import render, status_dict
from bootstrap.config import Config, config_from_dict, load_config
from bootstrap.engine.status import status
from bootstrap.env.identity import SCHEMA, identity_of, runtime_inputs
from bootstrap.env.marker import MAX_DEPTH, base_marker, marker_path, read_marker
from bootstrap.errors import ConfigError, SkillError
from bootstrap.primitives.lock import LockInfo, holder_path, read_holder
from bootstrap.trees.skillmd import (
    SKILL_FILE,
    check_skill_dir,
    check_text,
    name_findings,
    unsafe_name,
)

# The autouse home guard is function-scoped, but it only points HOME at a temporary directory:
# sharing one across the examples of a test is exactly what we want.
_SHARED = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
           HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=300, deadline=None, suppress_health_check=_SHARED)
settings.register_profile("fuzz", max_examples=10_000, deadline=None,
                          suppress_health_check=_SHARED)
settings.load_profile(os.environ.get("KB_HYPOTHESIS_PROFILE", "ci"))

VERSION = "3.11.7"

# -- strategies ----------------------------------------------------------------------------------

# Lone surrogates included: json.loads accepts "\ud800", and a str path may hold them.
any_text = st.text(st.characters(exclude_categories=()), max_size=40)
json_scalars = (st.none() | st.booleans() | st.integers()
                | st.integers(min_value=2**63, max_value=10**300) | st.floats() | any_text)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(any_text, inner, max_size=5),
    max_leaves=30,
)


def nested(depth: int, leaf: Any = 0, as_dict: bool = False) -> Any:
    """A value nested ``depth`` levels deep, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


# json.dumps itself gives up near 1,000 levels; deeper text is built by deep_json below.
deep_values = st.builds(nested, st.integers(1, 900), json_scalars, st.booleans())
some_value = json_values | deep_values


def deep_json(depth: int, as_dict: bool) -> bytes:
    if as_dict:
        return (b'{"a":' * depth) + b"1" + (b"}" * depth)
    return (b"[" * depth) + (b"]" * depth)


marker_bytes = (
    st.binary(max_size=300)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.builds(deep_json, st.integers(1, 200_000), st.booleans())
    | st.just(b'{"schema": 1' + b"0" * 5000 + b"}")  # beyond int's 4300-digit str limit
)


# -- a small world: a venv that looks ready, a config with two Python skills ----------------------


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kb-fuzz-") as tmp:
        yield Path(tmp)


@pytest.fixture(scope="module")
def config(root: Path) -> Config:
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "pyvenv.cfg").write_text(f"version_info = {VERSION}\n")
    for name in ("alpha", "beta"):
        skill = root / "skills" / name
        skill.mkdir(parents=True)
        (skill / SKILL_FILE).write_text(f"---\nname: {name}\ndescription: d\n---\n")
        (skill / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    return config_from_dict({"venv": "venv", "skills": ["skills/*"], "requirements": ["x"]},
                            root / "kernel-bootstrap.toml")


def ready_marker(config: Config) -> dict[str, Any]:
    """The marker a successful ensure would have written for ``config``."""
    inputs = runtime_inputs(config, VERSION)
    data: dict[str, Any] = dict(base_marker({
        "identity": identity_of(inputs), "inputs": dict(inputs),
        "python": str(config.venv / "bin" / "python")}))
    from bootstrap.skills.python_skill import pyproject_hash

    for skill in config.skills:
        data["skills"][skill.name] = {"path": str(skill.path), "pyproject": pyproject_hash(skill),
                                      "project": skill.name}
    return data


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path inside a marker-shaped value (the value itself too)."""
    out = [prefix]
    if isinstance(value, dict) and len(prefix) < 4:
        for key, item in value.items():
            out += paths_of(item, (*prefix, key))
    return out


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


def deleted(value: Any, path: tuple[Any, ...]) -> Any:
    if len(path) == 1:
        return {k: v for k, v in value.items() if k != path[0]}
    copy = dict(value)
    copy[path[0]] = deleted(value[path[0]], path[1:])
    return copy


def depth_of(value: Any) -> int:
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, level = todo.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else ()
        todo += [(child, level + 1) for child in children]
    return deepest


def well_formed(obj: Any) -> bool:
    """The marker contract, written independently of bootstrap.env.marker."""

    def text(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        try:
            os.fsencode(value)
        except UnicodeEncodeError:
            return False
        return True

    def strs(record: Any, *keys: str) -> bool:
        return isinstance(record, dict) and all(text(record.get(k)) for k in keys)

    def table(value: Any, *keys: str) -> bool:
        return isinstance(value, dict) and all(strs(r, *keys) for r in value.values())

    if not isinstance(obj, dict) or depth_of(obj) > MAX_DEPTH:
        return False
    runtime = obj.get("runtime")
    updated = obj.get("updated")
    return (type(obj.get("schema")) is int and obj["schema"] == SCHEMA
            and isinstance(runtime, dict) and strs(runtime, "identity", "python")
            and isinstance(runtime.get("inputs"), dict)
            and table(obj.get("skills"), "path", "pyproject", "project")
            and table(obj.get("failed"), "path", "pyproject", "error")
            and type(updated) in (int, float))


def write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


# -- the marker ----------------------------------------------------------------------------------


def check_marker(config: Config, data: bytes) -> None:
    write(marker_path(config.venv), data)
    read = read_marker(config.venv)
    assert read.state in ("ok", "missing", "corrupt", "legacy")
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        assert read.state == "corrupt"
    else:
        assert (read.state == "ok") == well_formed(obj), read.problem
    assert (read.data is not None) == (read.state == "ok")
    assert len(read.problem) < 1000, "a problem is one readable line, not the whole file"
    found = status(config)
    # What `status` shows must be printable and serialisable too: that is where a crash would
    # surface for the person who ran it.
    json.dumps(status_dict(found, LockInfo(False, None)))
    # surrogateescape: how a path that is not UTF-8 gets printed back as its own bytes.
    render(found, LockInfo(True, 123)).encode("utf-8", "surrogateescape")


@given(data=marker_bytes)
@example(data=b"")
@example(data=b"\xff\xfe\x00")
@example(data=b'{"schema": 1.0}')
@example(data=b'{"schema": true}')
@example(data=deep_json(100_000, as_dict=False))
def test_any_bytes_as_the_marker_never_crash(config: Config, data: bytes) -> None:
    check_marker(config, data)


@st.composite
def mutated_markers(draw: st.DrawFn, config: Config) -> Any:
    value = ready_marker(config)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths_of(value)))
        if path and draw(st.booleans()):
            value = deleted(value, path)
        else:
            value = replaced(value, path, draw(some_value))
    return value


def test_mutated_ready_markers_are_ok_only_when_well_formed(config: Config) -> None:
    check_marker(config, json.dumps(ready_marker(config)).encode())
    assert status(config).ready, "the unmutated marker must be ready, or the test proves nothing"

    @given(mutated_markers(config))
    def run(value: Any) -> None:
        check_marker(config, json.dumps(value).encode())

    run()


def test_a_marker_nested_just_too_deep_is_corrupt(config: Config) -> None:
    value = ready_marker(config)
    value["runtime"]["inputs"]["python"] = nested(MAX_DEPTH, as_dict=True)
    write(marker_path(config.venv), json.dumps(value).encode())
    assert read_marker(config.venv).state == "corrupt"
    value["runtime"]["inputs"]["python"] = nested(MAX_DEPTH - 4, as_dict=True)
    write(marker_path(config.venv), json.dumps(value).encode())
    assert read_marker(config.venv).state == "ok"


# -- the lock holder record ----------------------------------------------------------------------


@given(data=marker_bytes | st.builds(lambda v: json.dumps({"pid": v}).encode(), some_value))
@example(data=b'{"pid": true}')
@example(data=b'{"pid": 1.0}')
@example(data=b'{"pid": -1}')
@example(data=b'{"pid": 1' + b"0" * 5000 + b"}")
def test_any_holder_record_is_a_positive_pid_or_none(config: Config, data: bytes) -> None:
    write(holder_path(config.venv), data)
    pid = read_holder(config.venv)
    assert pid is None or (type(pid) is int and pid > 0)


# -- SKILL.md ------------------------------------------------------------------------------------

front_matter_lines = st.lists(
    st.one_of(st.just("---"), st.just("name: alpha"), st.just("name: 'alpha'"),
              st.just("description: |-"), st.just("  a block"), st.just("metadata:"),
              st.just("  k: v"), st.just("x: 2024-02-30"), st.just("y: &a [*a]"),
              st.just("[" * 2000), st.just("z: !!python/object:os.system x"),
              st.builds(lambda k, v: f"{k}: {v}", any_text, any_text), any_text),
    max_size=8,
)


@given(text=any_text | front_matter_lines.map("\n".join)
       | front_matter_lines.map(lambda lines: "\r\n".join(["---", *lines])))
def test_any_front_matter_checks_to_findings_never_an_exception(text: str) -> None:
    result = check_text(Path("alpha/SKILL.md"), text, "alpha")
    for finding in (*result.errors, *result.warnings):
        assert finding.key and finding.rule and len(str(finding)) < 1000
    assert bool(result.problem) == bool(result.errors)


def _straddling(pad: int) -> bytes:
    """Valid UTF-8 whose 64 KiB read boundary falls inside a multi-byte character."""
    head = b"---\nname: alpha\n---\n"
    return head + b"a" * (64 * 1024 - len(head) - pad) + "\u20ac".encode() * 4


skill_md_bytes = (
    st.binary(max_size=300)
    | front_matter_lines.map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass"))
    | st.builds(_straddling, st.integers(0, 3))
)


@given(data=skill_md_bytes)
@example(data=_straddling(1))
@example(data=_straddling(2))
def test_any_skill_md_gives_a_name_or_a_skill_error(root: Path, data: bytes) -> None:
    skill = root / "fuzz-skills" / "alpha"
    skill.mkdir(parents=True, exist_ok=True)
    write(skill / SKILL_FILE, data)
    try:
        assert check_skill_dir(skill) == "alpha"
    except SkillError as e:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return
        assert "not UTF-8" not in str(e), "valid UTF-8 reported as binary"


dir_names = st.text(st.characters(exclude_characters="/\x00", codec="utf-8"), min_size=1,
                    max_size=80).filter(lambda n: n not in (".", ".."))


@given(name=dir_names)
@example(name="a" * 65)
@example(name="-a")
@example(name="a--b")
@example(name="Alpha")
def test_any_directory_name_is_a_valid_skill_name_or_a_skill_error(root: Path, name: str) -> None:
    parent = root / "named"
    parent.mkdir(exist_ok=True)
    skill = parent / name
    try:
        skill.mkdir(exist_ok=True)
    except OSError:
        assume(False)  # not a name this file system takes (e.g. too long in bytes)
    import yaml

    quoted = json.dumps(name, ensure_ascii=False)
    try:  # only names YAML can carry as a double-quoted string
        assume(yaml.safe_load(f"name: {quoted}") == {"name": name})
    except yaml.YAMLError:
        assume(False)
    write(skill / SKILL_FILE, f"---\nname: {quoted}\ndescription: d\n---\n".encode())
    try:
        assert check_skill_dir(skill) == name
    except SkillError:
        assert unsafe_name(name) is not None or name_findings(name)[0]
    else:
        assert unsafe_name(name) is None and not name_findings(name)[0]


# -- the config ----------------------------------------------------------------------------------

toml_scalars = (st.booleans() | st.integers() | st.floats() | any_text | st.datetimes()
                | st.dates() | st.times() | st.datetimes(timezones=st.timezones()))
toml_values = st.recursive(
    toml_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)
path_like = st.sampled_from([
    "venv", "skills/*", "skills/alpha", "*/..", "skills/*/..", "[", "~", "~nosuchuser/venv",
    "~nosuchuser/*", "a\x00b", "\ud800", "\udcff", "/proc/self/fd/0/x", "x" * 5000, "",
    " ", ".", "..", "/", "skills/[a-", "skills/**",
]) | any_text
KEYS = ("venv", "python", "requirements", "constraints", "uv-args", "skills", "ready-check",
        "snapshots")
config_values = (toml_values | path_like | st.lists(path_like | toml_scalars, max_size=4)
                 | st.builds(nested, st.integers(1, 200), path_like))
config_dicts = st.dictionaries(st.sampled_from(KEYS), config_values, max_size=8) | st.builds(
    lambda known, unknown: {**known, **unknown},
    st.dictionaries(st.sampled_from(KEYS), config_values, max_size=3),
    st.dictionaries(any_text, toml_values, min_size=1, max_size=2),
)


def expect_config_or_clean_error(call: Callable[[], Config]) -> None:
    try:
        config = call()
    except (ConfigError, SkillError) as e:
        message = str(e)
        assert message and len(message) < 20_000, "one readable message, not a dump"
        message.encode("utf-8", "backslashreplace")
        return
    assert isinstance(config, Config)
    for path in (config.venv, config.constraints, config.snapshots,
                 *(s.path for s in config.skills)):
        if isinstance(path, Path):  # not None, not a bucket URL
            os.fsencode(path)  # every path we return is one the OS can be given


@given(data=config_dicts)
@example(data={"venv": "~nosuchuser/venv"})
@example(data={"skills": ["*/.."]})
@example(data={"venv": "a\x00b"})
@example(data={"venv": "\ud800"})
@example(data={"uv-args": ["--x\x00"]})
@example(data={"skills": ["\ud800/*"]})
@example(data={"python": dt.date(2024, 1, 1)})
@example(data={"skills": ["x" * 5000]})
@example(data={"requirements": [math.nan]})
@example(data={"snapshots": "s3://fleet/\udcff"})
@example(data={"snapshots": "s3:///x"})
def test_any_config_values_give_a_config_or_a_clean_error(root: Path, data: dict[str, Any],
                                                          ) -> None:
    file = root / "cfg" / "kernel-bootstrap.toml"
    file.parent.mkdir(exist_ok=True)
    skills = file.parent / "skills" / "alpha"
    skills.mkdir(parents=True, exist_ok=True)
    (skills / SKILL_FILE).write_text("---\nname: alpha\n---\n")
    expect_config_or_clean_error(lambda: config_from_dict(data, file))


@given(key=st.sampled_from(KEYS), depth=st.integers(2, 20_000), as_dict=st.booleans())
@example(key="skills", depth=10_000, as_dict=False)
def test_deeply_nested_config_values_are_a_clean_error(root: Path, key: str, depth: int,
                                                       as_dict: bool) -> None:
    # Built here rather than drawn: hypothesis itself cannot print a value this deep.
    file = root / "kernel-bootstrap.toml"
    with pytest.raises(ConfigError, match=repr(key)):
        config_from_dict({key: nested(depth, "x", as_dict)}, file)


def toml_text(value: Any) -> str:
    """A TOML value's source text, for the subset our strategies produce (no recursion)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "nan" if value != value else ("inf" if value > 0 else "-inf") if math.isinf(
            value) else repr(value)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_text(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


config_files = (
    st.binary(max_size=300)
    | st.dictionaries(st.sampled_from(KEYS), toml_values | path_like, max_size=6).map(
        lambda d: "\n".join(f"{json.dumps(k)} = {toml_text(v)}" for k, v in d.items()).encode(
            "utf-8", "surrogatepass"))
    | st.integers(1, 100_000).map(lambda n: ("venv = " + "[" * n + "]" * n).encode())
    | st.integers(4000, 6000).map(lambda n: ("venv = 1" + "0" * n).encode())
)


@given(data=config_files)
@example(data=b"")
@example(data=b"venv = " + b"[" * 50_000)
@example(data=b"venv = 1" + b"0" * 5000)
@example(data=b'venv = "\\ud800"')
@example(data=b"venv = 1979-05-27")
def test_any_config_file_gives_a_config_or_a_config_error(root: Path, data: bytes) -> None:
    file = root / "files" / "kernel-bootstrap.toml"
    file.parent.mkdir(exist_ok=True)
    write(file, data)
    expect_config_or_clean_error(lambda: load_config(file))
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(ConfigError, match="not UTF-8"):
            load_config(file)

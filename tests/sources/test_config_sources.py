"""A `skills` entry that is a git source: what the config accepts and refuses (exit 2, named)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testing.world import World
from tests.sources.conftest import git_config, source


@pytest.mark.parametrize(("entry", "words"), [
    (source("https://example.com/x.git", branch="main", tag="v1"),
     ["skills[0]", "'branch' and 'tag'"]),
    ('{ git = "https://example.com/x.git", bogus = "1" }', ["skills[0]", "unknown key 'bogus'"]),
    ('{ git = "" }', ["skills[0]", "key 'git'"]),
    ('{ branch = "main" }', ["skills[0]", "key 'git'"]),
    (source("ext::sh -c touch% /tmp/pwned"), ["skills[0]", "ext:: transport is not allowed"]),
    (source("fd::0"), ["skills[0]", "fd:: transport is not allowed"]),
    (source("http://example.com/x.git"), ["skills[0]", "http:// transport is not allowed"]),
    (source("git@github.com:acme/x.git"), ["skills[0]", "not a URL", "scp-like"]),
    (source("-uhttps://x"), ["skills[0]", "looks like an option"]),
    (source("https://example.com/x.git", rev="abc123"), ["skills[0]", "key 'rev'", "40"]),
    (source("https://example.com/x.git", branch="--upload-pack=x"), ["skills[0]", "'branch'"]),
    (source("https://example.com/x.git", subdirectory="../up"), ["skills[0]", "subdirectory"]),
    ('{ git = "https://example.com/x.git", tag = 1 }', ["skills[0]", "key 'tag'", "string"]),
])
def test_a_bad_git_entry_is_a_config_error_naming_it_and_no_git_runs(
        world: World, git_log: Path, entry: str, words: list[str]) -> None:
    git_config(world, entry)
    result = world.run("ensure", env=dict(os.environ))
    assert result.returncode == 2, result.stderr
    for word in words:
        assert word in result.stderr
    assert "Traceback" not in result.stderr
    assert not git_log.exists(), git_log.read_text()
    assert world.uv_calls() == []


def test_the_index_named_is_the_entrys_own_among_local_entries(world: World, git_log: Path,
                                                                ) -> None:
    world.skill("local", python=False)
    git_config(world, '"skills/*"', '{ git = "https://example.com/x.git", rev = "1" }')
    result = world.run("ensure", env=dict(os.environ))
    assert result.returncode == 2
    assert "skills[1]" in result.stderr
    assert not git_log.exists()


def test_credentials_in_a_refused_url_are_not_printed(world: World) -> None:
    git_config(world, source("smb://user:hunter22@example.com/x.git"))
    result = world.run("ensure")
    assert result.returncode == 2
    assert "hunter22" not in result.stderr + result.stdout
    assert "smb://example.com/x.git" in result.stderr

"""``push --exec "ssh ..."`` against a real sshd on 127.0.0.1: quoting through a login shell,
and pushes from separate invocations into one DEST taking turns."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing import sshd
from testing.counting import Counted
from testing.skills import make_skill
from tests.trees.test_push import (
    SKILLS,
    assert_one_complete_version,
    no_staging_left,
    push_concurrently,
    run_cli,
    versions,
)
from tests.trees.test_pushrecord import skills, tree_of


@pytest.fixture(scope="module")
def ssh_prefix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An exec prefix logging in to a throwaway sshd as root; the sshd is stopped by its pid."""
    with sshd.running(tmp_path_factory.mktemp("sshd")) as server:
        yield shlex.join(server.login())


def test_push_over_ssh_into_a_dest_with_spaces_quotes_and_command_substitution(
        tmp_path: Path, ssh_prefix: str) -> None:
    src = make_skill(tmp_path / "src", "tool", {"bin/run": "#!/bin/sh\necho hi\n",
                                                "a b'c\".txt": "odd name"},
                     executables=["bin/run"])
    (src / "run").symlink_to("bin/run")
    pwned = tmp_path / "pwned"
    dest = tmp_path / f"agent skills 'q' \"dq\" $(touch {pwned}) `touch {pwned}`"

    assert run_cli(src, "--dest", dest, "--exec", ssh_prefix) == 0

    out = dest / "tool"
    assert (out / "a b'c\".txt").read_text() == "odd name"
    assert os.access(out / "bin/run", os.X_OK)
    assert os.readlink(out / "run") == "bin/run"
    assert not pwned.exists()
    no_staging_left(dest)


def test_concurrent_pushes_over_ssh_leave_one_complete_version(tmp_path: Path,
                                                               ssh_prefix: str) -> None:
    sources = versions(tmp_path, 4)
    dest = tmp_path / "dest 'x'"
    for _ in range(2):
        results = push_concurrently(sources, str(dest), ssh_prefix)
        assert [r.returncode for r in results] == [0] * 4, [r.stderr for r in results]
        assert sorted(p.name for p in dest.iterdir()) == SKILLS
        for name in SKILLS:
            assert_one_complete_version(dest / name, 4)
        no_staging_left(dest)


def test_an_unchanged_push_over_ssh_sends_no_file_contents(tmp_path: Path,
                                                           ssh_prefix: str) -> None:
    counted = Counted(tmp_path, tuple(shlex.split(ssh_prefix)))
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    calls, first = counted.push(sources, dest)
    assert calls == 1 and b"content-s1" in first
    calls, second = counted.push(sources, dest)
    assert calls == 1 and b"content-s" not in second and len(second) <= 10 * 1024
    (sources[2] / "f1.txt").write_text("changed\n")
    _, third = counted.push(sources, dest)
    assert b"changed\n" in third and b"content-s0" not in third and b"content-s1" not in third
    assert tree_of(dest) == tree_of(sources[0].parent)

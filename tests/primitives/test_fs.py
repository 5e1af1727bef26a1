"""bootstrap.primitives.fs: what its primitives do to files another process can see."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.primitives.fs import (
    NotRegularFile,
    is_real_dir,
    owner_pid,
    pid_alive,
    read_state_file,
    remove_tree,
    removed_on_exit,
    removed_on_failure,
    temp_name,
    write_all,
)

# --- read_state_file -------------------------------------------------------------------------


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "marker").write_bytes(b"x" * 70_000)
    assert read_state_file(tmp_path / "marker") == b"x" * 70_000


def test_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    (tmp_path / "victim").write_text("secret")
    (tmp_path / "marker").symlink_to(tmp_path / "victim")
    with pytest.raises(NotRegularFile, match="symbolic link"):
        read_state_file(tmp_path / "marker")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "marker")
    with pytest.raises(NotRegularFile, match="FIFO"):
        read_state_file(tmp_path / "marker")


def test_a_device_and_a_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(NotRegularFile, match="character device"):
        read_state_file(Path("/dev/zero"))
    with pytest.raises(NotRegularFile, match="directory"):
        read_state_file(tmp_path)


def test_a_file_over_the_cap_is_refused(tmp_path: Path) -> None:
    (tmp_path / "marker").write_bytes(b"x" * 101)
    assert read_state_file(tmp_path / "marker", limit=101) == b"x" * 101
    with pytest.raises(NotRegularFile, match="larger than 100 bytes"):
        read_state_file(tmp_path / "marker", limit=100)


def test_a_missing_file_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_state_file(tmp_path / "absent")


def test_is_real_dir_says_no_to_a_link_to_a_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    assert is_real_dir(tmp_path / "d")
    assert not is_real_dir(tmp_path / "link")
    assert not is_real_dir(tmp_path / "absent")


# --- writing and removing ----------------------------------------------------------------------


def test_write_all_finishes_a_short_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real(fd, bytes(data[:3])))
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        write_all(fd, b"0123456789")
    finally:
        os.close(fd)
    assert (tmp_path / "out").read_bytes() == b"0123456789"


def test_remove_tree_unlinks_links_and_never_walks_them(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "keep.txt").write_text("keep")
    tree = tmp_path / "tree"
    (tree / "ro").mkdir(parents=True)
    (tree / "ro" / "f").write_text("f")
    (tree / "ro").chmod(0o500)
    (tree / "to-dir").symlink_to(outside)
    (tree / "to-file").symlink_to(outside / "sub" / "keep.txt")
    remove_tree(tree)
    assert not tree.exists() and not tree.is_symlink()
    assert (outside / "sub" / "keep.txt").read_text() == "keep"
    remove_tree(tree)  # already gone: fine


def test_remove_tree_given_a_link_to_a_directory_removes_only_the_link(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("f")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    remove_tree(tmp_path / "link")
    assert not (tmp_path / "link").is_symlink()
    assert (tmp_path / "d" / "f").read_text() == "f"


def test_removed_on_failure_removes_on_interrupt_and_keeps_on_success(tmp_path: Path) -> None:
    staged = tmp_path / "stage"
    with pytest.raises(KeyboardInterrupt), removed_on_failure(staged):
        (staged / "half").mkdir(parents=True)
        raise KeyboardInterrupt
    assert not staged.exists()
    with removed_on_failure(staged):
        staged.mkdir()
    assert staged.is_dir()


def test_removed_on_exit_removes_however_the_block_ends(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    with removed_on_exit(scratch):
        scratch.mkdir()
    assert not scratch.exists()


# --- temp names and their owners --------------------------------------------------------------


def test_a_temp_name_is_a_hidden_sibling_naming_this_process(tmp_path: Path) -> None:
    one, two = temp_name(tmp_path / "venv", "stage"), temp_name(tmp_path / "venv", "stage")
    assert one != two and one.parent == tmp_path and one.name.startswith(".venv.stage-")
    assert owner_pid(one.name, "stage") == os.getpid()
    assert owner_pid(".venv.stage-x-1", "stage") is None
    assert owner_pid(".venv.other-12-ab", "stage") is None
    assert owner_pid(".venv.stage-0-ab", "stage") is None


def test_pid_alive_for_a_live_a_zombie_and_a_reaped_process() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(None) and not pid_alive(0) and not pid_alive(-1)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
    assert pid_alive(child.pid), "a zombie's leftovers may still be in use"
    child.wait()
    assert not pid_alive(child.pid)

"""Exact skill sets: ``publish --prune`` and ``push --prune`` remove what the tool put there
earlier and is no longer in the set, by its own record, one whole tree at a time."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from bootstrap.cli import main
from bootstrap.trees.publish import state_dir
from bootstrap.trees.push import push_sync
from testing.seams import Seam, seam_argv, seam_env
from testing.skills import make_skill
from tests.trees.test_targets import busybox_runtime, needs_busybox

FILES = {f"part{i % 5}/f{i:03}.txt": f"{i}\n" for i in range(300)}


def publish(capsys: pytest.CaptureFixture[str], root: Path, *sources: Path,
            prune: bool = True) -> tuple[int, dict[str, Any], str]:
    code = main(["publish", *map(str, sources), "--into", str(root), "--json",
                 *(["--prune"] if prune else [])])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out else {}, err


def names(record: str) -> list[str]:
    """The skills a push record names (its "*" line is the sum of the whole set)."""
    return [line.split()[0] for line in record.splitlines() if not line.startswith("* ")]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    for name in ("alpha", "beta", "gamma"):
        make_skill(tmp_path / "src", name)
    return tmp_path / "src"


def test_a_dropped_skill_is_removed_and_a_hand_made_one_kept(
        tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    publish(capsys, root, src / "alpha", src / "beta", src / "gamma", prune=False)
    make_skill(root, "by-hand")
    (root / "notes.txt").write_text("mine\n")
    code, out, err = publish(capsys, root, src / "alpha")
    assert code == 0 and out["removed"] == ["beta", "gamma"]
    assert sorted(os.listdir(root)) == ["alpha", "by-hand", "notes.txt"]
    assert f"kept {root / 'by-hand'}: not put there by kernel-bootstrap" in err
    assert (root / "by-hand" / "SKILL.md").is_file()
    # Again: nothing left to remove, the hand-made ones still there.
    code, out, _ = publish(capsys, root, src / "alpha")
    assert out["removed"] == [] and sorted(os.listdir(root)) == ["alpha", "by-hand", "notes.txt"]


def test_without_prune_nothing_is_removed(tmp_path: Path, src: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    publish(capsys, root, src / "alpha", src / "beta", prune=False)
    _, out, _ = publish(capsys, root, src / "alpha", prune=False)
    assert out["removed"] == [] and sorted(os.listdir(root)) == ["alpha", "beta"]


def test_a_published_tree_replaced_by_hand_is_no_longer_ours(
        tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    publish(capsys, root, src / "alpha", src / "beta", prune=False)
    os.rename(root / "beta", tmp_path / "old-beta")
    make_skill(root, "beta", {"mine.txt": "x"})  # a new directory: another inode
    _, out, err = publish(capsys, root, src / "alpha")
    assert out["removed"] == [] and (root / "beta" / "mine.txt").is_file()
    assert "replaced or changed since kernel-bootstrap published it" in err


def _record_at_inode(root: Path, name: str) -> None:
    """Point the record's entry for ``name`` at what ``ROOT/name`` is now: the state a
    filesystem that hands a freed inode back to the next ``mkdir`` leaves (ext4 and tmpfs
    often do, but not reliably enough to wait for in a test)."""
    record = state_dir(root.resolve()) / "published.json"
    data = json.loads(record.read_text())
    st = os.lstat(root / name)
    data["skills"][name][:2] = [st.st_dev, st.st_ino]
    record.write_text(json.dumps(data))


def test_a_directory_made_again_at_the_recorded_inode_is_kept(
        tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The incident: `rm -rf ROOT/beta; mkdir ROOT/beta` got the freed inode back, and the
    # next prune took the person's directory for the tree it had published.
    root = tmp_path / "root"
    publish(capsys, root, src / "alpha", src / "beta", prune=False)
    subprocess.run(["rm", "-rf", str(root / "beta")], check=True)
    (root / "beta").mkdir()
    (root / "beta" / "notes").write_text("mine\n")
    _record_at_inode(root, "beta")
    code, out, err = publish(capsys, root, src / "alpha")
    assert code == 0 and out["removed"] == []
    assert (root / "beta" / "notes").read_text() == "mine\n"
    assert f"kept {root / 'beta'}: replaced or changed since kernel-bootstrap published it" in err


@pytest.mark.parametrize("change", ["emptied-and-refilled", "file-edited", "file-added"])
def test_a_published_tree_changed_in_place_is_kept(
        tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str], change: str) -> None:
    # The same inode, with what a person put there: nothing that is not exactly what was
    # published is removed.
    root = tmp_path / "root"
    publish(capsys, root, src / "alpha", src / "beta", prune=False)
    beta = root / "beta"
    if change == "emptied-and-refilled":
        for child in beta.iterdir():
            child.unlink()
        (beta / "notes").write_text("mine\n")
    elif change == "file-edited":
        (beta / "SKILL.md").write_text((beta / "SKILL.md").read_text() + "my notes\n")
    else:
        (beta / "notes").write_text("mine\n")
    code, out, err = publish(capsys, root, src / "alpha")
    assert code == 0 and out["removed"] == [] and beta.is_dir()
    assert "replaced or changed since kernel-bootstrap published it" in err
    # No longer ours: dropped from the record, so a later prune keeps it too, silently mine.
    code, out, _ = publish(capsys, root, src / "alpha")
    assert out["removed"] == [] and beta.is_dir()
    record = json.loads((state_dir(root.resolve()) / "published.json").read_text())
    assert list(record["skills"]) == ["alpha"]


@pytest.mark.parametrize("change", ["unchanged", "edited", "no-hash-record"])
def test_a_record_written_before_it_held_hashes_still_prunes_only_unchanged_trees(
        tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str], change: str) -> None:
    # Schema 1 (name -> [dev, ino]): a tree gets the hash publish's hash record holds for it.
    root = tmp_path / "root"
    publish(capsys, root, src / "alpha", src / "beta", prune=False)
    state = state_dir(root.resolve())
    record = state / "published.json"
    skills = json.loads(record.read_text())["skills"]
    record.write_text(json.dumps({"schema": 1, "skills": {n: w[:2] for n, w in skills.items()}}))
    if change == "edited":
        (root / "beta" / "notes").write_text("mine\n")
    elif change == "no-hash-record":
        (state / "hashes" / "beta.json").unlink()
    code, out, _ = publish(capsys, root, src / "alpha")
    assert code == 0 and out["removed"] == (["beta"] if change == "unchanged" else [])
    assert (root / "beta").is_dir() == (change != "unchanged")
    assert json.loads(record.read_text()) == {"schema": 2, "skills": {"alpha": skills["alpha"]}}


@pytest.mark.parametrize("planted", ["symlink", "garbage", "wrong-types", "fifo"])
def test_an_untrustworthy_record_removes_nothing(
        tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str], planted: str) -> None:
    root = tmp_path / "root"
    publish(capsys, root, src / "alpha", src / "beta", prune=False)
    record = state_dir(root.resolve()) / "published.json"
    good = record.read_text()
    record.unlink()
    if planted == "symlink":
        (tmp_path / "elsewhere.json").write_text(good)
        record.symlink_to(tmp_path / "elsewhere.json")
    elif planted == "garbage":
        record.write_text("{not json")
    elif planted == "wrong-types":
        record.write_text(json.dumps({"schema": 1, "skills": {"beta": ["1", 2]}}))
    else:
        os.mkfifo(record)
    code, out, err = publish(capsys, root, src / "alpha")
    assert code == 0 and out["removed"] == [] and (root / "beta").is_dir()
    assert "record of published skills" in err


def _read_until(skill: Path, seen: list[int], stop: threading.Event) -> None:
    """Count the files of ``skill`` from a handle on its directory (0: not there), again and
    again until ``stop``."""
    while not stop.is_set():
        try:
            fd = os.open(skill, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            seen.append(0)
            continue
        try:
            seen.append(sum(len(files) for _, _, files, _ in os.fwalk(".", dir_fd=fd)))
        finally:
            os.close(fd)


def test_a_reader_never_sees_a_partial_tree_while_it_is_pruned(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A reader that opens the skill directory and walks it from that handle sees all of it
    or none: the prune is one rename (an rm -rf would show it a part)."""
    keep = make_skill(tmp_path / "src", "keep")
    root = tmp_path / "root"
    for round_ in range(5):
        big = make_skill(tmp_path / f"src{round_}", "big", FILES)
        publish(capsys, root, keep, big, prune=False)
        seen: list[int] = []
        stop = threading.Event()
        reader = threading.Thread(target=_read_until, args=(root / "big", seen, stop))
        reader.start()
        try:
            _, out, _ = publish(capsys, root, keep)
        finally:
            stop.set()
            reader.join()
        assert out["removed"] == ["big"]
        assert set(seen) <= {0, len(FILES) + 1}, sorted(set(seen))
        assert len(FILES) + 1 in seen or 0 in seen


def test_a_killed_prune_is_finished_by_the_next(tmp_path: Path, src: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    make_skill(src, "delta")
    publish(capsys, root, *(src / n for n in ("alpha", "beta", "gamma", "delta")), prune=False)
    # Killed as it renames its second tree out: one is gone, the record still names it.
    env = seam_env(dict(os.environ), Seam(call="rename", action="kill", match="retired",
                                          skip=1))
    killed = subprocess.run(seam_argv(["publish", str(src / "alpha"), "--into", str(root),
                                       "--prune"]), env=env, capture_output=True, text=True,
                            timeout=60, start_new_session=True, check=False)
    assert killed.returncode == -9, killed.stderr
    left = sorted(os.listdir(root))
    assert left[0] == "alpha" and len(left) == 3  # one of beta/gamma/delta went, whole
    for name in left:
        assert (root / name / "SKILL.md").is_file()
    code, out, _ = publish(capsys, root, src / "alpha")
    assert code == 0 and sorted(out["removed"]) == left[1:]
    assert os.listdir(root) == ["alpha"]
    record = json.loads((state_dir(root.resolve()) / "published.json").read_text())
    assert list(record["skills"]) == ["alpha"]


# -- push --prune ------------------------------------------------------------------------------


def test_push_prune_into_a_local_dir_and_through_exec(
        tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for runtime in ([], ["--exec", "env"]):
        dest = tmp_path / f"dest{len(runtime)}"
        assert main(["push", str(src / "alpha"), str(src / "beta"), "--dest", str(dest),
                     *runtime]) == 0
        make_skill(dest, "by-hand")
        capsys.readouterr()
        assert main(["push", str(src / "alpha"), "--dest", str(dest), "--prune", "--json",
                     *runtime]) == 0
        out, err = capsys.readouterr()
        (report,) = json.loads(out)["runtimes"]
        assert report["ok"] and report["removed"] == ["beta"]
        assert sorted(p for p in os.listdir(dest) if not p.startswith(".")) == [
            "alpha", "by-hand"]
        assert "by-hand" in err and "not put there by kernel-bootstrap" in err


def _change(tree: Path, how: str) -> None:
    """What a person or an agent in the sandbox does to a pushed tree."""
    if how == "replaced":
        subprocess.run(["rm", "-rf", str(tree)], check=True)
        tree.mkdir()
        (tree / "notes").write_text("mine\n")
    else:
        (tree / "notes").write_text("mine\n")


@pytest.mark.parametrize("how", ["edited", "replaced"])
@pytest.mark.parametrize("runtime", [[], ["--exec", "env"]], ids=["local", "exec"])
def test_push_prune_keeps_a_tree_changed_in_the_sandbox_since_the_push(
        tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str], runtime: list[str],
        how: str) -> None:
    dest = tmp_path / "dest"
    assert main(["push", str(src / "alpha"), str(src / "beta"), str(src / "gamma"),
                 "--dest", str(dest), *runtime]) == 0
    _change(dest / "beta", how)
    capsys.readouterr()
    assert main(["push", str(src / "alpha"), "--dest", str(dest), "--prune", "--json",
                 *runtime]) == 0
    out, err = capsys.readouterr()
    (report,) = json.loads(out)["runtimes"]
    assert report["ok"] and report["removed"] == ["gamma"]
    assert (dest / "beta" / "notes").read_text() == "mine\n"
    assert "beta" in err and "changed since kernel-bootstrap" in err
    # No longer ours: a later prune keeps it as well.
    assert main(["push", str(src / "alpha"), "--dest", str(dest), "--prune", "--json",
                 *runtime]) == 0
    (report,) = json.loads(capsys.readouterr()[0])["runtimes"]
    assert report["removed"] == [] and (dest / "beta" / "notes").is_file()


def test_exec_push_prune_reads_its_record_as_untrusted_text(
        tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "dest"
    assert main(["push", str(src / "alpha"), "--dest", str(dest), "--exec", "env"]) == 0
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "SKILL.md").write_text("precious\n")
    make_skill(dest, "by-hand")
    record = tmp_path / ".dest.kb-record"
    assert names(record.read_text()) == ["alpha"]
    record.write_text(record.read_text() + "../victim\n.hidden\nby hand\n/etc\n*\n")
    capsys.readouterr()
    assert main(["push", str(src / "alpha"), "--dest", str(dest), "--exec", "env", "--prune",
                 "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)["runtimes"]
    assert report["removed"] == []
    assert (tmp_path / "victim" / "SKILL.md").read_text() == "precious\n"
    assert (dest / "by-hand").is_dir()


def test_an_exec_record_naming_a_tree_already_gone_is_dropped(
        tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "dest"
    sources = [str(src / n) for n in ("alpha", "beta", "gamma")]
    assert main(["push", *sources, "--dest", str(dest), "--exec", "env"]) == 0
    record = tmp_path / ".dest.kb-record"
    before = record.read_text()
    # What a prune killed after its renames and before its record update leaves: a recorded
    # name whose tree is gone.
    os.rename(dest / "beta", tmp_path / "beta-gone")
    capsys.readouterr()
    assert main(["push", sources[0], "--dest", str(dest), "--exec", "env", "--prune",
                 "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)["runtimes"]
    assert names(before) == ["alpha", "beta", "gamma"]
    assert report["removed"] == ["gamma"] and os.listdir(dest) == ["alpha"]
    assert names(record.read_text()) == ["alpha"]


@needs_busybox
def test_exec_push_prune_under_busybox(tmp_path: Path, src: Path) -> None:
    runtime = busybox_runtime(tmp_path)
    dest = tmp_path / "dest"
    [first] = push_sync([src / "alpha", src / "beta", src / "gamma"], str(dest), [runtime])
    assert first.ok, first.error
    make_skill(dest, "by-hand")
    _change(dest / "gamma", "edited")
    [report] = push_sync([src / "alpha"], str(dest), [runtime], prune=True)
    assert report.ok, report.error
    assert report.removed == ("beta",)
    assert sorted(os.listdir(dest)) == ["alpha", "by-hand", "gamma"]
    record = (tmp_path / ".dest.kb-record").read_text()
    assert names(record) == ["alpha"]

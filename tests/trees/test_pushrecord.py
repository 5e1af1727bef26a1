"""A second push sends only what changed: the sandbox reports what it holds intact, in the same
exec call, and the tree it ends with is the one a full push would leave."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
from pathlib import Path

import pytest

from bootstrap.cli import main
from bootstrap.trees.push import push_sync
from bootstrap.trees.pushrecord import held
from bootstrap.trees.targets import ExecTarget
from testing.counting import Counted
from testing.skills import make_skill
from tests.trees.test_targets import busybox_runtime, needs_busybox

DIGEST = "sha256:" + "ab" * 32
RECORD_LIMIT = 1024 * 1024  # README: a record over 1 MiB is ignored


def skills(parent: Path) -> list[Path]:
    return [make_skill(parent, f"s{i}", {f"f{j}.txt": f"content-s{i}-f{j}\n" * 200
                                         for j in range(5)} | {"bin/run": "#!/bin/sh\n"},
                       executables=["bin/run"], symlinks={"link": "bin/run"})
            for i in range(3)]


def tree_of(root: Path) -> list[tuple[str, int, int, str]]:
    """Every entry under ``root``: path, mode, mtime (s), content or link target."""
    out = []
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        what = (os.readlink(path) if stat.S_ISLNK(st.st_mode)
                else path.read_text() if stat.S_ISREG(st.st_mode) else "")
        mode = 0 if stat.S_ISLNK(st.st_mode) else stat.S_IMODE(st.st_mode)
        out.append((str(path.relative_to(root)), mode, int(st.st_mtime), what))
    return out


@pytest.fixture
def counted(tmp_path: Path) -> Counted:
    return Counted(tmp_path)


def test_an_unchanged_second_push_sends_no_file_contents_in_one_call(
        tmp_path: Path, counted: Counted) -> None:
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    calls, first = counted.push(sources, dest)
    assert calls == 1 and b"content-s1-f3" in first
    calls, second = counted.push(sources, dest)
    assert calls == 1
    assert b"content-s" not in second and len(second) <= 10 * 1024 < len(first) // 2
    full = tmp_path / "full"  # what a full push into an empty DEST makes
    push_sync(sources, str(full), [ExecTarget(("env",))])
    assert tree_of(dest) == tree_of(full)


def test_one_changed_file_resends_that_skill_only(tmp_path: Path, counted: Counted) -> None:
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    (sources[1] / "f2.txt").write_text("changed\n")
    _, sent = counted.push(sources, dest)
    assert b"changed\n" in sent and b"content-s1-f0" in sent
    assert b"content-s0" not in sent and b"content-s2" not in sent
    assert (dest / "s1" / "f2.txt").read_text() == "changed\n"


def test_a_touched_file_or_a_new_mode_is_a_change(tmp_path: Path, counted: Counted) -> None:
    # A full push sets mtimes and modes: a tree differing in those is not "held".
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    os.utime(sources[0] / "f1.txt", (1_500_000_000, 1_500_000_000))
    (sources[2] / "f0.txt").chmod(0o600)
    _, sent = counted.push(sources, dest)
    assert b"content-s0" in sent and b"content-s2" in sent and b"content-s1" not in sent
    assert int((dest / "s0" / "f1.txt").stat().st_mtime) == 1_500_000_000
    assert stat.S_IMODE((dest / "s2" / "f0.txt").stat().st_mode) == 0o600


def test_a_tree_changed_inside_the_sandbox_is_sent_again(tmp_path: Path,
                                                          counted: Counted) -> None:
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    (dest / "s2" / "f4.txt").write_text("edited by an agent\n")
    (dest / "s0" / "extra.txt").write_text("left by an agent\n")
    _, sent = counted.push(sources, dest)
    assert b"content-s2" in sent and b"content-s0" in sent and b"content-s1" not in sent
    assert tree_of(dest / "s2") == tree_of(sources[2])
    assert not (dest / "s0" / "extra.txt").exists()


def test_what_the_record_does_not_vouch_for_is_sent(tmp_path: Path, counted: Counted) -> None:
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    record = tmp_path / ".dest.kb-record"
    lines = record.read_text().splitlines()
    assert sorted(line.split()[0] for line in lines) == ["*", "s0", "s1", "s2"]
    # Another digest for s0, and junk: s0 goes again.
    lines[0] = " ".join([lines[0].split()[0], DIGEST, lines[0].split()[2]])
    record.write_text("\n".join([*lines, "../x sha256:00 1.2", "s9"]) + "\n")
    _, sent = counted.push(sources, dest)
    assert b"content-s0" in sent and b"content-s1" not in sent and b"content-s2" not in sent
    # No sum of the whole set, and none for s1: each is checked alone, and s1 goes again.
    lines = [ln if not ln.startswith("s1 ") else " ".join(ln.split()[:2])
             for ln in record.read_text().splitlines() if not ln.startswith("* ")]
    record.write_text("\n".join(lines) + "\n")
    _, sent = counted.push(sources, dest)
    assert b"content-s1" in sent and b"content-s0" not in sent and b"content-s2" not in sent


def test_a_transport_that_holds_stdout_back_still_pushes_in_one_call(tmp_path: Path) -> None:
    # Its answer comes too late: everything is sent, in the same single call.
    hold = ("sh", "-c", 'out=$("$@"); printf "%s\\n" "$out"', "sh", "env")
    counted = Counted(tmp_path, hold)
    counted.runtime = ExecTarget(counted.runtime.argv, answer_timeout=0.5)
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    calls, sent = counted.push(sources, dest)
    assert calls == 1 and b"content-s1" in sent
    assert tree_of(dest / "s1") == tree_of(sources[1])


@needs_busybox
def test_an_unchanged_push_into_busybox_sends_nothing(tmp_path: Path) -> None:
    counted = Counted(tmp_path, busybox_runtime(tmp_path, extra=("md5sum",)).argv)
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    calls, sent = counted.push(sources, dest)
    assert calls == 1 and b"content-s" not in sent
    (sources[0] / "f0.txt").write_text("new\n")
    _, sent = counted.push(sources, dest)
    assert b"new\n" in sent and b"content-s1" not in sent


def host_tools(tmp_path: Path, *extra: str) -> tuple[str, ...]:
    """An exec prefix whose sandbox has only the host's own copies of the script's tools, and
    ``extra`` (BusyBox's sh finds its applets even off PATH, so it cannot stand in for a
    sandbox that lacks one)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("sh", "tar", "mkdir", "mv", "ln", "rm", "dirname", "basename", "printf",
                 "echo", "kill", "env", "cat", "sleep", *extra):
        found = shutil.which(tool)
        assert found is not None
        (tools / tool).symlink_to(found)
    return (str(tools / "env"), f"PATH={tools}")


@needs_busybox
def test_a_record_over_the_cap_is_not_read_by_busybox(tmp_path: Path) -> None:
    counted = Counted(tmp_path, busybox_runtime(tmp_path).argv)
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    record = tmp_path / ".dest.kb-record"
    record.write_bytes(record.read_bytes() + b"#" * RECORD_LIMIT + b"\n")
    _, sent = counted.push(sources, dest)
    assert b"content-s0" in sent and record.stat().st_size < 4096
    _, sent = counted.push(sources, dest)
    assert b"content-s" not in sent


def test_a_sandbox_without_a_checksum_tool_is_sent_everything_and_pruned_of_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    counted = Counted(tmp_path, host_tools(tmp_path, "dd"))
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    _, sent = counted.push(sources, dest)
    assert b"content-s2" in sent
    assert tree_of(dest) == tree_of(sources[0].parent)
    # Nothing tells whether s2 is still the tree pushed there: it stays.
    capsys.readouterr()
    assert main(["push", *map(str, sources[:2]), "--dest", str(dest), "--prune", "--json",
                 "--exec", shlex.join(counted.runtime.argv)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["runtimes"][0]["removed"] == [] and (dest / "s2").is_dir()
    assert "replaced or changed since kernel-bootstrap pushed it" in err


def test_a_sandbox_without_dd_is_sent_everything_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Without dd the record cannot be read with a bound: it is not read.
    counted = Counted(tmp_path, host_tools(tmp_path, "cksum"))
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    capsys.readouterr()
    assert main(["push", *map(str, sources), "--dest", str(dest), "--exec",
                 shlex.join(counted.runtime.argv)]) == 0
    sent = max(counted.stdin.iterdir(), key=lambda p: int(p.name)).read_bytes()
    assert b"content-s2" in sent
    assert "ignored the push record" in capsys.readouterr().err


def test_the_report_line_is_read_as_untrusted_text() -> None:
    token = "abcd1234"
    assert held(f"kb-push-held {token} s0={DIGEST} s1={DIGEST}", token) == {
        "s0": DIGEST, "s1": DIGEST}
    assert held(f"kb-push-held other s0={DIGEST}", token) == {}
    assert held(None, token) == {}
    assert held(f"kb-push-held {token} ../x={DIGEST} .h={DIGEST} s2=sha256:zz s3", token) == {}
    assert held(f"kb-push-held {token}", token) == {}


def test_a_smaller_set_is_checked_alone_once_then_as_a_whole_again(
        tmp_path: Path, counted: Counted) -> None:
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    record = tmp_path / ".dest.kb-record"
    whole = [ln for ln in record.read_text().splitlines() if ln.startswith("* ")]
    _, sent = counted.push(sources[:2], dest)  # the set's sum differs: each skill alone
    assert b"content-s" not in sent
    now = [ln for ln in record.read_text().splitlines() if ln.startswith("* ")]
    assert now != whole  # the sum of the new set, not the old one carried over
    _, sent = counted.push(sources[:2], dest)
    assert b"content-s" not in sent
    assert [ln for ln in record.read_text().splitlines() if ln.startswith("* ")] == now


@pytest.mark.parametrize("over", [0, 1], ids=["at-the-cap", "one-byte-over"])
def test_a_record_over_the_cap_is_not_read(tmp_path: Path, counted: Counted,
                                          capsys: pytest.CaptureFixture[str], over: int) -> None:
    # A 13 MB record took 16 s to read, a 127 MB one minutes: a record over the cap is not
    # read at all. Everything is sent, and --prune removes nothing it cannot vouch for.
    sources = skills(tmp_path / "src")
    dest = tmp_path / "dest"
    counted.push(sources, dest)
    record = tmp_path / ".dest.kb-record"
    padding = (b"#" * 63 + b"\n") * (RECORD_LIMIT // 64 + 1)
    record.write_bytes((record.read_bytes() + padding)[:RECORD_LIMIT + over - 1] + b"\n")
    assert record.stat().st_size == RECORD_LIMIT + over
    capsys.readouterr()
    assert main(["push", *map(str, sources[:2]), "--dest", str(dest), "--prune", "--json",
                 "--exec", shlex.join(counted.runtime.argv)]) == 0
    out, err = capsys.readouterr()
    (report,) = json.loads(out)["runtimes"]
    sent = max(counted.stdin.iterdir(), key=lambda p: int(p.name)).read_bytes()
    if over:
        assert b"content-s0" in sent and b"content-s1" in sent
        assert report["removed"] == [] and (dest / "s2").is_dir()
        assert "ignored the push record" in err and "larger than 1 MiB" in err
    else:
        assert b"content-s" not in sent
        assert report["removed"] == ["s2"] and not (dest / "s2").exists()
        assert "push record" not in err
    # The record is written anew, small again.
    assert record.stat().st_size < 4096

"""The directory swap and its journal, seen from disk: what is at the live path after a swap,
after a kill between its renames, and after recovery from a journal that someone forged."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypedDict, Unpack

import pytest

from bootstrap.primitives import log, swap
from bootstrap.primitives.fs import temp_name

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_log() -> Iterator[None]:
    # The CLI's log lines, on stderr, where these tests read the warnings (the default for a
    # test is library logging).
    log.configure()
    yield
    log.configure()


def tree(path: Path, tag: str) -> Path:
    path.mkdir(parents=True)
    (path / "tag").write_text(tag)
    return path


class SiteOptions(TypedDict, total=False):
    """What a test may change of :func:`site` (swap.Site's optional fields)."""

    retire: Callable[[Path], object]
    complete: Callable[[Path], bool]
    prefix: str
    finish_on_interrupt: bool
    unlocked: bool


def site(top: Path, **kw: Unpack[SiteOptions]) -> swap.Site:
    """Live trees in top/live, staging in top/staging, outgoing trees in top/aside."""
    for d in ("live", "staging", "aside"):
        (top / d).mkdir(exist_ok=True)
    base = swap.Site(live_dir=top / "live", staging_dir=top / "staging", aside_dir=top / "aside",
                     noun="the new tree", journal=lambda live: top / f"{live.name}.journal",
                     aside=lambda live: temp_name(top / "aside" / live.name, "old"))
    return dataclasses.replace(base, **kw)


def victim_state(victim: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for dirpath, dirs, files in os.walk(victim):
        for n in [".", *dirs, *files]:
            p = Path(dirpath) / n
            st = p.lstat()
            body = p.read_bytes() if stat.S_ISREG(st.st_mode) else b""
            out[str(p.relative_to(victim))] = (st.st_mode, body)
    return out


@pytest.fixture(params=["", "1"], ids=["exchange", "rename-aside"])
def no_exchange(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("KERNEL_BOOTSTRAP_NO_EXCHANGE", request.param)
    return str(request.param)


def test_a_swap_puts_the_new_tree_in_and_hands_the_old_one_to_retire(
    tmp_path: Path, no_exchange: str
) -> None:
    retired: list[str] = []
    s = site(tmp_path, retire=lambda p: retired.append(p.joinpath("tag").read_text()))
    live = tmp_path / "live" / "t"
    assert swap.swap_in(s, tree(tmp_path / "staging" / "a", "v1"), live) == "rename"
    method = swap.swap_in(s, tree(tmp_path / "staging" / "b", "v2"), live)
    on_linux = sys.platform.startswith("linux")
    assert method == ("rename-aside" if no_exchange or not on_linux else "exchange")
    assert (live / "tag").read_text() == "v2" and retired == ["v1"]
    assert os.listdir(tmp_path / "staging") == []
    assert not (tmp_path / "t.journal").exists()


_KILLED = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.primitives.test_swap import site
real = os.rename
def rename(src, dst):
    if "/staging/" in str(src):
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst)
os.rename = rename
top = Path(sys.argv[2])
from bootstrap.primitives import log, swap
swap.swap_in(site(top), top / "staging" / "new", top / "live" / "t")
"""


@pytest.mark.parametrize("staged", ["complete", "incomplete", "gone"])
def test_a_kill_between_the_renames_is_finished_or_rolled_back_by_recovery(
    tmp_path: Path, staged: str
) -> None:
    live = tree(tmp_path / "live" / "t", "old")
    tree(tmp_path / "staging" / "new", "new")
    child = subprocess.run([sys.executable, "-c", _KILLED, str(REPO), str(tmp_path)],
                           env={**os.environ, "KERNEL_BOOTSTRAP_NO_EXCHANGE": "1"},
                           capture_output=True, text=True, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert not live.exists() and (tmp_path / "t.journal").is_file()  # the window
    if staged == "incomplete":
        (tmp_path / "staging" / "new" / "tag").unlink()
    elif staged == "gone":
        (tmp_path / "staging" / "new" / "tag").unlink()
        (tmp_path / "staging" / "new").rmdir()
    done = swap.recover(site(tmp_path, complete=lambda p: (p / "tag").exists()), live)
    assert (live / "tag").read_text() == ("new" if staged == "complete" else "old")
    assert done is not None and done.startswith("finished" if staged == "complete" else
                                                 "rolled back")
    assert not (tmp_path / "t.journal").exists()


def forged(tmp_path: Path, entry: object) -> Path:
    journal = tmp_path / "t.journal"
    journal.write_text(json.dumps(entry))
    return journal


@pytest.mark.parametrize("name", ["absolute elsewhere", "dot-dot", "deep dot-dot", "too deep",
                                  "link on the way", "wrong prefix", "other live"])
def test_a_journal_naming_anything_outside_its_places_moves_nothing(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tree(tmp_path / "victim", "victim")
    (victim / "sub").mkdir()
    (victim / "sub" / "f").write_text("keep me")
    before = victim_state(victim)
    s = site(tmp_path, prefix="ok" if name == "wrong prefix" else "")
    value = {"absolute elsewhere": str(victim), "dot-dot": "../victim",
             "deep dot-dot": "x/../../victim", "too deep": "a/b/c",
             "link on the way": "planted/sub", "wrong prefix": "victim",
             "other live": "x"}[name]
    (tmp_path / "staging" / "planted").symlink_to(victim)  # a link planted in our own place
    entry = {"schema": 1, "live": "elsewhere" if name == "other live" else "t",
             "staged": value, "aside": value}
    journal = forged(tmp_path, entry)
    live = tmp_path / "live" / "t"
    swap.recover(s, live)
    assert victim_state(victim) == before and not live.exists()
    assert not journal.exists()
    assert str(journal) in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["symlink", "fifo", "garbage", "not a dict", "other schema"])
def test_a_journal_that_is_not_one_we_wrote_is_ignored_with_a_warning_naming_it(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    s = site(tmp_path)
    tree(tmp_path / "staging" / "new", "new")
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"schema": 1, "staged": "new", "aside": "old"}))
    journal = tmp_path / "t.journal"
    if kind == "symlink":
        journal.symlink_to(real)
    elif kind == "fifo":
        os.mkfifo(journal)  # reading it must not block
    else:
        journal.write_text({"garbage": "{", "not a dict": "[1]",
                            "other schema": '{"schema": 9, "staged": "new", "aside": "o"}'}[kind])
    swap.recover(s, tmp_path / "live" / "t")
    assert not (tmp_path / "live" / "t").exists()  # the staged tree was not moved in
    assert real.read_text().startswith("{")  # a linked journal is unlinked, its target kept
    assert not os.path.lexists(journal)
    assert str(journal) in capsys.readouterr().err


def test_a_journal_whose_writer_is_alive_is_left_to_it_where_no_lock_guards_the_swap(
    tmp_path: Path,
) -> None:
    tree(tmp_path / "staging" / "new", "new")
    journal = forged(tmp_path, {"schema": 1, "pid": os.getppid(), "staged": "new",
                                "aside": "old"})
    assert swap.recover(site(tmp_path, unlocked=True), tmp_path / "live" / "t") is None
    assert journal.exists() and not (tmp_path / "live" / "t").exists()
    swap.recover(site(tmp_path), tmp_path / "live" / "t")  # under a lock, the writer is gone
    assert (tmp_path / "live" / "t" / "tag").read_text() == "new"


def test_a_journal_written_with_absolute_paths_inside_its_places_is_still_recovered(
    tmp_path: Path,
) -> None:
    old = tree(tmp_path / "aside" / "old-1", "old")
    forged(tmp_path, {"aside": str(old), "staged": str(tmp_path / "staging" / "gone")})
    done = swap.recover(site(tmp_path), tmp_path / "live" / "t")
    assert done and done.startswith("rolled back")
    assert (tmp_path / "live" / "t" / "tag").read_text() == "old"

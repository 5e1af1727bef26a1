"""``status`` asks the live server what it serves; ``gc`` stops servers of generations that are
gone and removes the directories of dead ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap.kernels import info, places

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")

# A stand-in for a server: holds the lock, answers "info" with the generation it is given.
FAKE = textwrap.dedent("""\
    import fcntl, json, os, socket, sys, time
    sys.path.insert(0, sys.argv[3])
    from bootstrap.kernels import places
    dirfd = places.open_dir(sys.argv[1], create=True)
    lock = os.open("lock", os.O_RDWR | os.O_CREAT, 0o600, dir_fd=dirfd)
    fcntl.flock(lock, fcntl.LOCK_EX)
    s = socket.socket(socket.AF_UNIX)
    s.bind(places.sock_path(dirfd))
    s.listen()
    print("ready", flush=True)
    while True:
        conn, _ = s.accept()
        conn.recv(65536)
        conn.sendall(json.dumps({"pid": os.getpid(), "generation": sys.argv[2], "started": 1.0,
                                 "kernels_started": 3, "spares": 0}).encode() + b"\\n")
        conn.close()
""")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture
def fakes() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def fake_server(venv: Path, generation: Path, procs: list[subprocess.Popen[str]]) -> int:
    directory = places.server_dir(str(venv))
    assert directory is not None
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-c", FAKE, directory, str(generation), root],
                            stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc.pid


def test_describe_is_what_the_live_server_says_and_none_without_one(
        cache: Path, fakes: list[subprocess.Popen[str]]) -> None:
    venv = cache / "venv"
    assert info.describe(venv) is None
    pid = fake_server(venv, cache / "gen-1", fakes)
    assert info.describe(venv) == {"pid": pid, "generation": str(cache / "gen-1"),
                                   "started": 1.0, "kernels_started": 3, "spares": 0}


def test_gc_stops_a_server_of_a_generation_that_is_gone_and_only_that_one(
        cache: Path, fakes: list[subprocess.Popen[str]]) -> None:
    current = cache / ".v.gen-2"
    current.mkdir()
    (cache / "v").symlink_to(current.name)
    (cache / "old").symlink_to(current.name)
    live = fake_server(cache / "v", current, fakes)
    stale = fake_server(cache / "old", cache / ".old.gen-1", fakes)  # gone
    stopped = info.stop_stale()
    assert stopped == [{"pid": stale, "generation": str(cache / ".old.gen-1"),
                        "venv": str(cache / "old")}]
    assert fakes[1].wait(timeout=10) == -signal.SIGTERM
    assert fakes[0].poll() is None and info.describe(cache / "v")["pid"] == live  # type: ignore[index]


def test_gc_removes_the_directory_of_a_dead_server(cache: Path) -> None:
    directory = places.server_dir(str(cache / "v"))
    assert directory is not None
    os.close(places.open_dir(directory, create=True))
    for name in ("lock", "sock", "log"):
        Path(directory, name).write_text(json.dumps({}))
    assert info.stop_stale() == []
    assert not os.path.exists(directory)


# --- through checked directories only (issue 35) ---------------------------------------------

def dead_server(venv: Path) -> Path:
    """The directory a dead server left: its lock, socket and log."""
    directory = places.server_dir(str(venv))
    assert directory is not None
    os.close(places.open_dir(directory, create=True))
    for name in ("lock", "sock", "log"):
        Path(directory, name).write_text("")
    return Path(directory)


def test_gc_follows_no_symlink_in_kernels_and_removes_nothing_through_it(cache: Path) -> None:
    kernels = dead_server(cache / "v").parent
    victim = cache / "victim"
    victim.mkdir(mode=0o700)
    for name in ("lock", "sock", "log"):
        (victim / name).write_text("precious")
    (kernels / "%2Fevil").symlink_to(victim)
    assert info.stop_stale() == []
    assert sorted(p.name for p in victim.iterdir()) == ["lock", "log", "sock"]
    assert (kernels / "%2Fevil").is_symlink()
    assert not os.path.exists(str(places.server_dir(str(cache / "v"))))  # a real one: removed


def test_gc_leaves_a_directory_of_another_user_in_kernels_alone(cache: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    directory = dead_server(cache / "v")
    os.chown(directory, 65534, 65534)
    assert info.stop_stale() == []
    assert sorted(p.name for p in directory.iterdir()) == ["lock", "log", "sock"]


def test_gc_does_not_hang_on_a_fifo_at_a_dead_servers_lock_and_removes_it(cache: Path) -> None:
    directory = dead_server(cache / "v")
    (directory / "lock").unlink()
    os.mkfifo(directory / "lock", 0o600)
    root = str(Path(__file__).resolve().parents[2])
    code = (f"import sys; sys.path.insert(0, {root!r}); from bootstrap.kernels import info; "
            "print(info.stop_stale())")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, check=True, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        raise AssertionError("gc blocked on the FIFO") from None
    assert out.stdout == "[]\n"
    # Only this user can have put it in a 0700 directory of ours; left, it would refuse every
    # later server its lock.
    assert not directory.exists()


def test_a_symlink_at_a_servers_socket_reaches_no_other_server(
        cache: Path, fakes: list[subprocess.Popen[str]]) -> None:
    fake_server(cache / "other", cache / "gen-1", fakes)
    directory = dead_server(cache / "v")
    (directory / "sock").unlink()
    other = places.server_dir(str(cache / "other"))
    assert other is not None
    (directory / "sock").symlink_to(Path(other, "sock"))
    assert info.describe(cache / "other") is not None
    assert info.describe(cache / "v") is None


def test_a_cache_root_another_user_can_write_means_no_server_for_status_and_gc(
        cache: Path, fakes: list[subprocess.Popen[str]]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    fake_server(cache / "v", cache / "gen-1", fakes)  # a generation that is gone
    dead = dead_server(cache / "w")
    root = cache / "cache" / "kernel-bootstrap"
    os.chown(root, 65534, 65534)
    os.chmod(root, 0o777)
    assert info.describe(cache / "v") is None
    assert info.stop_stale() == []
    assert fakes[0].poll() is None and dead.exists()


def test_the_info_answer_s_later_fields_are_checked_when_present() -> None:
    base = {"pid": 7, "generation": "/g", "started": 1.5, "kernels_started": 2, "spares": 0}
    later = {"kernels": [11, 12], "detached": True, "serving": False, "not_serving": "a thread"}
    assert info._checked(base) == base  # a server of an earlier version
    assert info._checked({**base, **later}) == {**base, **later}
    for wrong in ({"kernels": [True]}, {"kernels": [0]}, {"kernels": "11"}, {"detached": 1},
                  {"serving": None}, {"not_serving": 3}):
        assert info._checked({**base, **later, **wrong}) is None, wrong

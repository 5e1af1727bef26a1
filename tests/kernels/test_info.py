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

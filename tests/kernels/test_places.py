"""The server's directory: one per venv under the cache dir, the user's and closed to others."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bootstrap.kernels import places


def test_each_venv_has_its_own_directory_under_the_cache_dir(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert places.server_dir("/a/b%c") == str(tmp_path / "cache" / "kernel-bootstrap" /
                                              "kernels" / "%2Fa%2Fb%25c")
    assert places.server_dir("/" + "x" * 300) is None


def test_the_directory_is_made_closed_to_others_and_a_symlink_or_an_open_one_is_refused(
        tmp_path: Path) -> None:
    made = tmp_path / "cache" / "kernels" / "v"
    fd = places.open_dir(str(made), create=True)
    os.close(fd)
    assert made.stat().st_mode & 0o777 == 0o700
    os.chmod(made, 0o755)
    with pytest.raises(PermissionError):
        places.open_dir(str(made), create=False)
    link = tmp_path / "link"
    link.symlink_to(made)
    with pytest.raises(OSError):
        places.open_dir(str(link), create=False)
    with pytest.raises(FileNotFoundError):
        places.open_dir(str(tmp_path / "missing"), create=False)


# --- trusted as the tool's other caches are (issue 35) ---------------------------------------

ROOT = str(Path(__file__).resolve().parents[2])
NOBODY = 65534


def _tampered(root: Path, how: str) -> None:
    """The cache root (or its kernels/) as another user could leave it."""
    kernels = root / "kernels"
    if how == "root another user's":
        os.chown(root, NOBODY, NOBODY)
    elif how == "root writable by all":
        os.chmod(root, 0o777)
    elif how == "root of another user, writable by all":
        os.chown(root, NOBODY, NOBODY)
        os.chmod(root, 0o777)
    elif how == "kernels/ writable by group":
        os.chmod(kernels, 0o770)
    elif how == "kernels/ a symlink":
        elsewhere = root.parent / "elsewhere"
        kernels.rename(elsewhere)
        kernels.symlink_to(elsewhere)
    else:  # the root a symlink to a directory of ours
        root.rename(root.parent / "real-root")
        root.symlink_to(root.parent / "real-root")


@pytest.mark.parametrize("how", ["root another user's", "root writable by all",
                                 "root of another user, writable by all",
                                 "kernels/ writable by group", "kernels/ a symlink",
                                 "root a symlink"])
def test_a_cache_root_or_kernels_dir_another_user_could_change_is_no_place_for_a_server(
        tmp_path: Path, how: str) -> None:
    if os.geteuid() != 0 and "another user" in how:
        pytest.skip("needs root to give a directory to another user")
    root = tmp_path / "cache"
    server = root / "kernels" / "v"
    os.close(places.open_dir(str(server), create=True))
    _tampered(root, how)
    # That user could rename server directories: none is opened, none is made.
    for create in (False, True):
        with pytest.raises(PermissionError):
            os.close(places.open_dir(str(server), create=create))


def _probe(code: str, *args: str) -> str:
    """``code`` run in a child with ``places`` imported, bounded: a blocking open fails it."""
    program = f"import os, sys; sys.path.insert(0, {ROOT!r})\n" + textwrap.dedent(code)
    try:
        out = subprocess.run([sys.executable, "-c", program, *args], capture_output=True,
                             text=True, timeout=30, check=True)
    except subprocess.TimeoutExpired:
        raise AssertionError("blocked on what was planted there") from None
    return out.stdout


def test_a_fifo_at_a_servers_lock_is_no_server_and_the_probe_returns(tmp_path: Path) -> None:
    server = tmp_path / "cache" / "kernels" / "v"
    os.close(places.open_dir(str(server), create=True))
    os.mkfifo(server / "lock", 0o600)
    answer = _probe("""\
        from bootstrap.kernels import places
        dirfd = places.open_dir(sys.argv[1], create=False)
        print(places.server_running("lock", dir_fd=dirfd))
        """, str(server))
    assert answer == "False\n"


def test_the_server_refuses_a_fifo_at_its_log_and_its_lock_at_once(tmp_path: Path) -> None:
    server = tmp_path / "cache" / "kernels" / "v"
    os.close(places.open_dir(str(server), create=True))
    os.mkfifo(server / "log", 0o600)
    os.mkfifo(server / "lock", 0o600)
    answer = _probe("""\
        from bootstrap.kernels import places, template
        out = os.dup(1)  # _to_log puts /dev/null on 0 and 1
        dirfd = places.open_dir(sys.argv[1], create=False)
        template._to_log(dirfd)
        os.write(out, b"logging to " + os.readlink("/proc/self/fd/2").encode() + b"\\n")
        try:
            template._lock(dirfd)
        except OSError as e:
            os.write(out, f"lock refused: {e.strerror}\\n".encode())
        """, str(server))
    # The log refused (stderr left as it was: not the FIFO), the lock refused: no server.
    assert "logging to" in answer and str(server / "log") not in answer
    assert "lock refused: is not a regular file of this user's" in answer


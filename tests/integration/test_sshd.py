"""``push --exec "ssh ..."`` against a real sshd on 127.0.0.1: quoting through a login shell,
and pushes from separate invocations into one DEST taking turns."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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

SSHD = Path("/usr/sbin/sshd")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def sshd_config(tmp: Path, port: int, client_key: Path) -> Path:
    config = tmp / "sshd_config"
    config.write_text("\n".join([
        "ListenAddress 127.0.0.1", f"Port {port}", f"HostKey {tmp / 'host_key'}",
        f"AuthorizedKeysFile {client_key}.pub", f"PidFile {tmp / 'sshd.pid'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "UsePAM no",
        "StrictModes no", "MaxStartups 20", "",
    ]))
    return config


def wait_for_login(prefix: list[str], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"sshd exited with {proc.returncode}: {log.read_text()[-500:]}")
        if subprocess.run([*prefix, "true"], capture_output=True, check=False).returncode == 0:
            return
        time.sleep(0.2)
    pytest.skip(f"could not log in to the test sshd: {log.read_text()[-500:]}")


@pytest.fixture(scope="module")
def ssh_prefix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An exec prefix logging in to a throwaway sshd as root; the sshd is stopped by its pid."""
    if not SSHD.exists() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed (apt-get install -y openssh-server)")
    if os.geteuid() != 0:
        pytest.skip("the test sshd logs in as root, which needs root")
    tmp = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / key)],
                       check=True)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
    port = free_port()
    log = tmp / "sshd.log"
    proc = subprocess.Popen([str(SSHD), "-D", "-f", str(sshd_config(tmp, port, tmp / "client_key")),
                             "-E", str(log)])
    prefix = ["ssh", "-T", "-F", "/dev/null", "-p", str(port), "-i", str(tmp / "client_key"),
              "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
              "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
              "-o", "LogLevel=ERROR", "root@127.0.0.1"]
    try:
        wait_for_login(prefix, proc, log)
        yield shlex.join(prefix)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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

"""A throwaway sshd on 127.0.0.1 for the tests that need a real one (push over ssh, git over
ssh): keys made for it, logging in as root, stopped by its pid. Skips the test (with the
reason) where openssh-server is missing, we are not root, or it does not come up."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testing.s3server import free_port  # the one free-port probe of the test kit

SSHD = Path("/usr/sbin/sshd")


@dataclass(frozen=True)
class Sshd:
    port: int
    client_key: Path

    def options(self) -> list[str]:
        """ssh's options to log in to it (no user config, no host key checks, no prompts)."""
        return ["-F", "/dev/null", "-i", str(self.client_key), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]

    def login(self) -> list[str]:
        """An ssh command line that runs its arguments on it as root."""
        return ["ssh", "-T", *self.options(), "-p", str(self.port), "root@127.0.0.1"]


@contextlib.contextmanager
def running(tmp: Path, extra_config: str = "") -> Iterator[Sshd]:
    """An sshd with its keys and config in ``tmp`` (``extra_config``: more sshd_config lines)."""
    if not SSHD.exists() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed (apt-get install -y openssh-server)")
    if os.geteuid() != 0:
        pytest.skip("the test sshd logs in as root, which needs root")
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / key)],
                       check=True)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
    server = Sshd(free_port(), tmp / "client_key")
    config = tmp / "sshd_config"
    config.write_text("\n".join([
        "ListenAddress 127.0.0.1", f"Port {server.port}", f"HostKey {tmp / 'host_key'}",
        f"AuthorizedKeysFile {server.client_key}.pub", f"PidFile {tmp / 'sshd.pid'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "UsePAM no",
        "StrictModes no", "MaxStartups 20", extra_config,
    ]) + "\n")
    log = tmp / "sshd.log"
    proc = subprocess.Popen([str(SSHD), "-D", "-f", str(config), "-E", str(log)])
    try:
        _wait_for_login(server, proc, log)
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _wait_for_login(server: Sshd, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"sshd exited with {proc.returncode}: {log.read_text()[-500:]}")
        if subprocess.run([*server.login(), "true"], capture_output=True,
                          check=False).returncode == 0:
            return
        time.sleep(0.2)
    pytest.skip(f"could not log in to the test sshd: {log.read_text()[-500:]}")

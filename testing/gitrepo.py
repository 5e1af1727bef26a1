"""Real git repositories for tests: made in a tmp dir, served by a real ``git daemon``.

:class:`Repo` makes commits, branches and tags in a non-bare repository that the daemon (or a
``file://`` URL) serves; each allows filtered fetches and fetching any object by id, as the
big hosts do (a stock ``git daemon`` repository refuses ``--filter``). :class:`Daemon` starts
``git daemon`` on 127.0.0.1 at a free port and stops it (and is stopped on test teardown by
the reaper anyway: it carries the test's tag in its environment).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from testing.s3server import free_port
from testing.skills import Package, make_skill

_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}


def git(*args: str | Path, cwd: Path | None = None) -> str:
    env = {**os.environ, **_ID, "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["git", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, f"git {args}: {done.stderr}"
    return done.stdout.strip()


class Repo:
    """A served repository at ``path`` (branch ``main``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True)
        git("init", "--quiet", "-b", "main", path)
        for key, value in (("uploadpack.allowFilter", "true"),
                           ("uploadpack.allowAnySHA1InWant", "true"),
                           ("core.symlinks", "true")):
            git("config", key, value, cwd=path)

    @property
    def file_url(self) -> str:
        return self.path.as_uri()

    def skill(self, name: str, under: str = "skills", *, python: bool = False,
              files: Mapping[str, str | bytes] | None = None,
              symlinks: Mapping[str, str] | None = None) -> Path:
        parent = self.path / under if under else self.path.parent
        package = Package(None, "0.1.0", (), False) if python else None
        return make_skill(parent, name, files, description=f"test skill {name}",
                          body=f"# {name}\n", package=package, symlinks=symlinks,
                          exist_ok=True)

    def write(self, rel: str, data: str | bytes) -> None:
        path = self.path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")

    def commit(self, message: str = "change") -> str:
        git("add", "-A", cwd=self.path)
        git("commit", "--quiet", "--allow-empty", "-m", message, cwd=self.path)
        return self.head()

    def head(self, ref: str = "HEAD") -> str:
        return git("rev-parse", ref, cwd=self.path)

    def tag(self, name: str, *, annotated: bool = True) -> None:
        git("tag", *(["-a", "-m", name] if annotated else []), name, cwd=self.path)

    def branch(self, name: str) -> None:
        git("branch", name, cwd=self.path)


class Daemon:
    """``git daemon`` serving every repository under ``base`` at ``git://127.0.0.1:PORT/``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", f"--base-path={self.base}", "--export-all",
             "--informative-errors", "--listen=127.0.0.1", f"--port={self.port}", str(self.base)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                assert self.proc.poll() is None, "git daemon exited at start"
                time.sleep(0.05)
        raise AssertionError("git daemon did not listen")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


@contextmanager
def daemon(base: Path) -> Iterator[Daemon]:
    served = Daemon(base)
    served.start()
    try:
        yield served
    finally:
        served.stop()

"""How git reaches a source (issue 37): an https URL's credentials never reach a command line,
an environment or the cache; a server that stalls ends as that source's failure, ended by
git's own limit set from `git-timeout` or by the watchdog; another user's file:// repository
is refused with how to allow it, and allowed that way; ssh against a real sshd."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing import dripserver, processes, reaper
from testing.gitrepo import Repo
from testing.httpgit import certificate, https_git, silent_server
from testing.world import World
from tests.sources.conftest import cache_root, git_config, source

SECRET = "hunter2-s3cr3t"


def _ensure(world: World, *args: str, env: dict[str, str] | None = None,
            ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    result = world.run("ensure", "--json", *args, env={**os.environ, **(env or {})})
    data: dict[str, Any] = json.loads(result.stdout) if result.stdout.strip() else {}
    return result, data


@contextlib.contextmanager
def _seen_processes() -> Iterator[set[bytes]]:
    """The command line and environment (as /proc gives them) of every process of this test
    seen while the block runs."""
    tag = f"{reaper.TAG}={os.environ[reaper.TAG]}".encode()
    seen: set[bytes] = set()

    def look() -> str:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            with contextlib.suppress(OSError):  # it ended while we looked
                environ = Path(f"/proc/{entry}/environ").read_bytes()
                if tag in environ.split(b"\0"):
                    seen.add(Path(f"/proc/{entry}/cmdline").read_bytes() + b"\n" + environ)
        return ""

    with processes.sampling(look):
        yield seen


def _names(world: World) -> list[str]:
    return sorted(s["name"] for s in world.status()["skills"] if s["state"] == "installed")


def _files_holding(root: Path, secret: bytes, *, but: Path | None = None) -> list[Path]:
    return [p for p in root.rglob("*")
            if p.is_file() and not p.is_symlink() and p != but and secret in p.read_bytes()]


def _left_running(port: int) -> list[tuple[int, str]]:
    return [p for p in reaper.tagged(os.environ[reaper.TAG]) if str(port) in p[1]]


def test_https_credentials_reach_git_from_memory_never_argv_env_or_the_cache(
        world: World, repo: Repo, tmp_path: Path) -> None:
    # Each answer waits: git and git-remote-https live long enough for /proc to be read.
    with https_git(tmp_path / "served", tmp_path, auth=("user", SECRET), delay=0.3) as served:
        url = served.url("skills").replace("https://", f"https://user:{SECRET}@")
        git_config(world, source(url, subdirectory="skills/docx"))
        with _seen_processes() as seen:
            result, data = _ensure(world, "--strict", env={"GIT_SSL_CAINFO": str(served.cainfo)})
        status = world.run("status", "--json")
    assert result.returncode == 0, result.stderr
    assert data["failed"] == [] and _names(world) == ["docx"]
    assert any(ok for _, ok in served.requests)  # the server was given the credentials
    assert any(b"git-remote-https" in p for p in seen)  # git's own child was seen running
    assert [p for p in seen if SECRET.encode() in p] == []
    assert _files_holding(cache_root(world).parent, SECRET.encode()) == []
    assert _files_holding(world.root, SECRET.encode(), but=world.config) == []
    assert SECRET not in result.stdout + result.stderr + status.stdout + status.stderr
    [config] = (cache_root(world) / "repos").glob("*/config")
    assert f"url = {served.url('skills')}\n" in config.read_text()


def test_the_credential_helper_answers_its_urls_host_and_no_other(
        repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bootstrap.sources import git
    from bootstrap.sources.spec import GitSource

    # In this process, where the pipe's descriptor number is well above 9.
    with https_git(tmp_path / "served", tmp_path, auth=("user", SECRET)) as served:
        monkeypatch.setenv("GIT_SSL_CAINFO", str(served.cainfo))
        own = GitSource(0, f"https://user:{SECRET}@127.0.0.1:{served.port}/skills")
        assert "refs/heads/main" in git.run(["ls-remote", own.git_url], source=own).stdout
        answered = len(served.requests)
        # The credentials are for another host than the one git is sent to (a redirect).
        other = GitSource(0, f"https://user:{SECRET}@localhost:{served.port}/skills")
        with pytest.raises(git.GitError) as failed:
            git.run(["ls-remote", served.url("skills")], source=other)
    assert any(ok for _, ok in served.requests[:answered])
    assert not any(ok for _, ok in served.requests[answered:])
    assert SECRET not in str(failed.value)


@pytest.mark.parametrize("scheme", ["git", "https"])
def test_a_server_that_accepts_and_never_answers_is_stopped_by_the_watchdog(
        world: World, scheme: str) -> None:
    with silent_server() as port:
        git_config(world, source(f"{scheme}://127.0.0.1:{port}/skills",
                                 subdirectory="skills/docx"), extra="git-timeout = 1\n")
        result, data = _ensure(world, "--strict")
        left = _left_running(port)
    assert result.returncode == 3, result.stderr
    [failure] = data["failed"]
    # git:// has no limit of its own, https none while the TLS handshake waits: the watchdog
    # (at twice the limit where git has one of its own) ended it, and git's children with it.
    assert f"no output for {1 if scheme == 'git' else 2} s: stopped as stalled" \
        in failure["error"]
    assert "stalled (`git-timeout` = 1 s; raise it for a slow link)" in failure["error"]
    assert left == []


def test_an_https_server_that_stalls_mid_answer_meets_gits_own_limit(
        world: World, tmp_path: Path) -> None:
    cert, key = certificate(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    # Headers and 10 bytes of the ref advertisement, then nothing.
    drip = dripserver.Drip(b"0" * 100_000, {}, piece=10, interval=0.0, stall_after=10)
    with dripserver.serving(drip, context) as base:
        git_config(world, source(f"{base}/skills", subdirectory="skills/docx"),
                   extra="git-timeout = 2\n")
        result, data = _ensure(world, "--strict", env={"GIT_SSL_CAINFO": str(cert)})
    assert result.returncode == 3, result.stderr
    [failure] = data["failed"]
    # curl's low-speed limit, with the configured seconds: the setting reached git.
    assert "Less than 1000 bytes/sec transferred the last 2 seconds" in failure["error"]
    assert "stopped as stalled" not in failure["error"]
    assert "stalled (`git-timeout` = 2 s" in failure["error"]


@pytest.mark.parametrize("own", [None, "ssh -F /dev/null -o UserKnownHostsFile=/dev/null"])
def test_ssh_to_a_server_that_never_answers_meets_ssh_connect_timeout(
        world: World, own: str | None) -> None:
    if shutil.which("ssh") is None:
        pytest.skip("no ssh client (apt-get install -y openssh-client)")
    env = {"GIT_SSH_COMMAND": own} if own else {}
    with silent_server() as port:
        git_config(world, source(f"ssh://git@127.0.0.1:{port}/skills",
                                 subdirectory="skills/docx"), extra="git-timeout = 1\n")
        result, data = _ensure(world, "--strict", env=env)
    assert result.returncode == 3, result.stderr
    [failure] = data["failed"]
    # ssh's ConnectTimeout ended it (a user's own ssh command gets it too), not the watchdog.
    assert "Connection timed out during banner exchange" in failure["error"]
    assert "stopped as stalled" not in failure["error"]
    assert "stalled (`git-timeout` = 1 s" in failure["error"]


@pytest.mark.parametrize(("extra", "words"), [
    ("git-timeout = 0\n", "key 'git-timeout' must be a number of seconds greater than 0"),
    ('git-timeout = "15"\n', "key 'git-timeout' must be a number of seconds greater than 0"),
    ("git-timeout = true\n", "key 'git-timeout' must be a number of seconds greater than 0"),
    ("git-timeout = nan\n", "key 'git-timeout' must be a number of seconds greater than 0"),
    ('git-safe-directories = ["srv/x"]\n', "git-safe-directories[0]: not an absolute path"),
    ('git-safe-directories = "/srv/x"\n', "key 'git-safe-directories' must be a list"),
])
def test_a_bad_transport_key_is_a_config_error_naming_it(
        world: World, extra: str, words: str) -> None:
    git_config(world, source("https://example.com/x.git"), extra=extra)
    result = world.run("ensure", env=dict(os.environ))
    assert result.returncode == 2, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr


def test_another_users_file_repository_is_refused_saying_how_to_allow_it(
        world: World, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chowning a repository to another user needs root")
    theirs = Repo(tmp_path / "theirs" / "tools")
    theirs.skill("docx")
    theirs.commit("first")
    shutil.chown(theirs.path, 65534)
    for path in theirs.path.rglob("*"):
        os.chown(path, 65534, -1, follow_symlinks=False)
    entry = source(theirs.file_url, subdirectory="skills/docx")
    git_config(world, entry)
    result, data = _ensure(world, "--strict")
    assert result.returncode == 3, result.stderr
    [failure] = data["failed"]
    assert "(uid 65534)" in failure["error"]
    assert f'add "{theirs.path}" to `git-safe-directories`' in failure["error"]
    assert "ignores your git configuration" in failure["error"]
    assert "git config --global" not in failure["error"]  # git's advice, which does nothing here
    git_config(world, entry, extra=f'git-safe-directories = ["{theirs.path}"]\n')
    result, data = _ensure(world, "--strict")
    assert result.returncode == 0, result.stderr
    assert data["failed"] == [] and _names(world) == ["docx"]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """A throwaway sshd on 127.0.0.1 (stopped by its pid): its port and the ssh command that
    logs in to it as root."""
    from testing import sshd as test_sshd

    # protocol v2, as git hosts speak it
    with test_sshd.running(tmp_path_factory.mktemp("sshd"), "AcceptEnv GIT_PROTOCOL") as server:
        yield server.port, shlex.join(["ssh", *server.options()])


def test_a_skill_from_a_real_sshd(world: World, repo: Repo, sshd: tuple[int, str]) -> None:
    port, command = sshd
    url = f"ssh://root@127.0.0.1:{port}{repo.path}"
    git_config(world, source(url, subdirectory="skills/docx"), extra="git-timeout = 5\n")
    result, data = _ensure(world, "--strict", env={"GIT_SSH_COMMAND": command})
    assert result.returncode == 0, result.stderr
    assert data["failed"] == [] and _names(world) == ["docx"]
    lock = (world.root / "skills-lock.toml").read_text()
    assert f'git = "ssh://127.0.0.1:{port}{repo.path}"' in lock
    [config] = (cache_root(world) / "repos").glob("*/config")
    assert f"url = {url}\n" in config.read_text()  # ssh needs the user; it is no secret

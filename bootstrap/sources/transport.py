"""How git reaches a source's server: credentials never on a command line or on disk, and no
wait without end. :func:`bootstrap.sources.git.run` applies it to every call given a source.

**Credentials.** git is given :attr:`GitSource.git_url` (no ``user:password@``): a URL is in
every git process's command line (``git ls-remote URL``, ``git-remote-https origin URL``),
which any local user reads in ``ps``, and in the cache repository's config. An https URL's user
and password reach git through a credential helper fed from memory: a pipe we fill and close
before git starts, inherited by git and its children, which the one-line helper reads when git
asks (``get``). Not ``GIT_ASKPASS``: it is asked for the user and the password apart, by
prompt text, and for ssh passphrases too; and not an environment variable, which every program
git starts would inherit and which ``/proc/PID/environ`` shows for as long as it runs: the pipe
is read once and then holds nothing. The helper is scoped to the URL's scheme, host and port
(``credential.https://HOST:PORT.helper``): a redirect to another host is not given the secret.

**Time.** A server that accepts and never answers used to hold a kernel start for 300 s
(https: curl's connect timeout covers the TLS handshake, its low-speed limit does not) or
900 s (``git://``, which has no limit at all). Each transport's own limit is set to the
source's ``timeout`` (the config's ``git-timeout``): ``http.lowSpeedLimit``/``lowSpeedTime``,
and ssh's ``ConnectTimeout`` (TCP and the banner) and ``ServerAliveInterval``. Behind them, a
watchdog stops git when it has printed nothing for that long (fetches run with
``--progress``, which prints at least once a second while bytes arrive): at ``timeout`` for
``git://`` and ``file://``; for https and ssh up to 5 s later, so that their own limits, with
clearer messages, end a stall first where they can (by default: 15 s, and 20 s for a TLS
handshake that never ends).

**Another user's repository** (``file://``): git reads it only if it is a ``safe.directory``,
which it takes from protected configuration alone, and git's local transport does not pass
``-c`` options on to the ``upload-pack`` it starts: so the listed directories are given on
upload-pack's own command line (``--upload-pack``).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

from bootstrap.errors import BootstrapError
from bootstrap.primitives import process
from bootstrap.sources.spec import GitSource

# Bytes a second below which https counts as stalled (git's own default is none).
LOW_SPEED: Final = 1000
# Messages of a stall: the watchdog's, curl's low-speed limit, ssh's ConnectTimeout and
# ServerAliveInterval.
_STALLED: Final = ("stopped as stalled", "Operation too slow", "during banner exchange",
                   "Connection timed out", "not responding")
_DUBIOUS: Final = re.compile(r"detected dubious ownership in repository at '([^'\n]*)'")
# How much later than git's own limits the watchdog acts, at most (seconds).
_GRACE: Final = 5.0
# A pipe holds 16 KiB at least (macOS; Linux 64 KiB): written whole before git starts.
_MAX_SECRET: Final = 16 * 1024
# Subcommands that talk to a server and take --upload-pack.
_UPLOAD_PACK_USERS: Final = ("fetch", "ls-remote")


@dataclass(frozen=True)
class Reach:
    """What one git call that talks to a server gets: ``-c`` options, environment, the
    watchdog's limit (seconds of silence)."""

    options: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    idle: float | None = None


@contextlib.contextmanager
def reaching(source: GitSource | None) -> Iterator[Reach]:
    """The :class:`Reach` of one call to ``source``'s server (nothing for a local call, None);
    the credentials' pipe is open while the block runs."""
    if source is None:
        yield Reach()
        return
    seconds = math.ceil(source.timeout)
    options = ["-c", f"http.lowSpeedLimit={LOW_SPEED}", "-c", f"http.lowSpeedTime={seconds}"]
    ssh = ssh_command(source.timeout) if source.scheme == "ssh" else None
    env = {"GIT_SSH_COMMAND": ssh} if ssh is not None else {}
    # Later where git has limits of its own: theirs say more (curl's, ssh's).
    later = min(source.timeout, _GRACE) if source.scheme in ("https", "ssh") else 0.0
    idle = source.timeout + later
    with _credentials(source) as helper:
        yield Reach(options + helper, env, idle)


def ssh_command(timeout: float) -> str | None:
    """ssh with a connect limit and a keep-alive that notices a dead server in ``timeout``; a
    user's own ``GIT_SSH_COMMAND`` that runs ssh gets the options too (ssh takes the first
    value of each, so those the user gave win); another program, or ``GIT_SSH``, is left as
    it is (None: nothing to set)."""
    seconds = math.ceil(timeout)
    limits = (f"-o ConnectTimeout={seconds} -o ServerAliveInterval={max(1, seconds // 3)} "
              "-o ServerAliveCountMax=3")
    own = os.environ.get("GIT_SSH_COMMAND", "")
    if not own and not os.environ.get("GIT_SSH"):
        return f"ssh -o BatchMode=yes {limits}"
    try:
        words = shlex.split(own)
    except ValueError:  # unbalanced quotes: git will say what it makes of it
        return None
    if words and os.path.basename(words[0]) == "ssh":
        return f"{own} {limits}"
    return None


@contextlib.contextmanager
def _credentials(source: GitSource) -> Iterator[list[str]]:
    """``-c`` options naming a helper that reads ``source``'s credentials from an inherited
    pipe, open while the block runs; none when the URL has none."""
    found = source.credentials
    if found is None:
        yield []
        return
    user, password = found
    text = f"username={user}\n" + (f"password={password}\n" if password is not None else "")
    if any(c in (user + (password or "")) for c in "\n\0"):
        raise BootstrapError(f"{source.display_url}: the credentials in its URL hold a line "
                             "break or a NUL, which git cannot take")
    data = text.encode("utf-8")
    if len(data) > _MAX_SECRET:
        raise BootstrapError(f"{source.display_url}: the credentials in its URL are longer "
                             f"than {_MAX_SECRET} bytes")
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)  # git reads to the end: the data, then EOF
    try:
        with process.inherited(read) as fd:
            scope = source.git_url.split("/", 3)[:3]  # scheme://host:port
            # /dev/fd/N, not <&N: sh (dash) takes no descriptor above 9 in a redirection.
            helper = f'!f() {{ test "$1" != get || cat /dev/fd/{fd}; }}; f'
            yield ["-c", f"credential.{'/'.join(scope)}.helper={helper}"]
    finally:
        os.close(read)


def with_upload_pack(args: Sequence[str], source: GitSource) -> list[str]:
    """``args`` with ``--upload-pack`` trusting ``source``'s listed safe directories, for a
    ``file://`` source that has some (each as listed and as its ``.git``: git names the
    repository by its git directory)."""
    out = list(args)
    where = next((i for i, a in enumerate(out) if a in _UPLOAD_PACK_USERS), None)
    if source.scheme != "file" or not source.safe_directories or where is None:
        return out
    trusted = []
    for directory in source.safe_directories:
        for path in (directory, f"{directory.rstrip('/')}/.git"):
            trusted += ["-c", f"safe.directory={path}"]
    out.insert(where + 1, f"--upload-pack={shlex.join(['git', *trusted, 'upload-pack'])}")
    return out


def explain(source: GitSource, stderr: str) -> str:
    """What the user can do about a failure to reach ``source`` (empty: nothing we know)."""
    dubious = _DUBIOUS.search(stderr)
    if dubious is not None and source.scheme == "file":
        return _another_users(source, dubious.group(1))
    if any(words in stderr for words in _STALLED):
        return (f"{source.display_url} stalled (`git-timeout` = {source.timeout:g} s; raise "
                "it for a slow link)")
    return ""


def _another_users(source: GitSource, gitdir: str) -> str:
    path = gitdir[:-len("/.git")] if gitdir.endswith("/.git") else gitdir
    return (f"{source.display_url}: the repository {path} belongs to {_owner(gitdir)}, and git "
            "reads another user's repository only if told it is safe: if you trust its owner, "
            f'add "{path}" to `git-safe-directories` in the config (git\'s own '
            "`safe.directory` is not read: kernel-bootstrap ignores your git configuration)")


def _owner(path: str) -> str:
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return "another user"
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"

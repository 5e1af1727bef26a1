"""The one way git is run: hardened, through the project's one child-process primitive.

A repository we fetch is someone else's: nothing in it, in the user's git configuration or in
an inherited ``GIT_*`` variable may make git run a program or write outside the cache. So:

- the environment drops every ``GIT_*`` variable but those that say how to reach a server
  (ssh's command, TLS roots), and sets ``GIT_CONFIG_NOSYSTEM`` / ``GIT_CONFIG_GLOBAL=/dev/null``
  (no system or user configuration: no credential helper, no ``url.insteadOf`` rewriting a
  checked URL into ``ext::``), ``GIT_ALLOW_PROTOCOL`` (the transports spec.py allows; ``file``
  only for a configured file:// source; none at all offline, so an unexpected lazy fetch fails
  at once instead of reaching the network), ``GIT_TERMINAL_PROMPT=0`` (a password prompt
  would hang a kernel start) and ``GIT_LFS_SKIP_SMUDGE=1``;
- ``-c`` overrides turn off hooks, submodules and fsmonitor, whatever a repository's own
  configuration says (we never check out a work tree, but git reads them on some commands);
- a credential in a URL never reaches git's command line, the cache or a message: git is
  given the URL without it and the credential through a helper fed from memory
  (:mod:`bootstrap.sources.transport`, which also bounds the time a call to a server may
  stall), and git's stderr and the command line in an error are scrubbed
  (:func:`bootstrap.sources.spec.scrub`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Final

from bootstrap.errors import ProcessError
from bootstrap.primitives import process
from bootstrap.sources import transport
from bootstrap.sources.spec import SCHEMES, GitSource, scrub
from bootstrap.sources.spec import TIMEOUT as STALL

# Inherited variables a user sets to reach a server (keys, proxies, a private CA): kept.
_KEPT: Final = ("GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_SSL_CAINFO",
                "GIT_SSL_CAPATH", "GIT_PROXY_COMMAND")
# No git call, local or not, may take longer (a call to a server is also stopped when it
# stalls: transport.py).
TIMEOUT: Final = 900.0
# Lines left out of an error's stderr: what `--progress` prints (fetches print it: the stall
# watchdog's sign of life), "Receiving objects:  45% (9/20)", "remote: Counting objects: 3,
# done."; and git's advice to trust a repository in the user's git config, which we ignore
# (transport.explain says what works).
_DROPPED: Final = re.compile(r"^(remote: )?[A-Z][a-z]+( [a-z]+)*: +\d+(% \(\d+/\d+\))?"
                             r"|^To add an exception for this directory, call:"
                             r"|^\s*git config --global --add safe\.directory ")


class GitError(ProcessError):
    """git failed; command and stderr already scrubbed of credentials."""


def env(*, allow_file: bool, offline: bool) -> dict[str, str]:
    """The child environment for git (see the module docstring for each variable)."""
    base = process.child_env()
    clean = {k: v for k, v in base.items() if not k.startswith("GIT_") or k in _KEPT}
    allowed = [s for s in SCHEMES if s != "file" or allow_file]
    clean.update({
        # "none" is no protocol's name: offline, every transport is refused.
        "GIT_ALLOW_PROTOCOL": "none" if offline else ":".join(allowed),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_LFS_SKIP_SMUDGE": "1",
        "GIT_ASKPASS": "",
        "SSH_ASKPASS": "",
        # ssh must not prompt either (a host key question would wait for ever).
        "GIT_SSH_VARIANT": clean.get("GIT_SSH_VARIANT", "auto"),
    })
    if "GIT_SSH_COMMAND" not in clean and "GIT_SSH" not in clean:
        clean["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes"
    return clean


def overrides(*, allow_file: bool) -> list[str]:
    """``-c`` options that win over anything a repository's own config says."""
    pairs = {
        "core.hooksPath": os.devnull,
        "core.fsmonitor": "false",
        "core.symlinks": "true",
        "submodule.recurse": "false",
        "fetch.recurseSubmodules": "false",
        "protocol.file.allow": "always" if allow_file else "never",
        "protocol.ext.allow": "never",
        "protocol.version": "2",  # fetching a commit or blobs by id needs v2's rules
        "credential.helper": "",
        # transport.reaching sets the source's own; these hold for any other call
        "http.lowSpeedLimit": str(transport.LOW_SPEED),
        "http.lowSpeedTime": f"{STALL:.0f}",
        "gc.auto": "0",  # no background repack of the cache while we read it
        "maintenance.auto": "false",
    }
    out: list[str] = []
    for key, value in pairs.items():
        out += ["-c", f"{key}={value}"]
    return out


def run(args: Iterable[str | Path], *, repo: Path | None = None, url: str = "",
        allow_file: bool = False, offline: bool = False, what: str = "git failed",
        check: bool = True, extra_env: dict[str, str] | None = None,
        stdin: IO[bytes] | None = None, source: GitSource | None = None) -> process.Result:
    """Run ``git ARGS`` (in the bare ``repo`` when given); ``url`` is scrubbed from errors.
    ``extra_env``: ours, set after the clean-up (``GIT_INDEX_FILE`` for a private index);
    ``stdin``: an open file git reads (lists too long for a command line). ``source``: a call
    that talks to its server (``fetch``, ``ls-remote``): its transport applies (credentials,
    limits, safe directories: :mod:`transport`), its URL is scrubbed, and a failure says what
    the user can do about it."""
    words = [str(a) for a in args]
    if source is not None:
        url, allow_file = source.url, source.scheme == "file"
        words = transport.with_upload_pack(words, source)
    with transport.reaching(source if not offline else None) as reach:
        argv = ["git", *overrides(allow_file=allow_file), *reach.options]
        if repo is not None:
            argv += ["--git-dir", str(repo)]
        try:
            child = env(allow_file=allow_file, offline=offline)
            child.update(reach.env)
            child.update(extra_env or {})
            return process.run(*argv, *words, env=child, check=check, timeout=TIMEOUT,
                               what=what, cwd=repo, stdin=stdin, idle=reach.idle)
        except ProcessError as e:
            raise _failed(e, url, source) from None


def _failed(e: ProcessError, url: str, source: GitSource | None) -> GitError:
    """``e`` scrubbed of credentials and of lines that do not help, led by what to do, if
    known."""
    hint = transport.explain(source, e.stderr) if source is not None else ""
    what = f"{e.what}: {hint}" if hint else e.what
    shown = tuple(scrub(a, url) for a in _short_argv(e.cmd))
    stderr = "\n".join(line for line in e.stderr.splitlines() if not _DROPPED.match(line))
    return GitError(shown, e.returncode, scrub(stderr, url), scrub(what, url))


def _short_argv(cmd: tuple[str, ...]) -> tuple[str, ...]:
    """The command without our ``-c`` overrides: they are the same every time and crowd out
    what failed."""
    out: list[str] = []
    skip = False
    for arg in cmd:
        if skip:
            skip = False
            continue
        if arg == "-c":
            skip = True
            continue
        out.append(arg)
    return tuple(out)

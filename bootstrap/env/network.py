"""Offline: whether uv may contact a package index, decided once per session, before uv waits.

Configured (``offline = true``, ``KERNEL_BOOTSTRAP_OFFLINE=1``, uv's own ``UV_OFFLINE=1``),
every uv call gets ``--offline``. Otherwise a network that is not there (no route, no DNS,
refused) used to cost uv's retries, 16-19 s, before a cold ``ensure`` failed, even with
everything it needed in the caches. So the cold path asks first, cheaply: one bounded TCP
connect to the host uv would go to (the default index from ``uv-args`` or uv's environment, or
the proxy), started in a thread as the session's work begins and waited for only by the first
uv call that needs an index. If that host cannot be reached, the session runs uv with
``--offline`` and says so once: versions are then the newest the caches hold.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from bootstrap.primitives import log

if TYPE_CHECKING:
    import threading

# socket, threading and urllib.parse are imported by the functions that use them: this module
# is imported with bootstrap.env.uv by every `ensure`, and only the cold path asks the network.

# Bounds of the check, each: a reachable index answers a TCP handshake in well under this,
# and a sandbox without a network fails at once (no route, no resolver).
RESOLVE_TIMEOUT: Final = 1.0
CONNECT_TIMEOUT: Final = 1.0
DEFAULT_INDEX: Final = "https://pypi.org/simple"
OFFLINE_ARGS: Final = ("--offline",)
_DEFAULT_INDEX_OPTIONS: Final = ("--index-url", "-i", "--default-index")
_INDEX_ENV: Final = ("UV_DEFAULT_INDEX", "UV_INDEX_URL")
_PROXY_ENV: Final = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def index_host(uv_args: Sequence[str]) -> tuple[str, int] | None:
    """Where uv would connect to for its default index (or through its proxy); None when
    no index is on the network (``--no-index``, a ``file://`` index)."""
    if "--no-index" in uv_args:
        return None
    import urllib.parse

    url = _option(uv_args) or next((os.environ[k] for k in _INDEX_ENV if os.environ.get(k)),
                                   DEFAULT_INDEX)
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    proxy = next((os.environ[k] for k in _PROXY_ENV if os.environ.get(k)), None)
    if proxy:
        through = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if through.hostname:
            return through.hostname, through.port or 80
    return parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)


def _option(uv_args: Sequence[str]) -> str | None:
    """The last default-index option in ``uv-args`` (``--index-url X``, ``--index-url=X``)."""
    found = None
    for i, arg in enumerate(uv_args):
        name, sep, value = arg.partition("=")
        if name in _DEFAULT_INDEX_OPTIONS:
            found = value if sep else (uv_args[i + 1] if i + 1 < len(uv_args) else None)
    return found


def unreachable(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be reached now (None: it can), within the bounds above."""
    import socket
    import threading

    found: list[object] = []

    def resolve() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as e:
            found.append(e)

    # getaddrinfo takes no timeout, and a resolver that drops packets makes it wait 5 s a try.
    resolver = threading.Thread(target=resolve, name="kernel-bootstrap-resolve", daemon=True)
    resolver.start()
    resolver.join(RESOLVE_TIMEOUT)
    if not found:
        return f"resolving {host} took longer than {RESOLVE_TIMEOUT:g} s"
    if isinstance(found[0], OSError):
        return f"cannot resolve {host}: {found[0].strerror or found[0]}"
    assert isinstance(found[0], list)
    problem = f"no address for {host}"
    for family, kind, proto, _, address in found[0]:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(CONNECT_TIMEOUT)
                s.connect(address)
                return None
        except OSError as e:
            problem = f"cannot connect to {host}:{port}: {e.strerror or e}"
    return problem


class Network:
    """The session's answer to "may uv contact an index?", asked for at most once."""

    def __init__(self, configured: bool, uv_args: Sequence[str]) -> None:
        # `--offline` in uv-args says the same as `offline = true`.
        self.configured = configured or "--offline" in uv_args
        self._host = None if configured else index_host(uv_args)
        self._problem: str | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin the check in the background (the cold path calls this; nothing else does)."""
        if self._host is not None and self._thread is None:
            import threading

            host, port = self._host
            self._thread = threading.Thread(target=self._check, args=(host, port),
                                            name="kernel-bootstrap-network", daemon=True)
            self._thread.start()

    def _check(self, host: str, port: int) -> None:
        self._problem = unreachable(host, port)

    @property
    def offline(self) -> bool:
        """Whether uv must not contact an index: configured, or the check found no network
        (said once, when first asked)."""
        if self.configured:
            return True
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            if self._problem is not None and self._host is not None:
                log.warning("the package index is unreachable; using only the caches (uv "
                            "--offline): versions are the newest the caches hold, and what they "
                            "lack fails", index=f"{self._host[0]}:{self._host[1]}",
                            error=self._problem)
        return self._problem is not None

    def args(self, argv: Sequence[object] = ()) -> tuple[str, ...]:
        """``--offline`` when offline, unless ``argv`` has it already (uv refuses it twice)."""
        return OFFLINE_ARGS if self.offline and "--offline" not in argv else ()


ONLINE: Final = Network(False, ["--no-index"])  # never checks, never offline

"""SIGTERM and SIGHUP end a command the way ^C does: by unwinding, not by dying on the spot.

``docker stop``, ``timeout(1)``, systemd and a closing terminal send these, and their default
action killed ``ensure`` at once: its uv went on writing into the venv after the lock was free,
and its scratch tree and lock holder record stayed behind. Raised as :class:`Terminated` where
the main thread is, the signal unwinds through the same ``finally`` blocks as ^C: children are
stopped (``process``), scratch and staging trees removed, the holder record removed, the lock
released, and the CLI exits ``128 + signal`` (143, 129).

Only the CLI installs this (after its warm path, which holds nothing): a library caller keeps
its own signal handling.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Final

_HANDLED: Final = (signal.SIGTERM, signal.SIGHUP)
_WORDS: Final[dict[int, str]] = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


class Terminated(BaseException):
    """A termination signal, as an exception: not an ``Exception``, so no ``except Exception``
    mistakes it for a failure to report and carry on from."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(_WORDS.get(signum, f"signal {signum}"))

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def handle_termination() -> None:
    """Raise :class:`Terminated` on SIGTERM and SIGHUP from now on. A signal ignored when we
    started stays ignored: under ``nohup`` a hangup must not stop us."""
    for signum in _HANDLED:
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _raise)


def _raise(signum: int, frame: FrameType | None) -> None:
    del frame
    # One is enough: a second one (an impatient supervisor) must not cut the clean-up short,
    # which is bounded anyway; SIGKILL still ends us.
    for handled in _HANDLED:
        if signal.getsignal(handled) == _raise:
            signal.signal(handled, signal.SIG_IGN)
    raise Terminated(signum)

"""The server's spares (:mod:`spare`): how many it keeps, when it makes one, which request may
claim one.

A spare is made only while no kernel is being started the forked way and no request waits, and
:data:`REFILL_DELAY` after a claim (the claimed kernel answers its first requests meanwhile):
it never competes with a start. One still preparing when a start begins is stopped (SIGSTOP)
until no start is left, so that it yields the CPU. A spare that fails to prepare turns spares
off for this server (one line in its log): the next one would fail the same way.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bootstrap.kernels import protocol, spare, spare_reads
from bootstrap.kernels.pending import Pending
from bootstrap.kernels.serverlog import say

REFILL_DELAY = 0.3


@dataclass
class Member:
    ctrl: socket.socket
    lines: protocol.Lines = field(default_factory=protocol.Lines)
    ready: spare_reads.Ready | None = None
    stopped: bool = False


class Pool:
    def __init__(self, wanted: int, selector: selectors.BaseSelector, venv: str) -> None:
        self.wanted, self.selector, self.venv = wanted, selector, venv
        self.members: dict[int, Member] = {}
        self.off: str | None = None
        self.next_at = 0.0

    def ready(self) -> int:
        return len(self.ready_pids())

    def ready_pids(self) -> list[int]:
        return sorted(pid for pid, m in self.members.items() if m.ready is not None)

    def wants_one(self, busy: bool) -> bool:
        return self.off is None and len(self.members) < self.wanted and not busy \
            and time.monotonic() >= self.next_at

    def refill_at(self) -> list[float]:
        """When the server's loop must wake to make a spare (none, or one time)."""
        return [self.next_at] if self.off is None and len(self.members) < self.wanted else []

    def refill(self, busy: bool, stopping: bool, closing: Callable[[], None],
               preload_fds: frozenset[int]) -> spare.SpareJob | None:
        """Pace the spares preparing (``busy``: a kernel starts); fork one when it is wanted."""
        self.pace(busy)
        if not stopping and self.wants_one(busy):
            return self.fork(closing, preload_fds)
        return None

    def hand(self, pending: Pending, env: dict[str, str]) -> int | None:
        """The pid of a ready spare that took ``pending`` (``env``: its kernel's environment);
        None: fork it."""
        assert pending.request is not None and pending.context is not None
        argv, cwd, _ = pending.request
        pid = self.take(argv, env)
        if pid is None:
            return None
        message = spare.claim_message(argv, cwd, env, pending.context, pending.ports,
                                      pending.bound)
        stdio, held = pending.fds[:protocol.N_FDS], pending.fds[protocol.N_FDS:]
        return pid if self.claim(pid, message, [*stdio, pending.conn.fileno(), *held]) else None

    def fork(self, closing: Callable[[], None],
             preload_fds: frozenset[int]) -> spare.SpareJob | None:
        """Fork a spare; in it, the job it runs (see ``template.BOOT``); None in the server."""
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:
            self._turn_off(f"no socket pair ({e.strerror})")
            return None
        try:
            pid = os.fork()
        except OSError as e:
            ours.close()
            theirs.close()
            self._turn_off(f"fork failed ({e.strerror})")
            return None
        if pid == 0:
            ours.close()
            return spare.SpareJob(theirs, self.venv, closing, preload_fds)
        theirs.close()
        ours.setblocking(False)
        self.members[pid] = Member(ours)
        self.selector.register(ours, selectors.EVENT_READ, lambda _, pid=pid: self._read(pid))
        return None

    def _read(self, pid: int) -> None:
        member = self.members.get(pid)
        if member is None:
            return
        try:
            chunk = member.ctrl.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        try:
            lines = member.lines.feed(chunk) if chunk else None
        except ValueError:
            lines = None
        if lines == []:
            return
        answer = spare_reads.decode_ready(lines[0]) if lines else None
        if isinstance(answer, spare_reads.Ready):
            member.ready = answer
            return
        self._drop(pid, kill=True)
        if isinstance(answer, str):
            self._turn_off(f"a spare failed to prepare ({answer})")

    def take(self, argv: list[str], env: dict[str, str]) -> int | None:
        """A ready spare the request (``argv``, ``env`` as its kernel gets it) may claim; one
        whose files changed is retired on the way."""
        for pid, member in list(self.members.items()):
            if member.ready is None:
                continue
            if spare_reads.stale(member.ready) is not None:
                self._drop(pid, kill=True)
                continue
            if spare_reads.refusal(argv, env, member.ready) is None:
                return pid
        return None

    def claim(self, pid: int, message: bytes, fds: list[int]) -> bool:
        """Hand the request to spare ``pid``; False when it is gone (the request is then
        forked)."""
        member = self.members.pop(pid)
        self.selector.unregister(member.ctrl)
        self.next_at = time.monotonic() + REFILL_DELAY
        if member.stopped:
            _signal(pid, signal.SIGCONT)
        try:
            member.ctrl.setblocking(True)
            sent = socket.send_fds(member.ctrl, [message], fds)
            if sent < len(message):
                member.ctrl.sendall(message[sent:])
        except OSError:
            _kill(pid)
            return False
        finally:
            member.ctrl.close()
        return True

    def pace(self, busy: bool) -> None:
        """Stop the spares still preparing while a kernel starts; go on once none does. A spare
        stopped as it was preparing may turn out ready (its message was on the way): it goes
        on all the same."""
        for pid, member in self.members.items():
            stop = busy and member.ready is None
            if member.stopped != stop:
                _signal(pid, signal.SIGSTOP if stop else signal.SIGCONT)
                member.stopped = stop

    def gone(self, pid: int) -> None:
        """Spare ``pid`` was reaped."""
        if pid in self.members:
            self._drop(pid, kill=False)

    def close(self) -> None:
        """The server stops: every spare ends (a spare is never claimed by another server)."""
        for pid in list(self.members):
            self._drop(pid, kill=True)

    def close_in_child(self) -> None:
        """In a fork (a kernel, a spare): the spares' sockets are the server's."""
        for member in self.members.values():
            member.ctrl.close()
        self.members.clear()

    def _drop(self, pid: int, *, kill: bool) -> None:
        member = self.members.pop(pid)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(member.ctrl)
        member.ctrl.close()
        if kill:
            _kill(pid)

    def _turn_off(self, reason: str) -> None:
        if self.off is None:
            say(f"no spares: {reason}")
        self.off = reason


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):  # it ended: the server reaps it
        os.kill(pid, signum)


def _kill(pid: int) -> None:
    """A spare and whatever it started (its own session and process group)."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)

"""The kernel server's loop: accept, check the peer, read a request, fork a kernel, reap it.

One thread and a ``selectors`` loop, so that a fork copies a process with no other thread, no
zmq context and no event loop in it. Signals arrive through ``signal.set_wakeup_fd`` (SIGCHLD:
reap; SIGTERM, SIGINT, SIGHUP: stop). At most :data:`INITIALISING` kernels start at once: a burst
of 100 requests queues (each told ``queued`` at once), it does not fork 100 kernels that then
fight for two cores. A kernel counts as starting until ``IPKernelApp.initialize()`` returned in
it (it closes a pipe then), it ended, or :data:`SETTLE` seconds passed.

A server that stops (idle, stale, signalled) retires: it stops listening and lets go of its lock
at once (a new server may take over), then stays until it has reaped its last kernel, so that
each stand-in learns its kernel's real wait status. Its idle timeout counts only while it has no
live kernel.

Bounded (issue 35): at most three descriptors per connection (:meth:`Pending.take`), a request
whole within :data:`pending.READ_TIMEOUT`, and no spin when out of descriptors
(:class:`pending.Accepting`).

The fork returns the kernel's job up the stack to ``template.main`` (see ``template.BOOT``): the
loop holds no ``finally`` and no context manager a kernel would run on its way out.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import struct
import sys
import time
from collections import deque
from typing import Any

from bootstrap.kernels import admission, places, protocol
from bootstrap.kernels.key import Key
from bootstrap.kernels.pending import Accepting, Pending
from bootstrap.kernels.pool import Pool
from bootstrap.kernels.preload import Preloaded
from bootstrap.kernels.serverlog import say

INITIALISING = max(2, min(4, os.cpu_count() or 2))
SETTLE = 5.0
STALE_CHECK = 10.0  # between checks of the key while idle (a stale server holds its generation)
_STOP = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Server:
    detached = False  # started by a kernel start, not by `serve` (template.main sets it)

    def __init__(self, dirfd: int, lockfd: int, key: Key, idle_timeout: float,
                 served: admission.Server, preloaded: Preloaded, spares: int = 0) -> None:
        self.dirfd, self.lockfd, self.key, self.idle_timeout = dirfd, lockfd, key, idle_timeout
        # What requests are compared with, and what the preload left for each kernel.
        self.served, self.preloaded = served, preloaded
        self.not_serving = served.not_serving
        self.started = time.time()
        self.kernels_started = 0
        self.selector = selectors.DefaultSelector()
        self.reading: dict[int, Pending] = {}
        self.queue: deque[Pending] = deque()
        self.kernels: dict[int, socket.socket] = {}  # pid -> its request connection
        self.starting: dict[int, tuple[int, float]] = {}  # pid -> (ready pipe, deadline)
        self.last_request = time.monotonic()
        self.stop: str | None = None
        # Kernels prepared in advance (bootstrap.kernels.spare); none while not serving.
        self.pool = Pool(spares if served.not_serving is None else 0, self.selector,
                         served.venv)

    def run(self) -> Any:
        """Serve until idle, stale or signalled, then retire (:meth:`_retire`) and return None;
        or return a forked kernel's job."""
        self._listen()
        say(f"serving {self.key.generation} (pid {os.getpid()})")
        next_check = time.monotonic() + STALE_CHECK
        while self.stop is None:
            for key, _ in self.selector.select(self._timeout(next_check)):
                job = key.data(key.fileobj)
                if job is not None:
                    return job
            now = time.monotonic()
            if now >= next_check:
                next_check = now + STALE_CHECK
                if not self.accepting.short:  # a scan short of descriptors reads as a change
                    self.stop = self.key.stale()
            self._expire(now)
            job = self._fork_next() or self._refill()
            if job is not None:
                return job
            self.accepting.resume(self.stop is not None)  # last: listening again if we stop
        self._close()
        self._retire()
        return None

    def _listen(self) -> None:
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        for signum in (*_STOP, signal.SIGCHLD):
            signal.signal(signum, lambda *_: None)  # the wakeup fd carries the number
        # A dead server's socket, if any: we hold the lock, it is ours to replace.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(places.SOCK, dir_fd=self.dirfd)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        umask = os.umask(0o077)
        try:
            self.sock.bind(places.sock_path(self.dirfd))
        finally:
            os.umask(umask)
        self.sock.listen(128)
        self.sock.setblocking(False)
        self.selector.register(self.sock, selectors.EVENT_READ, self._accept)
        self.accepting = Accepting(self.selector, self.sock, self._accept)
        self.selector.register(self.wake_r, selectors.EVENT_READ, self._signalled)

    def _timeout(self, next_check: float) -> float:
        now = time.monotonic()
        ends = [next_check] + ([] if self.kernels else [self.last_request + self.idle_timeout])
        ends += [p.deadline for p in self.reading.values()]
        ends += [d for _, d in self.starting.values()]
        ends += self.accepting.resume_at()
        ends += self.pool.refill_at()
        return max(0.0, min(ends) - now)

    def _signalled(self, fd: int) -> None:
        try:
            received = os.read(fd, 512)
        except BlockingIOError:
            return None
        if signal.SIGCHLD in received:
            self._reap()
        for signum in _STOP:
            if signum in received:
                self.stop = f"signal {signal.Signals(signum).name}"
        return None

    def _accept(self, sock: socket.socket) -> None:
        try:
            conn, _ = sock.accept()
        except OSError as e:
            self.accepting.pause(e)
            return None
        self.accepting.short = False
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():  # the 0700 directory should already stop them: belt and braces
            say(f"refused a connection of uid {uid} (pid {pid})")
            conn.close()
            return None
        conn.setblocking(False)
        pending = Pending(conn)
        pending.peer = pid
        self.reading[conn.fileno()] = pending
        self.selector.register(conn, selectors.EVENT_READ, self._read)
        return None

    def _read(self, conn: socket.socket) -> Any:
        pending = self.reading[conn.fileno()]
        try:
            data, fds, flags, _ = socket.recv_fds(conn, 65536, protocol.MAX_FDS + 1)
        except BlockingIOError:
            return None
        except OSError:
            data, fds, flags = b"", [], 0
        if not pending.take(fds, flags):
            self._done_reading(pending)
            pending.close()
            return None
        try:
            lines = pending.lines.feed(data) if data else None
        except ValueError:
            lines = None
        if lines == []:
            return None
        self._done_reading(pending)
        message = protocol.decode(lines[0]) if lines else None
        if message is None:
            pending.close()
        elif message.get("kind") == "info":
            self._send(pending.conn, self._info())
            pending.close()
        else:
            self._kernel_request(pending, message)
        return None

    def _done_reading(self, pending: Pending) -> None:
        del self.reading[pending.conn.fileno()]
        self.selector.unregister(pending.conn)

    def _kernel_request(self, pending: Pending, message: dict[str, object]) -> None:
        request = protocol.valid_request(message) if message.get("kind") == "kernel" else None
        bound = protocol.bound_ports(message, len(pending.fds))
        if request is None or bound is None:
            self._answer(pending, {"error": "malformed request"})
            return
        stale = self.key.stale() if message.get("generation") != self.served.generation else None
        if stale is not None:
            self.stop = stale  # a rebuild: the client starts the next server
            self._answer(pending, {"stale": True})
            return
        reason, context = admission.refusal(self.served, message, request[2], request[1],
                                            pending.peer)
        if reason is not None:
            say(f"ordinary start for pid {pending.peer}: {reason}")
            self._answer(pending, {"ordinary": reason})
            return
        pending.request, pending.context = request, context
        pending.ports = message.get("ports") is True
        pending.bound = bound
        self.last_request = time.monotonic()
        self._send(pending.conn, {"queued": True})
        self.queue.append(pending)

    def _answer(self, pending: Pending, message: dict[str, object]) -> None:
        self._send(pending.conn, message)
        pending.close()

    @staticmethod
    def _send(conn: socket.socket, message: dict[str, object]) -> None:
        with contextlib.suppress(OSError):  # the client is gone (or stuck): nothing to tell
            conn.send(protocol.encode(message), socket.MSG_DONTWAIT)

    def _info(self) -> dict[str, object]:
        return {"pid": os.getpid(), "generation": self.key.generation,
                "started": self.started, "kernels_started": self.kernels_started,
                "spares": self.pool.ready(), "spare_pids": self.pool.ready_pids(),
                "kernels": sorted(self.kernels), "detached": self.detached,
                "serving": self.not_serving is None, "not_serving": self.not_serving}

    def _expire(self, now: float) -> None:
        for pending in [p for p in self.reading.values() if p.deadline <= now]:
            self._done_reading(pending)
            pending.close()
        for pid, (_, deadline) in list(self.starting.items()):
            if deadline <= now:
                self._started(pid)
        # Idle only without a live kernel: a stopped server would keep its kernels' statuses
        # from their stand-ins for as long as they run (see _retire), for nothing.
        idle = now - self.last_request >= self.idle_timeout
        if idle and not self.queue and not self.kernels:
            self.stop = f"no request for {self.idle_timeout:g} s"

    def _started(self, pid: int) -> None:
        ready, _ = self.starting.pop(pid)
        self.selector.unregister(ready)
        os.close(ready)

    def _fork_next(self) -> Any:
        while self.queue:
            claimable = self.pool.ready() > 0
            if not claimable and len(self.starting) >= INITIALISING:
                break
            stale = self.key.stale()
            if stale is not None:
                self.stop = stale
                return None
            if claimable and self._claim(self.queue[0]):
                self.queue.popleft()
                continue
            if len(self.starting) >= INITIALISING:
                break
            job = self._fork(self.queue.popleft())
            if job is not None:
                return job
        return None

    def _kernel_env(self, env: dict[str, str]) -> dict[str, str]:
        """The environment a kernel gets for a request's ``env`` (see :mod:`preload`)."""
        loaded = self.preloaded
        return {**loaded.preload_env, **env, **loaded.kernel_env}

    def _claim(self, pending: Pending) -> bool:
        """Hand ``pending`` to a ready spare that may take it; False to fork it instead."""
        assert pending.request is not None and pending.context is not None
        pid = self.pool.hand(pending, self._kernel_env(pending.request[2]))
        if pid is not None:
            self._started_kernel(pid, pending)
        return pid is not None

    def _refill(self) -> Any:
        """A new spare when one is wanted (:mod:`pool`); in it, its job."""
        return self.pool.refill(bool(self.starting or self.queue), self.stop is not None,
                                self._closing_in_child, self.preloaded.fds)

    def _fork(self, pending: Pending) -> Any:
        from bootstrap.kernels import child

        assert pending.request is not None
        try:
            ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        except OSError as e:  # out of descriptors: this one starts the ordinary way
            self._answer(pending, {"error": f"no pipe: {e.strerror}"})
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:
            os.close(ready_r)
            os.close(ready_w)
            self._answer(pending, {"error": f"fork failed: {e}"})
            return None
        if pid == 0:
            os.close(ready_r)
            argv, cwd, env = pending.request
            assert pending.context is not None
            return child.Job(pending.conn, pending.fds, ready_w, argv, cwd, self._kernel_env(env),
                             closing=self._closing_in_child, context=pending.context,
                             preload_fds=self.preloaded.fds, ports=pending.ports,
                             bound=pending.bound)
        os.close(ready_w)
        self.starting[pid] = (ready_r, time.monotonic() + SETTLE)
        self.selector.register(ready_r, selectors.EVENT_READ, lambda fd, pid=pid: self._ready(pid))
        self._started_kernel(pid, pending)
        return None

    def _started_kernel(self, pid: int, pending: Pending) -> None:
        for fd in pending.fds:
            os.close(fd)
        pending.fds = []
        self.kernels_started += 1
        self.kernels[pid] = pending.conn
        self._send(pending.conn, {"pid": pid})

    def _ready(self, pid: int) -> None:
        if pid in self.starting:
            self._started(pid)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.starting:
                self._started(pid)
            self.pool.gone(pid)
            conn = self.kernels.pop(pid, None)
            if conn is not None:
                self._send(conn, {"exit": status})
                conn.close()
                if not self.kernels:  # the idle timeout counts from the last kernel's end
                    self.last_request = time.monotonic()

    def _closing_in_child(self) -> None:
        """In a forked kernel: drop what is the server's (its loop, socket, signals)."""
        signal.set_wakeup_fd(-1)
        self.selector.close()
        self.sock.close()
        for pending in [*self.reading.values(), *self.queue]:
            pending.close()
        for conn in self.kernels.values():
            conn.close()
        self.pool.close_in_child()

    def _close(self) -> None:
        """Stop listening and let go of the lock before answering those still waiting: a
        client told ``stale`` then finds no server and spawns the next one, and a ``serve``
        waiting for the lock takes over at once."""
        say(f"stopping: {self.stop}")
        # Only while the socket is still ours (we hold the lock): the next server's is not.
        with contextlib.suppress(OSError):
            os.unlink(places.SOCK, dir_fd=self.dirfd)
        # The lock before the socket: closing it resets the connections still in its backlog,
        # and a client reset so finds the lock free and spawns the next server (client.py).
        os.close(self.lockfd)
        self.selector.unregister(self.sock)
        self.sock.close()
        self.pool.close()
        for pending in list(self.reading.values()):
            self._done_reading(pending)
            pending.close()
        for pending in self.queue:
            self._answer(pending, {"stale": True})
        self.queue.clear()

    def _retire(self) -> None:
        """Stay until the last kernel is reaped, sending each its wait status: its stand-in
        then exits as a bare kernel's launcher sees it (a signal death as that signal). Only a
        server killed outright leaves its stand-ins to guess (see :mod:`standin`)."""
        if self.kernels:
            say(f"retiring: waiting for {len(self.kernels)} kernel(s) to end")
        while self.kernels:
            now = time.monotonic()
            ends = [d for _, d in self.starting.values()]
            for key, _ in self.selector.select(max(0.0, min(ends) - now) if ends else None):
                key.data(key.fileobj)  # the wakeup fd (SIGCHLD: reap) or a ready pipe
            for pid, (_, deadline) in list(self.starting.items()):
                if deadline <= time.monotonic():
                    self._started(pid)

"""The one place child processes are started.

:func:`run` runs a command to completion; :func:`background` runs one while we do other work
(the runtime install while skills are built); :func:`streaming` starts one whose stdin we write
while we work (``tar -x`` fed a vetted snapshot); :func:`feed` is the asyncio form of the same,
for ``push``, where several runtimes stream at once. All of them give the child a cleaned
environment (see :func:`child_env`) and turn a failure into a
:class:`~bootstrap.errors.ProcessError` naming the command and the tail of its stderr.

No child of ours may outlive the step that started it, or write into the venv after the lock
that guarded it is free (a SIGTERMed ``ensure`` used to leave uv and its build backend writing
into the live venv while the next session held the lock). So:

- stopping a child (an error, ^C, SIGTERM, a timeout) stops its whole tree, uv's build backends
  included, and waits until they are gone (``proctree``, Linux; elsewhere the child);
- every child inherits a descriptor of every lock we hold (:func:`inherited`): an flock belongs
  to the open file, so the kernel frees it only when the last process holding it has exited.
  If we are SIGKILLed, what we started keeps the next session waiting until it has finished,
  instead of working beside it.

Children stay in our process group: a sandbox that kills our group kills them too, as before.
(A group of their own would let ``killpg`` stop the tree, but the sandbox's kill would then
miss them, and the parent-death signal that could make up for it needs a ``preexec_fn``, which
costs subprocess its vfork and runs filelock's fork hooks: 4-10 ms more a child, measured here.)

:func:`feed` (``push``, not under the venv's lock) keeps asyncio's own start and stop.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, NoReturn

from bootstrap.errors import BootstrapError, ProcessError

if TYPE_CHECKING:  # asyncio costs ~35 ms: only push pays for it, inside feed()
    import asyncio

# Variables that would make a child act on some other environment than the one we name:
# - VIRTUAL_ENV / CONDA_PREFIX: uv targets an activated env when no --python is given, and
#   `python` children would report the activated env in sys.prefix-based checks.
# - PYTHONHOME / PYTHONPATH: a kernel platform's own paths leak into the venv's interpreter and
#   make "is it installed in the venv?" checks pass for packages that live elsewhere.
# - PYTHONSTARTUP / PYTHONNOUSERSITE left alone: harmless for -c children.
_REMOVED_VARS = ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME", "PYTHONPATH", "__PYVENV_LAUNCHER__")
_TAIL_LIMIT: Final = 64 * 1024  # stderr kept from a streamed child: a chatty one cannot grow us
_DRAIN_TIMEOUT: Final = 30.0  # after an aborted stream, how long the child gets to clean up
_POSIX: Final = sys.platform != "win32"
_PROC: Final = sys.platform == "linux"
# Descriptors every child inherits (see inherited); duplicates owned by this module.
_inherited: list[int] = []


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: ours, minus what would retarget it, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _REMOVED_VARS}
    if extra:
        env.update(extra)
    return env


def run(
    *cmd: str | Path,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    what: str = "",
    error: type[ProcessError] = ProcessError,
    stdin: IO[bytes] | None = None,
    idle: float | None = None,
) -> Result:
    """Run ``cmd`` to completion and capture its output.

    ``check`` turns a non-zero exit (or a command that cannot start) into ``error``; ``what``
    is the one-line description of the step used at the top of that error's message. ``stdin``
    is an open file for the child to read (by default it reads nothing). ``idle``: a child
    silent on stdout and stderr for that many seconds is stopped as stalled (an error).
    """
    argv = tuple(str(c) for c in cmd)
    try:
        proc = _popen(argv, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                      errors="replace", env=dict(env) if env is not None else child_env(),
                      cwd=cwd)
    except OSError as e:
        _not_started(argv, e, what, error)
    with _stopped_if_raised(proc):
        stdout, stderr = _collect(proc, argv, timeout, idle, what, error)
    result = Result(proc.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise error(argv, proc.returncode, stderr, what)
    return result


def _collect(proc: subprocess.Popen[str], argv: tuple[str, ...], timeout: float | None,
             idle: float | None, what: str, error: type[ProcessError]) -> tuple[str, str]:
    """The child's stdout and stderr; running out of time (or, with ``idle``, a stall) stops
    its tree and raises ``error``."""
    if idle is not None:
        from bootstrap.primitives.watchdog import read_watched

        stdout, stderr, stopped = read_watched(proc, timeout, idle, lambda: _stop_tree(proc))
    else:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            stopped = ""
        except subprocess.TimeoutExpired:
            _stop_tree(proc)
            stdout, stderr = proc.communicate()
            stopped = f"timed out after {timeout} s"
    if stopped:
        raise error(argv, -9, f"{stderr or ''}\n{stopped}", what)
    return stdout, stderr


def replace(python: Path, args: Sequence[str]) -> NoReturn:
    """Become ``python ARGS`` (``os.execv``): no process of ours stays around, and the pid the
    caller started (Jupyter signals and waits for it) is the interpreter's.

    Signals we catch are reset by the exec itself (SIGPIPE stays ignored, as the new
    interpreter's own start would set it anyway). Open descriptors of ours are close-on-exec.
    """
    argv = [str(python), *args]
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    try:
        os.execv(argv[0], argv)
    except OSError as e:
        raise BootstrapError(f"cannot start {python}: {e.strerror or e}") from e


def _not_started(argv: Sequence[str], e: OSError, what: str,
                 error: type[ProcessError] = ProcessError) -> NoReturn:
    """A command that could not start fails like one that ran: 127 not found, 126 otherwise."""
    argv = tuple(argv)
    if isinstance(e, FileNotFoundError):
        raise error(argv, 127, f"{e.filename}: not found", what or "could not start") from e
    raise error(argv, 126, str(e), what or "could not start") from e


@contextlib.contextmanager
def background(*cmd: str | Path, env: Mapping[str, str] | None = None, what: str = "",
               error: type[ProcessError] = ProcessError) -> Iterator[None]:
    """Start ``cmd``, run the block while it works, then wait for it: for a child whose work
    overlaps ours. Its failure raises ``error`` (as :func:`run` would) once the block is done.

    If the block raises, the child is killed first: what it was doing is no longer wanted.
    """
    import tempfile

    argv = tuple(str(c) for c in cmd)
    # stderr to a file, not a pipe: nobody reads a pipe while the block runs, and a child
    # blocked on a full one would never finish.
    with tempfile.TemporaryFile() as err:
        proc = _started(argv, subprocess.DEVNULL, err,
                        dict(env) if env is not None else child_env(), what, error)
        # The wait is inside the guard too: a SIGTERM while we wait must stop the child.
        with _stopped_if_raised(proc):
            yield
            _raise_if_failed(proc, err, argv, what, error)


@contextlib.contextmanager
def streaming(*cmd: str | Path, what: str) -> Iterator[IO[bytes]]:
    """Start ``cmd`` and yield its stdin; on leaving, close it, wait, and raise ProcessError if
    the child failed. The child stopping early (a broken pipe) is judged by its exit status.

    If the block raises, the child is killed first: half a stream must not be acted upon.
    """
    import tempfile

    argv = tuple(str(c) for c in cmd)
    with tempfile.TemporaryFile() as err:
        proc = _started(argv, subprocess.PIPE, err, child_env(), what, ProcessError)
        assert proc.stdin is not None, "BUG: a pipe was requested"
        try:
            with _stopped_if_raised(proc):
                with contextlib.suppress(BrokenPipeError):
                    yield proc.stdin
                    proc.stdin.close()  # EOF only for a complete stream: on error, kill first
                _raise_if_failed(proc, err, argv, what, ProcessError)
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()


def _started(argv: tuple[str, ...], stdin: int, err: IO[bytes], env: dict[str, str], what: str,
             error: type[ProcessError]) -> subprocess.Popen[bytes]:
    """``argv`` started with its stderr to the file ``err`` and its stdout discarded."""
    try:
        proc: subprocess.Popen[bytes] = _popen(argv, stdin=stdin, stdout=subprocess.DEVNULL,
                                               stderr=err, env=env)
    except OSError as e:
        _not_started(argv, e, what, error)
    return proc


def _popen(argv: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
    """Every child's start: it inherits our locks (see :func:`inherited`)."""
    if not _POSIX:
        return subprocess.Popen(argv, **options)
    return subprocess.Popen(argv, pass_fds=tuple(_inherited), **options)


@contextlib.contextmanager
def inherited(fd: int) -> Iterator[int]:
    """While the block runs, every child started inherits a duplicate of ``fd`` (its number is
    what the block gets: the same in the child).

    ``lock.hold`` passes its lock's descriptor: the lock then lasts as long as the last process
    that could write under it. A duplicate, not ``fd`` itself: filelock owns its descriptor
    (and closes it in any child that runs Python after a fork); ours lives as long as the block.
    """
    dup = os.dup(fd)  # not inheritable: only children given it in pass_fds get it
    _inherited.append(dup)
    try:
        yield dup
    finally:
        _inherited.remove(dup)
        os.close(dup)


@contextlib.contextmanager
def _stopped_if_raised(proc: subprocess.Popen[Any]) -> Iterator[None]:
    """Stop ``proc`` and its tree if the block raises: what it was doing is no longer wanted."""
    try:
        yield
    except BaseException:
        _stop_tree(proc)
        raise


def _stop_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL ``proc`` and its descendants (uv and its build backends), reap it, and wait,
    bounded, until they are gone: only then may the caller release the lock they worked under."""
    if _PROC and proc.poll() is None:
        from bootstrap.primitives import proctree
        proctree.kill(proc.pid, reap=proc.wait)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _raise_if_failed(proc: subprocess.Popen[bytes], err: IO[bytes], argv: Sequence[str],
                     what: str, error: type[ProcessError]) -> None:
    """Wait for ``proc``; if it failed, raise ``error`` with the tail of its stderr file."""
    if proc.wait() != 0:
        size = err.seek(0, os.SEEK_END)  # the child wrote through its own copy of the fd
        err.seek(max(0, size - _TAIL_LIMIT))
        raise error(tuple(argv), proc.returncode, err.read().decode(errors="replace"), what)


Answer = Callable[[str | None], Iterator[bytes]]


async def feed(cmd: Sequence[str], chunks: Iterator[bytes] | Answer, shown: Sequence[str],
               what: str, *, ask: str | None = None, ask_timeout: float = 15.0) -> str:
    """Run ``cmd`` with ``chunks`` on its stdin; return its stdout (the last 64 KiB).

    With ``ask``, the child speaks first: ``chunks`` is called with its first stdout line that
    starts with ``ask`` (None if it ends, or says nothing of the kind within ``ask_timeout``)
    and returns what to send; one process answers a question and takes the reply.

    A failing child is a ProcessError showing ``shown`` as its command (the real one may carry
    a long script). An error while producing ``chunks`` closes stdin without the rest, lets the
    child end, and is raised then. Cancelled (^C): EOF, then SIGTERM, so the child cleans up.
    """
    import asyncio

    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=child_env(),
        )
    except OSError as e:
        _not_started(shown, e, what)
    assert proc.stdin and proc.stdout and proc.stderr, "BUG: pipes were requested"
    heard: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
    out = asyncio.ensure_future(_read_tail(proc.stdout, ask, heard))
    err = asyncio.ensure_future(_read_tail(proc.stderr))
    try:
        if callable(chunks):
            chunks = chunks(await _first_line(heard, ask_timeout))
        local_error = await _write_all(proc.stdin, chunks)
        if local_error is not None:
            await _await_exit(proc, _DRAIN_TIMEOUT)
            raise local_error
        returncode = await proc.wait()
        stdout, stderr = await out, await err
    finally:
        if proc.returncode is None:  # cancelled (^C) or our own bug: do not leave it running
            await _stop(proc)
        out.cancel()
        err.cancel()
    if returncode != 0:
        raise ProcessError(tuple(shown), returncode, stderr.decode(errors="replace"), what)
    return stdout.decode(errors="replace")


async def _write_all(stdin: asyncio.StreamWriter,
                     chunks: Iterator[bytes]) -> BootstrapError | None:
    """Write the stream; a child that stops reading is not an error here (its exit status says
    why). A local error is returned after closing stdin without the rest of the stream."""
    failed: BootstrapError | None = None
    try:
        for data in chunks:
            stdin.write(data)
            await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    except BootstrapError as e:
        failed = e
    except OSError as e:  # e.g. a source vanished: still ours, and reported as such
        failed = BootstrapError(f"cannot read what was being sent: {e}")
    stdin.close()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await stdin.wait_closed()
    return failed


async def _await_exit(proc: asyncio.subprocess.Process, timeout: float) -> None:
    import asyncio

    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """EOF first, then SIGTERM, not SIGKILL: the child (a push script's trap, or ssh/docker
    hanging up on the far side) gets to remove what it staged."""
    if proc.stdin is not None:
        proc.stdin.close()
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    await _await_exit(proc, timeout=5.0)


async def _first_line(heard: asyncio.Future[str | None], timeout: float) -> str | None:
    import asyncio

    try:
        return await asyncio.wait_for(asyncio.shield(heard), timeout)
    except TimeoutError:  # a transport that holds stdout back until the end
        return None


async def _read_tail(stream: asyncio.StreamReader, ask: str | None = None,
                     heard: asyncio.Future[str | None] | None = None) -> bytes:
    """The last 64 KiB of ``stream``; the first line starting with ``ask`` goes to ``heard``
    as soon as it is complete (None at the end if none came)."""
    buf = bytearray()
    lines = bytearray()  # only until the question was heard
    want = ask.encode() if ask is not None and heard is not None else None
    while data := await stream.read(65536):
        buf += data
        if len(buf) > _TAIL_LIMIT:
            del buf[:-_TAIL_LIMIT]
        if want is not None and heard is not None and not heard.done():
            lines += data
            *complete, rest = lines.split(b"\n")
            found = next((ln for ln in complete if ln.startswith(want)), None)
            if found is not None:
                heard.set_result(found.decode(errors="replace"))
            lines = bytearray(rest[-_TAIL_LIMIT:])
    if heard is not None and not heard.done():
        heard.set_result(None)
    return bytes(buf)

"""The messages on a kernel server's socket: one JSON object per line, each way.

A client sends one request: ``{"kind": "info"}``, or ``{"kind": "kernel", "argv": [...],
"cwd": ..., "env": {...}, "venv": ..., "generation": ..., "config": ..., "securebits": N}`` with
its descriptors 0, 1 and 2 attached (SCM_RIGHTS, on the first bytes): the venv, generation and
config the start would use (a server of another refuses it) and the stand-in's securebits
(``/proc`` does not show them; the rest of its context the server reads there itself).

The server answers a kernel request with ``{"queued": true}`` at once (the client's short
timeout covers only that: a burst may then wait its turn), then ``{"pid": N}`` once the kernel is
forked and ``{"exit": WAIT_STATUS}`` once it is reaped; or with one of ``{"stale": true}``,
``{"ordinary": REASON}``, ``{"error": TEXT}``, after which the client starts the kernel the
ordinary way. The kernel holds the server's end of the connection too and adds its own last word,
``{"last": EXIT_CODE}``, for when the server is gone by then.

A kernel request may carry ``"warm": true`` (the native stand-in's, native/standin.c): the
client did not run the gate's warm check, and the server makes it in the request's environment
(:mod:`bootstrap.kernels.gate`) before it admits the request.

A kernel request may carry ``"ports": true`` (the jupyter_client provisioner's: it wrote a
connection file with ports 0 and its key, so ipykernel binds ports of its choosing and no other
process can take them first): the kernel then sends ``{"ports": {"shell_port": N, "iopub_port":
N, "stdin_port": N, "control_port": N, "hb_port": N}}`` once ``IPKernelApp.initialize()`` has
bound them, between ``pid`` and ``exit``. A claimed spare sends the ports it held listening
since it was prepared (:func:`bootstrap.kernels.spare._own_ports`) as it takes the claim: that
message may come before the server's ``pid``.

A kernel request may carry ``"bound": [PORT, ...]`` (the native stand-in's): after 0, 1 and 2
come that many more descriptors, listening TCP sockets the stand-in bound as it started to the
ports its connection file names, in that order. The kernel binds those ports by adopting them
(``ZMQ_USE_FD``, :func:`bootstrap.kernels.child.patient_binds`): jupyter_client picks ports by
binding and closing them, and in a burst another process took one in the seconds before the
kernel came to bind it (issue 36); held from the stand-in's first millisecond, none is taken.

Standard library only: the server imports this in the venv's interpreter, the client on the
warm path. The messages are JSON written and read by ``_json``, json's own C encoder and scanner,
without the ``json`` package: importing that loads ``re`` and ``enum``, ~8 ms, as much again as
the rest of a stand-in's hand-off (``bootstrap.cli.lean_run``). Where ``_json`` is missing or
refuses (another implementation, a changed signature), ``json`` itself does the same.
"""

from __future__ import annotations

MAX_MESSAGE = 4 * 1024 * 1024  # an environment of a few MiB is not a kernel's
N_FDS = 3
# A kernel's ports by their connection-file names, in the order of a request's "bound" sockets.
PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
N_BOUND = len(PORTS)
MAX_FDS = N_FDS + N_BOUND  # the most descriptors a request carries

# Variables the interpreter reads only as it starts (and the locale, which decides the file
# system encoding then): a request that sets one of them other than the server was started
# with gets the ordinary start, since a forked kernel cannot act on it. HOME: site's user
# directory is computed from it at start.
START_VARIABLES = ("LC_ALL", "LC_CTYPE", "LANG", "HOME")


def encode(message: dict[str, object]) -> bytes:
    """``json.dumps(message, separators=(",", ":"))`` and a newline."""
    try:
        from _json import encode_basestring_ascii, make_encoder

        # JSONEncoder's own call: circular check on, the default() that refuses, ASCII only,
        # no indent, compact separators, keys unsorted, none skipped, NaN allowed.
        text = "".join(make_encoder({}, _refuse, encode_basestring_ascii, None, ":", ",",
                                    False, False, True)(message, 0))
    except (ImportError, TypeError, ValueError, RecursionError):
        import json  # json's own answer, its error included

        text = json.dumps(message, separators=(",", ":"))
    return text.encode() + b"\n"


def _refuse(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def decode(line: bytes) -> dict[str, object] | None:
    """The message on ``line``; None when it is not a JSON object."""
    try:
        from _json import make_scanner
    except ImportError:
        return _decode_json(line)
    try:
        text = line.decode().strip(" \t\n\r")
        scan = make_scanner(_Scanning())  # type: ignore[arg-type]  # JSONDecoder's attributes
        value, end = scan(text, 0)
    except (StopIteration, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    except (TypeError, AttributeError, SystemError):
        # A scanner that wants another context; or a malformed message on 3.10 and 3.11,
        # whose _json raises json.decoder's error only when that module is loaded already.
        return _decode_json(line)
    return value if isinstance(value, dict) and end == len(text) else None


class _Scanning:
    """What ``_json.make_scanner`` reads of a ``json.JSONDecoder``: json.loads' defaults
    (``float`` reads NaN and Infinity as json's own table does)."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float = parse_constant = float
    parse_int = int


def _decode_json(line: bytes) -> dict[str, object] | None:
    import json

    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class Lines:
    """Complete lines out of a stream's chunks, at most :data:`MAX_MESSAGE` bytes buffered."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` completes; ValueError when a line exceeds the bound."""
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        if len(self.buffer) > MAX_MESSAGE:
            raise ValueError("message too long")
        return lines


def ordinary_reason(wanted: dict[str, str], started: dict[str, str]) -> str | None:
    """Why a kernel with the environment ``wanted`` cannot be forked from a server started with
    ``started``: a variable that acts only at interpreter start differs (every ``PYTHON*`` one
    among them: PYTHONPATH, PYTHONHASHSEED, PYTHONUTF8, ...); None when it can."""
    names = {k for k in (*wanted, *started) if k.startswith("PYTHON")} | set(START_VARIABLES)
    for name in sorted(names):
        if wanted.get(name) != started.get(name):
            return f"{name} differs from the kernel server's"
    return None


def valid_request(message: dict[str, object]) -> tuple[list[str], str, dict[str, str]] | None:
    """A kernel request's argv, cwd and env, checked; None when malformed."""
    argv, cwd, env = message.get("argv"), message.get("cwd"), message.get("env")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        return None
    if not (isinstance(cwd, str) and cwd.startswith("/")):
        return None
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str)
                                          for k, v in env.items())):
        return None
    return argv, cwd, env


def bound_ports(message: dict[str, object], n_fds: int) -> list[int] | None:
    """The ports of a request's bound sockets (see the module docstring), one for each of its
    descriptors after the first :data:`N_FDS` (``n_fds`` in all); None when malformed."""
    bound = message.get("bound", [])
    if not (isinstance(bound, list) and len(bound) == n_fds - N_FDS <= N_BOUND):
        return None
    if not all(type(port) is int and 0 < port < 65536 for port in bound):
        return None
    return bound if len(set(bound)) == len(bound) else None


def served_module(python_args: list[str]) -> str | None:
    """The module of an ipykernel launch a server may serve: ``-m ipykernel_launcher ... -f
    FILE`` (or ``-m ipykernel``) with no interpreter option before ``-m``; None otherwise."""
    if python_args[:1] != ["-m"] or len(python_args) < 3:
        return None
    module, rest = python_args[1], python_args[2:]
    if module not in ("ipykernel_launcher", "ipykernel"):
        return None
    if "-f" in rest[:-1] or any(a.startswith(("--f=", "-f=")) for a in rest):
        return module
    return None

"""A process's context that a fork does not pass on: what a launcher's wrapper (``unshare``,
bubblewrap, a cgroup, ``prlimit``/``ulimit``, ``nice``, a umask, seccomp, ``setpriv``) set up
around a kernel start, read from the kernel's view of the process (``/proc/PID``).

A served kernel is forked by the server, so it inherits the *server's* context, which the first
launcher of the venv gave it. The server therefore forks only for a launcher whose context it can
reproduce (issue 35: a fork server that serves another namespace is the classic container
escape): what a process cannot change for itself (namespaces, root directory, cgroups, ids and
groups, capabilities, ``no_new_privs``, seccomp, the LSM label, securebits) must be the server's
own (:func:`refusal`), and what it may always set for itself within those bounds is applied in
the forked kernel (:func:`apply`): every rlimit (lowered only), umask, nice and
``oom_score_adj`` (raised only), CPU affinity (a subset), the I/O priority (not the realtime
class), the timer slack. Anything else is an ordinary start (``{"ordinary": REASON}``).

Seccomp filters cannot be read back without ``CAP_SYS_ADMIN``: they are compared by mode and
count, with the namespaces and the cgroup also equal. Securebits are not in ``/proc``: the
stand-in sends its own (``PR_GET_SECUREBITS``).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from bootstrap.kernels import libc

NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "pid_for_children", "time",
              "time_for_children", "user", "uts")
# /proc/PID/status lines that must be equal (Uid/Gid: real, effective, saved, filesystem).
STATUS = ("Uid", "Gid", "Groups", "NoNewPrivs", "Seccomp", "Seccomp_filters", "CapInh",
          "CapPrm", "CapEff", "CapBnd", "CapAmb")
LIMITS = {name: getattr(resource, name) for name in sorted(dir(resource))
          if name.startswith("RLIMIT_")}
_IOPRIO_CLASS_RT = 1


@dataclass(frozen=True)
class Context:
    same: dict[str, str]  # what must equal the server's, by name
    limits: dict[str, tuple[int, int]]
    umask: int
    nice: int
    oom_score_adj: int
    affinity: frozenset[int]
    ioprio: int | None
    timerslack: int | None


def read(pid: int, securebits: int) -> Context:
    """The context of process ``pid`` (``securebits`` as it reported them); OSError or
    ValueError when it cannot be read whole."""
    proc = f"/proc/{pid}"
    status = _fields(_text(f"{proc}/status"))
    same = {f"{name} namespace": _identity(f"{proc}/ns/{name}") for name in NAMESPACES}
    same["root directory"] = _identity(f"{proc}/root")
    same["cgroup"] = _text(f"{proc}/cgroup")
    same.update((name, status.get(name, "")) for name in STATUS)
    same["LSM label"] = _label(proc)
    same["securebits"] = str(securebits)
    stat = _text(f"{proc}/stat").rsplit(")", 1)[1].split()
    return Context(
        same=same,
        limits={name: resource.prlimit(pid, number) for name, number in LIMITS.items()},
        umask=int(status["Umask"], 8), nice=int(stat[16]),
        oom_score_adj=int(_text(f"{proc}/oom_score_adj")),
        affinity=frozenset(os.sched_getaffinity(pid)),
        ioprio=libc.ioprio_get(pid), timerslack=_timerslack(proc))


def own() -> Context:
    """This process's context (the server's, read once as it starts serving)."""
    return read(os.getpid(), libc.prctl(libc.PR_GET_SECUREBITS))


def refusal(peer: Context, server: Context) -> str | None:
    """Why a kernel for a launcher of context ``peer`` cannot be forked from a server of
    context ``server``; None when :func:`apply` reproduces it exactly."""
    for name, value in peer.same.items():
        if server.same.get(name) != value:
            return f"its {name} differs from the kernel server's"
    for name, (_, hard) in peer.limits.items():
        if _more(hard, server.limits[name][1]):
            return f"it may raise {name} higher than the kernel server may"
    if peer.nice < server.nice:
        return "its nice value is below the kernel server's"
    if peer.oom_score_adj < server.oom_score_adj:
        return "its oom_score_adj is below the kernel server's"
    if not peer.affinity <= server.affinity:
        return "its CPU affinity reaches CPUs the kernel server's does not"
    if peer.ioprio != server.ioprio and peer.ioprio is not None \
            and peer.ioprio >> 13 == _IOPRIO_CLASS_RT:
        return "its realtime I/O priority differs from the kernel server's"
    return None


def apply(context: Context) -> None:
    """Make this process (a kernel just forked) carry ``context``'s settable parts; OSError when
    one cannot be set (the caller must not run the kernel then). Limits last: a lowered
    RLIMIT_NOFILE or RLIMIT_AS must not stop the other steps."""
    os.umask(context.umask)
    os.setpriority(os.PRIO_PROCESS, 0, context.nice)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(context.oom_score_adj))
    os.sched_setaffinity(0, context.affinity)
    if context.ioprio is not None and context.ioprio != libc.ioprio_get(0) \
            and not libc.ioprio_set(context.ioprio):
        raise OSError(f"cannot set the I/O priority {context.ioprio:#x}")
    if context.timerslack is not None \
            and libc.prctl(libc.PR_SET_TIMERSLACK, context.timerslack) != 0:
        raise OSError(f"cannot set the timer slack {context.timerslack}")
    for name, limits in context.limits.items():
        resource.setrlimit(LIMITS[name], limits)


def _more(value: int, than: int) -> bool:
    """Whether limit ``value`` exceeds limit ``than`` (RLIM_INFINITY is the largest)."""
    if than == resource.RLIM_INFINITY:
        return False
    return value == resource.RLIM_INFINITY or value > than


def _text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields[name] = " ".join(value.split())
    return fields


def _identity(path: str) -> str:
    """A namespace's (or directory's) identity; "-" when the kernel has no such namespace."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "-"
    return f"{st.st_dev}:{st.st_ino}"


def _label(proc: str) -> str:
    try:
        return _text(f"{proc}/attr/current").rstrip("\0\n")
    except OSError as e:  # no LSM: EINVAL; compared as it fails, for both sides alike
        return f"errno {e.errno}"


def _timerslack(proc: str) -> int | None:
    """The timer slack in ns; None where reading it is not allowed (it needs ptrace access)."""
    try:
        return int(_text(f"{proc}/timerslack_ns"))
    except OSError:
        return None

"""Issue 35, items 1-4, with the real uv, ipykernel from PyPI and jupyter_client: a kernel the
kernel server could serve sees exactly what a bare kernel under the same kernelspec wrapper sees
(namespaces, cgroup, limits, umask, nice, ...), whether the server forks it or refuses it; the
server's own context (its cwd, its inherited descriptors) reaches no kernel; a by-hand install
or another config naming the venv is never served from a server's memory; preload is fork-safe
or not used.

Each wrapper case starts a server first from an unwrapped kernel, so that the wrapped start is
offered to it (a server is never started by the wrapped kernel there), then compares the
kernel's own view of its context (:data:`CONTEXT`) with a bare start's
(``KERNEL_BOOTSTRAP_KERNEL_SERVER=0``) under the same wrapper. Needs root, ``unshare`` and a
writable cgroup v1 memory hierarchy for some cases; skipped without them. A context the server
cannot reproduce (a namespace, the cgroup) must get the ordinary start; what a process may set
for itself (limits, umask, nice) is served and applied. ``test_itemN_...``: issue 35's item N.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testing import kernels, kernelserver, reaper
from testing.processes import alive, wait_for
from tests.integration import test_kernel_server as served_tests
from tests.integration.conftest import RealWorld

pytest.importorskip("jupyter_client")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")

SPEC = served_tests.SPEC
kernel_world = served_tests.kernel_world  # the fixture: ipykernel, its kernelspec installed
first_start, served, wait_for_server = (served_tests.first_start, served_tests.served,
                                        served_tests.wait_for_server)

# What a kernel sees of its own context (DESIGN.md "A process's context"). TEST_NS (the test's
# namespace inodes) and SECRET are defined before it: a namespace is compared as "the test's or
# not", since each start under `unshare` makes a new one.
CONTEXT = textwrap.dedent("""\
    import ctypes, json, os, resource
    _libc = ctypes.CDLL(None, use_errno=True)
    def _read(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError as e:
            return f"errno {e.errno}"
    def _prctl(option, by_pointer=False):
        if not by_pointer:
            return _libc.prctl(option, 0, 0, 0, 0)
        out = ctypes.c_int(-1)
        _libc.prctl(option, ctypes.byref(out), 0, 0, 0)
        return out.value
    def _ioprio():  # ioprio_get(IOPRIO_WHO_PROCESS, 0)
        number = {"x86_64": 252, "aarch64": 31}.get(os.uname().machine)
        return None if number is None else _libc.syscall(number, 1, 0)
    _status = dict(line.split(":", 1) for line in _read("/proc/self/status").splitlines())
    print(json.dumps({
        "pid": os.getpid(), "pidns": os.stat("/proc/self/ns/pid").st_ino,
        "ns": {n: os.stat(f"/proc/self/ns/{n}").st_ino == TEST_NS.get(n)
               for n in sorted(os.listdir("/proc/self/ns"))},
        "cgroup": sorted(_read("/proc/self/cgroup").splitlines()),
        "status": {k: " ".join(_status.get(k, "").split()) for k in (
            "Umask", "Uid", "Gid", "Groups", "NoNewPrivs", "Seccomp", "Seccomp_filters",
            "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
        "rlimits": {n: resource.getrlimit(getattr(resource, n))
                    for n in sorted(dir(resource)) if n.startswith("RLIMIT_")},
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "oom_score_adj": _read("/proc/self/oom_score_adj"),
        "affinity": sorted(os.sched_getaffinity(0)), "scheduler": os.sched_getscheduler(0),
        "ioprio": _ioprio(), "timerslack": _prctl(30), "pdeathsig": _prctl(2, True),
        "dumpable": _prctl(3), "securebits": _prctl(27), "subreaper": _prctl(37, True),
        "lsm": _read("/proc/self/attr/current"), "cwd": os.getcwd(),
        "secret": _read(SECRET) if SECRET else None,
    }))
""")
PER_PROCESS = ("pid", "pidns")  # differ between any two starts
BARE = {"KERNEL_BOOTSTRAP_KERNEL_SERVER": "0"}


def context(kernel: kernels.Started, secret: Path | None = None) -> dict[str, Any]:
    ns = {n: os.stat(f"/proc/self/ns/{n}").st_ino for n in os.listdir("/proc/self/ns")}
    code = f"TEST_NS = {ns!r}\nSECRET = {str(secret) if secret else None!r}\n{CONTEXT}"
    reply, printed = kernels.execute(kernel, code)
    assert reply["status"] == "ok", reply
    return json.loads(printed)  # type: ignore[no-any-return]


def wrapped(name: str, prefix: list[str], config: Path | None = None) -> str:
    """A kernelspec ``name``: the installed one's argv behind ``prefix`` (and with another
    ``--config``)."""
    specs = Path(os.environ["JUPYTER_DATA_DIR"], "kernels")
    spec = json.loads((specs / SPEC / "kernel.json").read_text(encoding="utf-8"))
    argv = list(spec["argv"])
    if config is not None:
        argv[argv.index("--config") + 1] = str(config)
    spec["argv"] = [*prefix, *argv]
    (specs / name).mkdir()
    (specs / name / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return name


def shell(script: str) -> list[str]:
    """``sh -c SCRIPT sh`` before a kernelspec's argv: ``SCRIPT`` ends with ``exec "$@"``."""
    return ["sh", "-c", script, "sh"]


@contextlib.contextmanager
def running(spec: str, *, bare: bool, ipc: Path | None = None,
            **popen: Any) -> Iterator[kernels.Started]:
    """A kernel of ``spec`` (bare: the server switched off), over TCP or, with ``ipc``, over
    unix sockets named from there (a kernel in another network namespace is reachable so)."""
    env = {**os.environ, **(BARE if bare else {})}
    if ipc is None:
        with kernels.running(spec, env=env, **popen) as kernel:
            yield kernel
        return
    from jupyter_client.manager import KernelManager

    ipc.mkdir(exist_ok=True)
    manager = KernelManager(kernel_name=spec, transport="ipc", ip=str(ipc / uuid.uuid4().hex[:8]))
    manager.start_kernel(env=env, **popen)
    try:
        info = kernels.first_reply(manager)
        yield kernels.Started(manager, manager.provisioner.pid, 0.0, info)  # type: ignore[union-attr]
    finally:
        manager.shutdown_kernel(now=True)


def served_and_bare(spec: str, secret: Path | None = None, ipc: Path | None = None,
                    ) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The context of a kernel of ``spec`` offered to the running server, that of a bare one,
    and the pid jupyter_client launched for the first."""
    with running(spec, bare=False, ipc=ipc) as kernel:
        offered, launched = context(kernel, secret), kernel.pid
    with running(spec, bare=True, ipc=ipc) as kernel:
        bare = context(kernel, secret)
        assert bare["pid"] in (kernel.pid, 1), "the bare start was served"
    return offered, bare, launched


def assert_same(offered: dict[str, Any], bare: dict[str, Any]) -> None:
    differ = {k: {"offered": offered[k], "bare": bare[k]}
              for k in bare if k not in PER_PROCESS and offered.get(k) != bare[k]}
    assert differ == {}


def need(tool: str) -> None:
    if shutil.which(tool) is None or os.getuid() != 0:
        pytest.skip(f"needs root and {tool}")


# --- item 1: a wrapped kernelspec argv -------------------------------------------------------


def test_item1_a_mount_namespace_hides_a_secret_from_the_kernel_offered_to_a_server(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    need("unshare")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("top secret")
    first_start(kernel_world)
    spec = wrapped("kb-mnt", ["unshare", "-m", *shell(
        f"mount -t tmpfs none {shlex.quote(str(secret))} && exec \"$@\"")])
    offered, bare, launched = served_and_bare(spec, secret / "key")
    assert offered["pid"] == launched, "forked by the server: not in the wrapper's namespace"
    assert offered["secret"] == bare["secret"] == "errno 2"
    assert offered["ns"]["mnt"] is False
    assert_same(offered, bare)


def test_item1_b_limits_umask_and_nice_of_the_wrapper_reach_the_kernel(
        kernel_world: RealWorld) -> None:
    first_start(kernel_world)
    spec = wrapped("kb-limits", shell(
        'umask 077; ulimit -n 256; ulimit -v 4000000; exec nice -n 5 "$@"'))
    offered, bare, launched = served_and_bare(spec)
    # As set (ulimit -v counts KiB), and what the kernel offered to the server sees too.
    assert (bare["status"]["Umask"], bare["rlimits"]["RLIMIT_NOFILE"],
            bare["rlimits"]["RLIMIT_AS"], bare["nice"]) == ("0077", [256] * 2,
                                                            [4000000 * 1024] * 2, 5)
    assert_same(offered, bare)
    # What a process may set for itself is applied in the fork (issue 35, item 1): served.
    assert offered["pid"] != launched, "not served"


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A new cgroup v1 memory cgroup, removed at the end (once the kernels in it are gone)."""
    group = Path("/sys/fs/cgroup/memory", f"kb-test-{uuid.uuid4().hex[:12]}")
    try:
        group.mkdir()
    except OSError as e:
        pytest.skip(f"the cgroup v1 memory hierarchy is not writable here: {e}")

    own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
               if ":memory:" in line)

    def removed() -> bool:
        # Whatever is left (a kernel still dying; a leak, which the orphan check still sees)
        # goes back to the test's own cgroup, so that the new one can go.
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                Path(group.parent, own.lstrip("/"), "cgroup.procs").write_text(pid)
        try:
            group.rmdir()
        except OSError:
            return False
        return True
    try:
        yield group
    finally:
        wait_for(removed, timeout=30)


def test_item1_c_the_kernel_is_in_the_wrappers_memory_cgroup(
        kernel_world: RealWorld, memory_cgroup: Path) -> None:
    first_start(kernel_world)
    procs = shlex.quote(str(memory_cgroup / "cgroup.procs"))
    spec = wrapped("kb-cgroup", shell(f'echo $$ > {procs} && exec "$@"'))
    offered, bare, launched = served_and_bare(spec)
    assert offered["pid"] == launched, "forked by the server: not in the wrapper's cgroup"
    memory = [line for line in offered["cgroup"] if ":memory:" in line]
    assert [line.split(":", 2)[2] for line in memory] == [f"/{memory_cgroup.name}"], memory
    assert_same(offered, bare)


def test_item1_d_a_kernel_in_its_own_network_namespace_answers_from_there(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    # Over unix sockets: a kernel in a new network namespace binds no TCP port we could reach
    # (its loopback is its own, and down), bare or not.
    need("unshare")
    first_start(kernel_world)
    spec = wrapped("kb-net", ["unshare", "-n"])
    offered, bare, launched = served_and_bare(spec, ipc=tmp_path / "ipc")
    assert offered["pid"] == launched, "forked by the server: not in the wrapper's namespace"
    assert offered["ns"]["net"] is False
    assert_same(offered, bare)


# Without --mount-proc: it would also make a mount namespace, which a server refuses by itself;
# this way only the PID namespace differs, so the server must look at that one.
PIDNS = ["unshare", "--pid", "--fork"]


def test_item1_e_a_kernel_in_its_own_pid_namespace_stays_in_it(kernel_world: RealWorld) -> None:
    need("unshare")
    first_start(kernel_world)
    offered, bare, _ = served_and_bare(wrapped("kb-pidns", PIDNS))
    assert offered["ns"]["pid"] is False
    assert offered["pid"] == bare["pid"] == 1  # the process unshare forked: its namespace's
    assert_same(offered, bare)


def _stats() -> dict[int, tuple[str, int]]:
    """State and parent of every process (zombies included), by pid."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            found[int(entry)] = (fields[0], int(fields[1]))
    return found


def _in_pidns(ino: int) -> list[int]:
    pids = []
    for pid in _stats():
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}/ns/pid").st_ino == ino:
                pids.append(pid)
    return pids


def test_item1_e_item2_a_first_start_in_a_pid_namespace_without_init_leaves_no_zombie(
        kernel_world: RealWorld) -> None:
    # No server yet: the first start, inside the namespace, spawns one (if it spawns any),
    # whose parent after its intermediate exits is the namespace's PID 1, the kernel itself,
    # which reaps nobody. It idles out after 3 s.
    need("unshare")
    text = kernel_world.config.read_text(encoding="utf-8")
    kernel_world.config.write_text(text + "kernel-idle-timeout = 3\n", encoding="utf-8")
    spec = wrapped("kb-pidns", PIDNS)
    with running(spec, bare=False) as kernel:
        inner = [pid for pid, (_, ppid) in _stats().items() if ppid == kernel.pid]
        assert len(inner) == 1, inner  # what unshare forked: the kernel (an ordinary start)
        ino = os.stat(f"/proc/{inner[0]}/ns/pid").st_ino
        seen: set[int] = set()

        def others_gone() -> bool:
            others = [p for p in _in_pidns(ino) if p != inner[0] and alive(p)]
            seen.update(others)
            return not others
        wait_for(others_gone, timeout=120)
        zombies = [pid for pid, (state, ppid) in _stats().items()
                   if state == "Z" and ppid == inner[0]]
        assert zombies == [], f"zombies of the kernel (PID 1 of its namespace): {zombies}"
        assert context(kernel)["pid"] == 1  # and it still answers
    left = [pid for pid, (state, ppid) in _stats().items() if state == "Z"
            and (pid in seen or ppid in (kernel.pid, inner[0]))]
    assert left == []


# --- item 2: the server's own context is neutral ---------------------------------------------

WHICH_SQLITE = "import sqlite3, json; print(json.dumps([sqlite3.__file__, sqlite3.sqlite_version]))"


# A scratch `sqlite3.py` that imports (the server would keep it in sys.modules for every kernel),
# and one that fails to (IPython imports sqlite3 lazily: nothing is kept of it).
@pytest.mark.parametrize("shadowing", ["SHADOWED = True\n", 'raise ImportError("shadowed")\n'],
                         ids=["imports", "fails"])
def test_item2_a_module_in_the_first_starts_directory_breaks_no_later_kernel(
        kernel_world: RealWorld, tmp_path: Path, shadowing: str) -> None:
    shadow, elsewhere = tmp_path / "shadow", tmp_path / "elsewhere"
    shadow.mkdir()
    elsewhere.mkdir()
    (shadow / "sqlite3.py").write_text(shadowing)
    # The first start itself is a bare start in that directory: whatever it makes of the
    # module there is its own business (it may even fail).
    with contextlib.suppress(RuntimeError, TimeoutError), \
            running(SPEC, bare=False, cwd=str(shadow)):
        pass
    wait_for(lambda: kernelserver.find(os.environ[reaper.TAG]) is not None, timeout=60)
    wait_for_server(kernel_world)
    found = []
    for bare in (False, True):
        with running(SPEC, bare=bare, cwd=str(elsewhere)) as kernel:
            reply, printed = kernels.execute(kernel, WHICH_SQLITE)
            assert reply["status"] == "ok", reply
            found.append(json.loads(printed))
    assert found[0] == found[1]
    assert not found[0][0].startswith(str(shadow))


def test_item2_a_descriptor_the_first_launcher_inherited_is_not_held_by_the_server(
        kernel_world: RealWorld) -> None:
    r, w = os.pipe()
    try:
        with running(SPEC, bare=False, pass_fds=(w,)) as kernel:
            assert context(kernel)["pid"] == kernel.pid  # the first start: ordinary
        os.close(w)
        server = wait_for_server(kernel_world)
        os.set_blocking(r, False)

        def eof() -> bool:
            try:
                return os.read(r, 1) == b""
            except BlockingIOError:
                return False
        wait_for(eof, timeout=60)
        assert alive(server)
    finally:
        os.close(r)
        with contextlib.suppress(OSError):
            os.close(w)


# --- item 3: never stale, by hand or by another config -----------------------------------------

VERSION = "import traitlets; print(traitlets.__version__)"


def test_item3_a_by_hand_install_reaches_the_next_kernel(kernel_world: RealWorld) -> None:
    import uv

    first_start(kernel_world)
    python = str(kernel_world.venv / "bin" / "python")
    installed = subprocess.run([python, "-c", VERSION], capture_output=True, text=True,
                               check=True).stdout.strip()
    wanted = "5.14.2" if installed != "5.14.2" else "5.14.1"
    install = [uv.find_uv_bin(), "pip", "install", "--python", python, f"traitlets=={wanted}"]
    done = subprocess.run([*install, "--offline"], capture_output=True, text=True, check=False)
    if done.returncode != 0:  # not in the cache: from the index
        done = subprocess.run(install, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    found = []
    for bare in (False, True):
        with running(SPEC, bare=bare) as kernel:
            found.append(kernels.execute(kernel, VERSION)[1].strip())
    assert found == [wanted, wanted]


def site_packages(world: RealWorld) -> Path:
    return next(world.venv.glob("lib/python*/site-packages"))


MODULES = "import sys, os, json; print(json.dumps([sorted(sys.modules), dict(os.environ)]))"


def test_item3_a_config_without_preload_gets_none_from_another_configs_server(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    (site_packages(kernel_world) / "kb_mark_a.py").write_text(
        'import os\nos.environ["KB_PRELOADED"] = "a"\n')
    other = tmp_path / "other" / "kernel-bootstrap.toml"
    other.parent.mkdir()
    other.write_text(kernel_world.config.read_text(encoding="utf-8").replace(
        'venv = "venv"', f"venv = {json.dumps(str(kernel_world.venv))}").replace(
        '"skills/*"', json.dumps(str(kernel_world.skills_dir / "*")))
        + 'kernel-preload = ["kb_mark_a"]\n', encoding="utf-8")
    spec = wrapped("kb-other-config", [], config=other)
    with running(spec, bare=False):
        pass  # the first start: the server of the other config, with its preload
    server = wait_for_server(kernel_world)
    with running(spec, bare=False) as kernel:
        served(kernel, server)
        modules, _ = json.loads(kernels.execute(kernel, MODULES)[1])
        assert "kb_mark_a" in modules  # the other config's kernels get its preload
    with running(SPEC, bare=False) as kernel:
        modules, environ = json.loads(kernels.execute(kernel, MODULES)[1])
    assert "kb_mark_a" not in modules
    assert "KB_PRELOADED" not in environ


# --- item 4: preload is fork-safe or not used ----------------------------------------------


def preloading(world: RealWorld, name: str, source: str, extra: str = "") -> None:
    """``name`` (``source``) in the venv's site-packages and in ``kernel-preload``."""
    (site_packages(world) / f"{name}.py").write_text(textwrap.dedent(source))
    world.write_config(requirements=["ipykernel>=6"], kernel_preload=[name])
    if extra:
        world.config.write_text(world.config.read_text(encoding="utf-8") + extra,
                                encoding="utf-8")


LOCKER = """\
    import threading
    l, release, held = threading.Lock(), threading.Event(), threading.Event()
    def _hold():
        with l:
            held.set()
            release.wait()
    threading.Thread(target=_hold, daemon=True).start()
    held.wait()
"""


def test_item4_a_preload_that_leaves_a_thread_holding_a_lock_means_no_serving(
        kernel_world: RealWorld) -> None:
    # Released on request by the thread that holds it: a bare kernel gets the lock; a fork, in
    # which that thread does not exist, would wait for ever.
    preloading(kernel_world, "kb_locker", LOCKER)
    first_start(kernel_world)
    with running(SPEC, bare=False) as kernel:
        reply, printed = kernels.execute(
            kernel, "import kb_locker, os; kb_locker.release.set(); "
                    "print(kb_locker.l.acquire(timeout=5), os.getpid())", timeout=30)
        assert reply["status"] == "ok", reply
        assert printed.split() == ["True", str(kernel.pid)]  # and an ordinary start
    answer = kernel_world.status()["kernel_server"]
    assert answer is not None and answer["serving"] is False, answer
    reason = answer["not_serving"]
    assert isinstance(reason, str) and reason
    text = kernel_world.run("status").stdout
    assert "not serving" in text and reason in text, text


def test_item4_a_preload_that_blocks_is_given_up_after_the_preload_timeout(
        kernel_world: RealWorld) -> None:
    from bootstrap.kernels import places

    preloading(kernel_world, "kb_blocker", "import time\ntime.sleep(1e9)\n",
               extra="kernel-preload-timeout = 2\n")
    directory = places.server_dir(str(kernel_world.venv))
    assert directory is not None
    lock = os.path.join(directory, places.LOCK)
    tag = os.environ[reaper.TAG]
    with running(SPEC, bare=False) as kernel:
        # The server this first start spawned (it takes its lock first): found while it blocks.
        wait_for(lambda: kernelserver.find(tag) is not None, timeout=60)
        server = kernelserver.find(tag)
        assert server is not None
        assert context(kernel)["pid"] == kernel.pid
    wait_for(lambda: not alive(server.pid) and not places.server_running(lock), timeout=120)
    with running(SPEC, bare=False) as kernel:
        assert context(kernel)["pid"] == kernel.pid  # still an ordinary start


def test_item4_the_requests_environment_wins_over_what_preload_set(
        kernel_world: RealWorld) -> None:
    preloading(kernel_world, "kb_setdefault",
               'import os\nos.environ.setdefault("KB_X", "preload")\n')
    server = first_start(kernel_world)
    with kernels.running(SPEC, env={**os.environ, "KB_X": "request"}) as kernel:
        served(kernel, server)
        assert kernels.execute(kernel, "import os; print(os.environ['KB_X'])")[1] == "request\n"


def test_item4_a_file_preload_opened_stays_valid_in_the_kernel(
        kernel_world: RealWorld, tmp_path: Path) -> None:
    preloading(kernel_world, "kb_logger", f"LOG = open({str(tmp_path / 'log')!r}, 'a')\n")
    server = first_start(kernel_world)
    with running(SPEC, bare=False) as kernel:
        served(kernel, server)
        # Its descriptor is still that file (or /dev/null), not a number the kernel reused.
        reply, printed = kernels.execute(kernel, "import kb_logger, os; print(os.readlink("
                                         "f'/proc/self/fd/{kb_logger.LOG.fileno()}'))")
        assert reply["status"] == "ok", reply
        assert printed.strip() in (str(tmp_path / "log"), os.devnull)
        reply, _ = kernels.execute(kernel, "kb_logger.LOG.close()", timeout=30)
        assert reply["status"] == "ok", reply
        reply, printed = kernels.execute(kernel, "print(1 + 1)", timeout=30)
        assert reply["status"] == "ok" and printed == "2\n"

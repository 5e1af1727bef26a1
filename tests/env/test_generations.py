"""Generations behind the stable venv path (fake uv): the flip, the pin, removal only when no
process uses a generation, the conversion of a plain-directory venv, and what status and gc say.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.processes import wait_for
from testing.world import World

RUNTIME = ["requests>=2"]
NEW_RUNTIME = ["requests>=2", "six"]
PLAIN = {"KERNEL_BOOTSTRAP_NO_GENERATIONS": "1"}
# Prints where it runs from, then waits: a kernel that started before a rebuild.
KERNEL = ("import sys, time; print(sys.prefix, sys.executable, flush=True); "
          "[print(line.strip(), flush=True) for line in iter(sys.stdin.readline, '')]")


def generations(w: World) -> list[str]:
    return sorted(n for n in os.listdir(w.root) if n.startswith(".venv.gen-"))


def current(w: World) -> Path:
    target = os.readlink(w.venv)
    assert "/" not in target and target.startswith(".venv.gen-"), target
    return w.root / target


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path / "w")
    w.write_config(requirements=RUNTIME)
    w.skill("alpha")
    w.ensure()
    return w


@pytest.fixture
def kernel(world: World) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([str(world.python), "-c", KERNEL], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # started: its pin holds the lock
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_the_venv_is_a_link_to_its_only_generation(world: World) -> None:
    gen = current(world)
    assert generations(world) == [gen.name]
    assert (gen / "pyvenv.cfg").is_file() and (gen / ".in-use").is_file()
    result = world.ensure()
    assert result.stdout.strip() == str(world.venv / "bin" / "python")


def test_a_process_is_pinned_to_the_real_path_of_its_generation(world: World) -> None:
    gen = current(world)
    done = subprocess.run(
        [str(world.python), "-c", "import sys, alpha, site; "
         "print(sys.prefix); print(sys.exec_prefix); print(sys.executable); "
         "print(site.getsitepackages()[0]); print([p for p in sys.path if 'venv' in p])"],
        capture_output=True, text=True, check=True)
    prefix, exec_prefix, executable, site_dir, paths = done.stdout.splitlines()
    assert prefix == exec_prefix == str(gen)
    assert executable == str(gen / "bin" / "python")
    assert site_dir.startswith(str(gen) + "/")
    assert "/venv/" not in paths and str(gen) in paths


def test_each_pth_of_a_generation_runs_once_and_its_paths_are_re_pointed(
        world: World, tmp_path: Path) -> None:
    # CPython's site processes a venv's site-packages twice; the pin has the second pass leave
    # it out, after re-pointing what the other .pth files (a skill's, say) added.
    gen = current(world)
    [site_dir] = gen.glob("lib/python*/site-packages")
    (site_dir / "data").mkdir()
    count = tmp_path / "count"
    (site_dir / "zz-counter.pth").write_text(
        f"import sys; open({str(count)!r}, 'a').write('x')\ndata\n")
    done = subprocess.run([str(world.python), "-c",
                           "import json, sys; print(json.dumps(sys.path))"],
                          capture_output=True, text=True, check=True)
    path = json.loads(done.stdout)
    assert count.read_text() == "x"
    assert len(path) == len(set(path))
    assert [p for p in path if p.startswith(str(gen))] == [str(site_dir), str(site_dir / "data")]
    assert not [p for p in path if p.startswith(str(world.venv) + "/")]


def test_a_kernel_that_collects_in_process_keeps_its_own_generation(world: World) -> None:
    # A library call inside a kernel: its own record lock would not conflict with its own
    # test, and closing the file would drop it; the generation it runs from is kept, and stays
    # in use to everyone else.
    old = current(world)
    code = ("import sys\n"
            "sys.stdin.readline()\n"  # wait for the rebuild
            f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
            "from pathlib import Path\n"
            "from bootstrap.env.generations import remove_unused\n"
            f"done = remove_unused(Path({str(world.venv)!r}))\n"
            "print([str(p) for p in done.removed], [str(p) for p in done.kept], flush=True)\n"
            "sys.stdin.readline()\n")
    proc = subprocess.Popen([str(world.python), "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        wait_for(lambda: _in_use(world))
        world.write_config(requirements=NEW_RUNTIME)
        world.ensure()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == ["[]", f"['{old}']"]
        assert old.is_dir()
        assert world.status()["generation"]["others"] == [{"path": str(old), "in_use": True}]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to start a kernel as another user")
def test_a_kernel_of_another_user_holds_the_generation_by_flock() -> None:
    # The .in-use file is not the other user's to write: their pin takes a shared flock.
    root = Path(tempfile.mkdtemp(prefix="kb-other-user-"))  # pytest's tmp is root's alone
    try:
        os.chmod(root, 0o755)
        world = World(root / "w")
        world.write_config(requirements=RUNTIME)
        world.ensure()
        old = current(world)
        proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                 str(world.python), "-c", KERNEL], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        try:
            assert proc.stdout.readline().split()[0] == str(old)
            world.write_config(requirements=NEW_RUNTIME)
            world.ensure()
            assert world.status()["generation"]["others"] == [{"path": str(old),
                                                               "in_use": True}]
            gc = json.loads(world.run("gc", "--json").stdout)
            assert gc["generations"]["in_use"] == [str(old)]
        finally:
            proc.kill()
            proc.wait()
        gc = json.loads(world.run("gc", "--json").stdout)
        assert gc["generations"]["removed"] == [str(old)]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_rebuild_flips_the_link_and_removes_the_unused_old_generation(world: World) -> None:
    old = current(world)
    world.write_config(requirements=NEW_RUNTIME)
    result = world.ensure("--json")
    assert json.loads(result.stdout)["action"] == "rebuild"
    assert current(world) != old
    assert generations(world) == [current(world).name]  # nothing used the old one


def test_a_running_kernel_keeps_its_generation_until_it_exits(
        world: World, kernel: subprocess.Popen[str]) -> None:
    old = current(world)
    world.write_config(requirements=NEW_RUNTIME)
    world.ensure()
    new = current(world)
    assert new != old and generations(world) == sorted([old.name, new.name])
    status = world.status()["generation"]
    assert status == {"current": str(new), "others": [{"path": str(old), "in_use": True}]}
    # The kernel still imports from its own generation, whose files are all still there.
    assert kernel.stdin is not None and kernel.stdout is not None
    kernel.stdin.write("x\n")
    kernel.stdin.flush()
    assert kernel.stdout.readline().strip() == "x"
    done = subprocess.run([str(old / "bin" / "python"), "-c",
                           "import alpha, sys; print(sys.prefix)"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(old)
    gc = json.loads(world.run("gc", "--json").stdout)
    assert gc["generations"] == {"removed": [], "in_use": [str(old)]}
    assert old.is_dir()
    kernel.stdin.close()
    kernel.wait(timeout=10)
    gc = json.loads(world.run("gc", "--json").stdout)
    assert gc["generations"] == {"removed": [str(old)], "in_use": []}
    assert generations(world) == [new.name]
    assert world.status()["generation"] == {"current": str(new), "others": []}


# Started before a rebuild; after it, says where a runtime module comes from and whether
# the new generation's six is visible.
_ALIAS_KERNEL = ("import os, sys\n"
                 "print(sys.prefix, flush=True)\n"
                 "sys.stdin.readline()\n"  # wait for the rebuild
                 "import requests\n"
                 "print(os.path.realpath(requests.__file__), flush=True)\n"
                 "try:\n"
                 "    import six\n"
                 "    print('six', flush=True)\n"
                 "except ImportError:\n"
                 "    print('no six', flush=True)\n"
                 "sys.stdin.readline()\n")


@pytest.mark.parametrize("spelled", ["absolute", "relative", "two links"])
def test_a_kernel_started_through_an_alias_of_the_venv_keeps_its_generation(
        world: World, tmp_path: Path, spelled: str) -> None:
    # /opt/kernel -> <venv>, started as /opt/kernel/bin/python: one readlink gave <venv>, and
    # after a rebuild the process imported the new generation's files holding the old lock.
    old = current(world)
    opt = tmp_path / "opt"
    opt.mkdir()
    alias = opt / "kernel"
    if spelled == "absolute":
        alias.symlink_to(world.venv)
    elif spelled == "relative":
        alias.symlink_to(Path("..") / world.root.name / world.venv.name)
    else:
        (opt / "inner").symlink_to(world.venv)
        alias.symlink_to("inner")
    proc = subprocess.Popen([str(alias / "bin" / "python"), "-c", _ALIAS_KERNEL],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        prefix = Path(proc.stdout.readline().strip())  # the generation, through no link
        assert not prefix.is_symlink() and prefix.resolve() == old.resolve()
        world.write_config(requirements=NEW_RUNTIME)
        world.ensure()
        assert current(world) != old and world.imports("six")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip().startswith(f"{old.resolve()}/")
        assert proc.stdout.readline().strip() == "no six"
        gc = json.loads(world.run("gc", "--json").stdout)
        assert gc["generations"] == {"removed": [], "in_use": [str(old)]}
        assert old.is_dir()
    finally:
        proc.kill()
        proc.wait()
    gc = json.loads(world.run("gc", "--json").stdout)
    assert gc["generations"]["removed"] == [str(old)]


def test_a_sigkilled_kernel_leaves_no_reference_behind(
        world: World, kernel: subprocess.Popen[str]) -> None:
    old = current(world)
    world.write_config(requirements=NEW_RUNTIME)
    world.ensure()
    assert old.is_dir()
    kernel.send_signal(signal.SIGKILL)
    kernel.wait(timeout=10)
    assert world.status()["generation"]["others"] == [{"path": str(old), "in_use": False}]
    gc = world.run("gc")
    assert gc.returncode == 0 and f"removed generation {old}" in gc.stdout
    assert not old.exists()


def test_a_forked_child_holds_the_generation_with_its_parent(world: World) -> None:
    old = current(world)
    script = ("import os, time\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    os.close(1); os.close(2); time.sleep(60); os._exit(0)\n"
              "print(pid, flush=True)\n")
    done = subprocess.run([str(world.python), "-c", script], capture_output=True, text=True,
                          check=True, timeout=30)
    child = int(done.stdout)  # the parent has exited; its forked child sleeps on
    try:
        world.write_config(requirements=NEW_RUNTIME)
        world.ensure()
        assert old.is_dir()
        assert world.status()["generation"]["others"] == [{"path": str(old), "in_use": True}]
    finally:
        os.kill(child, signal.SIGKILL)
    wait_for(lambda: world.status()["generation"]["others"][0]["in_use"] is False)


# Daemonising code: every descriptor closed, its own log opened in their place.
_REUSE = """\
import os, sys
def target(n):
    try:
        return os.readlink(f"/proc/self/fd/{n}")
    except OSError:
        return ""
[pin] = [n for n in range(3, 1024) if target(n).endswith("/.in-use")]
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.dup2(log, pin)  # the pin's descriptor is closed, the log now has its number
os.close(log)
os.write(pin, b"12345678")
for _ in range(5):
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
print(os.lseek(pin, 0, os.SEEK_CUR), flush=True)
os.write(pin, b"abcdefgh")
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="finds the pin's fd in /proc")
def test_a_fork_leaves_alone_a_file_opened_in_place_of_the_pins_descriptor(
        world: World, tmp_path: Path) -> None:
    # The at-fork handler used to seek and lock its descriptor by number: the log's offset
    # moved to each child's pid (a log grew to 26 kB for 8 bytes written).
    log = tmp_path / "daemon.log"
    done = subprocess.run([str(world.python), "-c", _REUSE, str(log)], capture_output=True,
                          text=True, check=True, timeout=60)
    assert done.stdout.strip() == "8"
    assert log.read_bytes() == b"12345678abcdefgh"


def test_children_through_sys_executable_share_it_and_through_the_link_get_the_current(
        world: World) -> None:
    old = current(world)
    code = ("import subprocess, sys\n"
            "sys.stdin.readline()\n"  # wait for the rebuild
            "args = ['-c', 'import sys; print(sys.prefix)']\n"
            f"for exe in (sys.executable, {str(world.python)!r}):\n"
            "    print(subprocess.run([exe, *args], capture_output=True, text=True).stdout,"
            " end='')\n")
    proc = subprocess.Popen([str(world.python), "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    wait_for(lambda: world.status()["generation"]["current"] == str(old) and _in_use(world))
    world.write_config(requirements=NEW_RUNTIME)
    world.ensure()
    out, _ = proc.communicate("go\n", timeout=30)
    assert out.splitlines() == [str(old), str(current(world))]
    assert current(world) != old


def _in_use(world: World) -> bool:
    # The process has pinned itself once its generation shows as in use to another process.
    done = subprocess.run([sys.executable, "-c", "import sys\n"
                           "from bootstrap.env.generations import in_use\n"
                           "sys.exit(in_use(__import__('pathlib').Path(sys.argv[1])))\n",
                           str(current(world))], check=False)
    return done.returncode == 1


def test_repair_force_while_a_kernel_runs_keeps_its_generation(
        world: World, kernel: subprocess.Popen[str]) -> None:
    old = current(world)
    result = world.run("repair", "--force")
    assert result.returncode == 0, result.stderr
    assert current(world) != old and old.is_dir()
    kernel.kill()
    kernel.wait()
    assert world.run("gc").returncode == 0
    assert generations(world) == [current(world).name]


def test_a_plain_directory_venv_of_ours_becomes_the_first_generation_without_a_rebuild(
        tmp_path: Path) -> None:
    w = World(tmp_path / "w")
    w.write_config(requirements=RUNTIME)
    w.skill("alpha")
    w.ensure(env=PLAIN)
    assert w.venv.is_dir() and not w.venv.is_symlink()
    inode = os.stat(w.venv / ".bootstrap-version").st_ino
    w.clear_log()
    result = w.ensure("--json")
    assert json.loads(result.stdout)["action"] == "ready"
    assert w.uv_calls() == []  # no rebuild, no install: the same tree, moved
    gen = current(w)
    assert os.stat(gen / ".bootstrap-version").st_ino == inode
    assert (gen / ".in-use").is_file()
    assert w.imports("alpha")
    done = subprocess.run([str(w.python), "-c", "import sys; print(sys.prefix)"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(gen)


def test_without_exchange_a_plain_directory_stays_one_and_still_works(tmp_path: Path) -> None:
    w = World(tmp_path / "w")
    w.write_config(requirements=RUNTIME)
    w.ensure(env=PLAIN)
    result = w.ensure(env={"KERNEL_BOOTSTRAP_NO_EXCHANGE": "1"})
    assert result.stdout.strip() == str(w.python)
    assert w.venv.is_dir() and not w.venv.is_symlink() and generations(w) == []
    # A rebuild there uses the staged swap, as before generations.
    w.write_config(requirements=NEW_RUNTIME)
    w.ensure(env={"KERNEL_BOOTSTRAP_NO_EXCHANGE": "1"})
    assert w.venv.is_dir() and not w.venv.is_symlink() and w.imports("six")


def test_a_link_someone_else_made_is_refused(tmp_path: Path) -> None:
    w = World(tmp_path / "w")
    w.write_config(requirements=RUNTIME)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    w.venv.symlink_to(elsewhere)
    result = w.ensure(ok=False)
    assert result.returncode == 2
    assert f"{w.venv} is a symbolic link kernel-bootstrap did not make" in result.stderr
    assert os.readlink(w.venv) == str(elsewhere) and os.listdir(elsewhere) == []


def test_status_is_read_only_about_generations(world: World,
                                               kernel: subprocess.Popen[str]) -> None:
    world.write_config(requirements=NEW_RUNTIME)
    world.ensure()
    before = {p: os.stat(world.root / p).st_mtime_ns for p in generations(world)}
    text = world.run("status")
    assert "generation: " + str(current(world)) in text.stdout
    assert "(in use)" in text.stdout
    assert {p: os.stat(world.root / p).st_mtime_ns for p in generations(world)} == before


def test_a_snapshot_written_from_a_generation_restores_into_a_new_generation(
        tmp_path: Path) -> None:
    w = World(tmp_path / "w")
    w.write_config(requirements=RUNTIME, snapshots="store")
    w.skill("alpha")
    w.ensure()
    [archive] = (w.root / "store").glob("*.tar")
    names = subprocess.run(["tar", "-tf", str(archive)], capture_output=True, text=True,
                           check=True).stdout.split()
    assert "venv/pyvenv.cfg" in names and "venv/.in-use" not in names  # the tree, not the link
    other = w.root / "other"
    w.clear_log()
    result = w.ensure("--json", env={"KERNEL_BOOTSTRAP_VENV": str(other)})
    assert json.loads(result.stdout)["action"] == "rebuild" and w.uv_calls() == []
    gen = w.root / os.readlink(other)
    assert gen.name.startswith(".other.gen-") and (gen / ".in-use").is_file()
    done = subprocess.run([str(other / "bin" / "python"), "-c",
                           "import sys, alpha; print(sys.prefix)"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(gen)
    assert not list(w.root.glob(".other.stage-*"))

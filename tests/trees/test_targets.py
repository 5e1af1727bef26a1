"""The exec transport's parts: the tar stream, the remote script (also under busybox), quoting."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bootstrap.errors import ConfigError
from bootstrap.trees.push import load_trees, push_sync
from bootstrap.trees.targets import (
    COMPLETE_MARKER,
    ExecTarget,
    LocalTarget,
    remote_dest,
    tar_stream,
    target_for,
)
from testing.skills import make_skill
from tests.trees.test_push import (
    REPO,
    SKILLS,
    assert_one_complete_version,
    no_staging_left,
    push_concurrently,
    versions,
)


def test_tar_stream_holds_every_entry_with_mode_mtime_and_links(tmp_path: Path) -> None:
    src = make_skill(tmp_path, "tool", {"bin/run": "echo", "ü/long" + "x" * 120: "pax"},
                     executables=["bin/run"])
    (src / "link").symlink_to("bin/run")
    os.utime(src / "bin/run", ns=(1_700_000_000_500_000_000,) * 2)
    [tree] = load_trees([src])

    data = b"".join(tar_stream([tree]))

    assert len(data) % tarfile.RECORDSIZE == 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert list(members)[-1] == COMPLETE_MARKER  # last, so its presence means "complete"
        assert members["tool"].isdir()
        run = members["tool/bin/run"]
        assert (run.mode, run.mtime, run.uid, run.uname) == (0o755, 1_700_000_000, 0, "")
        assert members["tool/link"].issym() and members["tool/link"].linkname == "bin/run"
        long_name = "tool/ü/long" + "x" * 120
        reader = tar.extractfile(members[long_name])
        assert reader is not None and reader.read() == b"pax"


def test_tar_stream_pieces_stay_bounded_by_the_chunk(tmp_path: Path) -> None:
    src = make_skill(tmp_path, "tool", {f"s{i}": "small" for i in range(50)})
    (src / "big").write_bytes(os.urandom(5 * 65536 + 17))
    [tree] = load_trees([src])

    pieces = list(tar_stream([tree], chunk=65536))

    assert max(map(len, pieces)) <= 2 * 65536
    assert len(pieces) < 20  # small members are coalesced, not one write each


def test_runtime_registry() -> None:
    assert isinstance(target_for(None), LocalTarget)
    rt = target_for("kubectl exec -i 'my pod' --")
    assert isinstance(rt, ExecTarget)
    assert rt.argv == ("kubectl", "exec", "-i", "my pod", "--")
    assert rt.name == "kubectl exec -i 'my pod' --"


def test_ssh_gets_the_command_as_one_quoted_line() -> None:
    plain = ExecTarget(("docker", "exec", "-i", "box")).command("echo 'a b'")
    assert plain == ("docker", "exec", "-i", "box", "sh", "-c", "echo 'a b'")
    ssh = ExecTarget(("/usr/bin/ssh", "-T", "host")).command("echo 'a b'")
    assert ssh[:3] == ("/usr/bin/ssh", "-T", "host") and len(ssh) == 4
    assert ssh[3] == "sh -c 'echo '\"'\"'a b'\"'\"''"


@pytest.mark.parametrize(("given", "used"), [
    ("/skills/", "/skills"), ("a/../b", "b"), ("-odd", "./-odd"), ("~/x/", "~/x"),
])
def test_remote_dest_is_normalised(given: str, used: str) -> None:
    assert remote_dest(given) == used


@pytest.mark.parametrize("bad", ["", "/", "a\0b"])
def test_remote_dest_refuses_unusable_paths(bad: str) -> None:
    with pytest.raises(ConfigError):
        remote_dest(bad)


needs_busybox = pytest.mark.skipif(shutil.which("busybox") is None,
                                   reason="busybox is not installed")


def busybox_runtime(tmp_path: Path, extra: tuple[str, ...] = ()) -> ExecTarget:
    """An exec target whose sandbox has only busybox applets on PATH (Alpine-style): the
    script's own list, and ``extra``."""
    applets = tmp_path / "bb"
    applets.mkdir()
    busybox = shutil.which("busybox")
    assert busybox is not None
    # No `mountpoint`: Debian's busybox has none, and minimal images often lack it.
    for applet in ("sh", "tar", "mkdir", "mv", "ln", "rm", "dirname", "basename", "printf",
                   "echo", "kill", "env", "cat", "sleep", *extra):
        (applets / applet).symlink_to(busybox)
    return ExecTarget((str(applets / "env"), f"PATH={applets}"))


@needs_busybox
def test_the_script_runs_under_busybox_sh_and_tar(tmp_path: Path) -> None:
    src = make_skill(tmp_path / "src", "tool", {"bin/run": "echo", "d/e.txt": "e"},
                     executables=["bin/run"])
    (src / "link").symlink_to("d/e.txt")
    dest = tmp_path / "dest"
    make_skill(dest, "tool", {"stale.txt": "old"})

    [report] = push_sync([src], str(dest), [busybox_runtime(tmp_path)])

    assert report.ok, report.error
    out = dest / "tool"
    assert sorted(p.name for p in out.iterdir()) == ["SKILL.md", "bin", "d", "link"]
    assert os.access(out / "bin/run", os.X_OK)
    assert os.readlink(out / "link") == "d/e.txt"
    no_staging_left(dest)


@needs_busybox
def test_concurrent_pushes_take_turns_under_busybox_too(tmp_path: Path) -> None:
    sources = versions(tmp_path, 4)
    dest = tmp_path / "dest"
    results = push_concurrently(sources, str(dest), busybox_runtime(tmp_path).name)
    assert [r.returncode for r in results] == [0] * 4, [r.stderr for r in results]
    for name in SKILLS:
        assert_one_complete_version(dest / name, 4)
    no_staging_left(dest)


def mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")


@pytest.fixture(params=["tmpfs", "bind-mount", "link-into-a-mount"])
def dest_across_a_mount(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A DEST whose parent lies on another mount than DEST itself: a volume, a directory bound
    onto itself (same file system, still a mount), or a link to a directory in a volume."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting needs root")
    kind = request.param
    mounted = tmp_path / ("vol" if kind == "link-into-a-mount" else "skills")
    mounted.mkdir()
    if kind == "bind-mount":
        mount("--bind", str(mounted), str(mounted))
    else:
        mount("-t", "tmpfs", "kb-test", str(mounted))
    try:
        if kind == "link-into-a-mount":
            (mounted / "skills").mkdir()
            (tmp_path / "skills").symlink_to(mounted / "skills")
        yield tmp_path / "skills"
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=True)


def wait_for(done: Callable[[], object], proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 60
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate()
            pytest.fail(f"never saw {what}; push exited {proc.returncode}: {out}{err}")
        time.sleep(0.05)


@needs_busybox
def test_a_dest_across_a_mount_is_staged_inside_it_and_locked_there(
        tmp_path: Path, dest_across_a_mount: Path) -> None:
    # A rename across the mount fails and mv copies instead (busybox silently): readers would
    # see a half-copied skill. The staging must sit on DEST's own mount, with no `mountpoint`
    # command to ask. A live lock inside DEST holds the push after unpacking to show where.
    dest = dest_across_a_mount
    src = make_skill(tmp_path / "src", "tool", {"v.txt": "new", "d/big.bin": "x" * 500_000})
    lock = dest / ".kb-push-lock"
    lock.mkdir()
    (lock / "pid").write_text(f"{os.getpid()}\n")  # alive for as long as the test runs
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    prefix = busybox_runtime(tmp_path).name
    proc = subprocess.Popen([sys.executable, "-m", "bootstrap", "push", str(src), "--dest",
                             str(dest), "--exec", prefix],
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: list(dest.glob(f".kb-push.*/new/{COMPLETE_MARKER}")), proc,
                 "the unpacked stream inside DEST")
        assert [p.name for p in dest.parent.iterdir() if ".kb-push" in p.name] == []
        assert not (dest / "tool").exists()  # it waits for the lock
        shutil.rmtree(lock)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert proc.returncode == 0, err
    assert out == f"{prefix}: tool -> {dest}/tool\n"
    assert (dest / "tool/v.txt").read_text() == "new"
    assert (dest / "tool/d/big.bin").stat().st_size == 500_000
    no_staging_left(dest)

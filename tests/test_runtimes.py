"""The exec transport's parts: the tar stream, the remote script (also under busybox), quoting."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from bootstrap.errors import ConfigError
from bootstrap.push import load_trees, push_sync
from bootstrap.runtimes import (
    COMPLETE_MARKER,
    ExecRuntime,
    LocalRuntime,
    remote_dest,
    runtime_for,
    tar_stream,
)
from testing.skills import make_skill
from tests.test_push import (
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
    assert isinstance(runtime_for(None), LocalRuntime)
    rt = runtime_for("kubectl exec -i 'my pod' --")
    assert isinstance(rt, ExecRuntime)
    assert rt.argv == ("kubectl", "exec", "-i", "my pod", "--")
    assert rt.name == "kubectl exec -i 'my pod' --"


def test_ssh_gets_the_command_as_one_quoted_line() -> None:
    plain = ExecRuntime(("docker", "exec", "-i", "box")).command("echo 'a b'")
    assert plain == ("docker", "exec", "-i", "box", "sh", "-c", "echo 'a b'")
    ssh = ExecRuntime(("/usr/bin/ssh", "-T", "host")).command("echo 'a b'")
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


def busybox_runtime(tmp_path: Path) -> ExecRuntime:
    """An exec runtime whose sandbox has only busybox applets on PATH (Alpine-style)."""
    applets = tmp_path / "bb"
    applets.mkdir()
    busybox = shutil.which("busybox")
    assert busybox is not None
    for applet in ("sh", "tar", "mkdir", "mv", "rm", "dirname", "basename", "mountpoint",
                   "printf", "echo", "kill", "env", "cat", "sleep"):
        (applets / applet).symlink_to(busybox)
    return ExecRuntime((str(applets / "env"), f"PATH={applets}"))


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

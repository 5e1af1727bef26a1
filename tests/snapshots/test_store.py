"""Snapshots: build once, restore elsewhere; bad archives fall back to a build."""

from __future__ import annotations

import io
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bootstrap.config import default_python
from bootstrap.env.platform import Platform, platform_of
from bootstrap.env.uv import Uv
from bootstrap.primitives.tar import BadArchive
from bootstrap.snapshots.store import MANIFEST, Store
from testing.uvlog import fake_uv_shim
from testing.world import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(tmp_path)
    w.write_config(requirements=["requests>=2"], snapshots="store")
    w.skill("alpha")
    w.skill("beta")
    return w


def archives(world: World) -> list[Path]:
    return sorted((world.root / "store").glob("*.tar"))


def elsewhere(world: World, name: str = "other") -> dict[str, str]:
    return {"KERNEL_BOOTSTRAP_VENV": str(world.root / name)}


def test_a_rebuild_writes_a_snapshot_that_another_venv_path_restores(world: World) -> None:
    world.ensure()
    assert len(archives(world)) == 1
    world.clear_log()
    result = world.ensure("--json", env=elsewhere(world))
    out = json.loads(result.stdout)
    assert out["action"] == "rebuild" and out["python"] == str(world.root / "other/bin/python")
    assert world.uv_calls() == []  # runtime and both skills came with the snapshot; no uv
    python = world.root / "other" / "bin" / "python"
    for module in ("alpha", "beta", "requests"):
        assert subprocess.run([str(python), "-c", f"import {module}"],
                              check=False).returncode == 0
    status = json.loads(world.run("status", "--json", env=elsewhere(world)).stdout)
    assert status["ready"] is True and status["snapshot"]["exists"] is True


def test_status_of_a_fresh_sandbox_finds_the_snapshot_when_python_is_spelled_via_a_link(
        world: World) -> None:
    # `python` in the config as a venv's bin/python (a link to the interpreter running us): a
    # venv that did not exist yet reported "key": null, "exists": null (issue 22).
    link = world.root / "py" / "bin" / "python"
    link.parent.mkdir(parents=True)
    link.symlink_to(sys.executable)
    world.write_config(requirements=["requests>=2"], snapshots="store", python=str(link))
    before = json.loads(world.run("status", "--json").stdout)["snapshot"]
    assert before["key"] is not None and before["exists"] is False
    world.ensure()
    assert [p.name for p in archives(world)] == [f"{before['key']}.tar"]
    fresh = json.loads(world.run("status", "--json", env=elsewhere(world)).stdout)["snapshot"]
    assert fresh == {**before, "exists": True}


def test_a_skill_changed_after_the_snapshot_is_reinstalled_alone(world: World) -> None:
    world.ensure()
    world.skill("beta", version="0.2.0")
    world.clear_log()
    out = json.loads(world.ensure("--json", env=elsewhere(world)).stdout)
    assert out["installed"] == ["beta"]
    assert world.venv_calls() == []
    assert [world.editables(c) for c in world.installs()] == [["beta"]]


# Each damage and the reason its warning gives (None: any reason).
DAMAGES: dict[str, str | None] = {
    "garbage": None,
    "truncated": None,
    "truncated-in-data": "truncated",
    "checksum": "checksum",
    "pax": "GNU tar format",
    "other-platform": "another key or platform",
    "unsafe": "outside the venv",
    "longname-out": "outside the venv",
    "link-out": "leaving the venv",
    "longlink-out": "leaving the venv",
    "absolute-link": "absolute link",
    "hardlink-via-link": "through a link",
    "replaces-link": "through a link",
    "device": "not a file",
    "fifo": "not a file",
    "setuid": "setuid",
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_bad_snapshot_warns_by_name_and_builds(world: World, damage: str) -> None:
    world.ensure()
    [archive] = archives(world)
    victim = world.root / "victim.txt"
    victim.write_text("mine")
    spoil(archive, damage, world.root)
    world.clear_log()
    result = world.ensure("--json", env=elsewhere(world))
    assert archive.name in result.stderr and "snapshot" in result.stderr
    reason = DAMAGES[damage]
    assert reason is None or reason in result.stderr, result.stderr
    assert victim.read_text() == "mine"
    assert not list(world.root.rglob("escaped.txt"))
    assert not (world.root / "other" / "null").exists()
    assert not (world.root / "other" / "lib" / "stolen").exists()
    assert not list(world.root.glob(".other.stage-*"))  # nothing half-restored left behind
    assert len(world.venv_calls()) == 1
    python = world.root / "other" / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import alpha, requests"],
                          check=False).returncode == 0
    # The build rewrote a good snapshot under the same key.
    world.clear_log()
    world.ensure(env=elsewhere(world, "third"))
    assert world.venv_calls() == []


def spoil(archive: Path, damage: str, root: Path) -> None:
    data = bytearray(archive.read_bytes())
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    if damage == "garbage":
        data = bytearray(b"\x00not a tar" * 100)
    elif damage == "truncated":
        del data[len(data) // 3:]
    elif damage == "truncated-in-data":
        big = max(members, key=lambda m: m.size)
        assert big.name != MANIFEST and big.size > 2 * 512
        del data[big.offset_data + big.size // 2:]
    elif damage == "checksum":
        data[members[len(members) // 2].offset + 10] ^= 1  # a byte of its name
    else:
        rewrite(archive, damage, root)
        return
    archive.write_bytes(bytes(data))


def _content(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes | None:
    """A regular file's bytes; None for any other kind of member."""
    f = tar.extractfile(member) if member.isfile() else None
    return None if f is None else f.read()


def rewrite(archive: Path, damage: str, root: Path) -> None:
    """The archive rewritten by tarfile (GNU format unless "pax"), with ``damage`` added."""
    with tarfile.open(archive) as tar:
        members = [(m, _content(tar, m)) for m in tar.getmembers()]
    fmt = tarfile.PAX_FORMAT if damage == "pax" else tarfile.GNU_FORMAT
    with tarfile.open(archive, "w", format=fmt) as tar:
        for info, content in members + extra_members(damage, root):
            if info.name == MANIFEST and damage == "other-platform":
                manifest = json.loads(content or b"{}")
                manifest["platform"]["machine"] = "sparc64"
                content = json.dumps(manifest).encode()
                info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if content is not None else None)


def extra_members(damage: str, root: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    evil = str(root / "victim.txt")
    return {
        "unsafe": [member("venv/../../escaped.txt", data=b"evil")],
        # Longer than a header's 100-byte name field: GNU 'L' and 'K' headers carry them.
        "longname-out": [member("venv/" + "d" * 120 + "/../../../escaped.txt", data=b"evil")],
        "link-out": [member("venv/lib/evil", tarfile.SYMTYPE, "../../../etc")],
        "longlink-out": [member("venv/lib/evil", tarfile.SYMTYPE, "../" * 40 + "etc")],
        "absolute-link": [member("venv/lib/evil", tarfile.SYMTYPE, "/etc/passwd")],
        # bin/python* may point at an absolute path; nothing may be written through it.
        "hardlink-via-link": [member("venv/bin/python-evil", tarfile.SYMTYPE, str(root)),
                              member("venv/lib/stolen", tarfile.LNKTYPE,
                                     "venv/bin/python-evil/victim.txt")],
        "replaces-link": [member("venv/bin/python-evil", tarfile.SYMTYPE, evil),
                          member("venv/bin/python-evil", data=b"evil")],
        "device": [member("venv/null", tarfile.CHRTYPE)],
        "fifo": [member("venv/fifo", tarfile.FIFOTYPE)],
        "setuid": [member("venv/bin/su", data=b"#!/bin/sh\n", mode=0o4755)],
    }.get(damage, [])


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644,
           data: bytes | None = None) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    if kind == tarfile.REGTYPE:
        data = data or b""
        info.size = len(data)
    return info, data


def test_an_unwritable_store_never_fails_ensure(world: World) -> None:
    (world.root / "store").write_text("a file where the store directory should be")
    result = world.ensure()
    assert "snapshot" in result.stderr
    assert world.imports("alpha")


def test_concurrent_restores_of_one_key_are_safe(world: World) -> None:
    world.ensure()
    world.clear_log()
    procs = [subprocess.Popen(world.command("ensure"), env={**world.env, **elsewhere(world, n)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in ("one", "two", "three")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1] for o in outs]
    assert world.venv_calls() == [] and world.installs() == []
    for name in ("one", "two", "three"):
        assert subprocess.run([str(world.root / name / "bin" / "python"), "-c", "import beta"],
                              check=False).returncode == 0


def test_list_and_prune(world: World) -> None:
    world.ensure()
    listed = json.loads(world.run("snapshot", "list", "--json").stdout)
    assert len(listed["snapshots"]) == 1 and listed["snapshots"][0]["bytes"] > 0
    assert world.run("snapshot", "prune").returncode == 2
    pruned = json.loads(world.run("snapshot", "prune", "--keep", "0", "--json").stdout)
    assert len(pruned["removed"]) == 1 and archives(world) == []
    assert "no snapshots" in world.run("snapshot", "list").stdout


def test_a_fifo_or_device_in_the_store_is_unreadable_not_a_hang(world: World) -> None:
    store = world.root / "store"
    store.mkdir()
    os.mkfifo(store / ("f" * 40 + ".tar"))
    (store / ("z" * 40 + ".tar")).symlink_to("/dev/zero")
    listed = world.run("snapshot", "list", "--json", timeout=20)
    assert listed.returncode == 0, listed.stderr
    platforms = [s["platform"] for s in json.loads(listed.stdout)["snapshots"]]
    assert platforms == [{"error": "unreadable"}] * 2


PLATFORM = Platform("3.11.7", "cpython", "linux", "x86_64", "glibc-2.36")
KEY = "k" * 40


def store_with(root: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Store:
    """A store holding KEY: a manifest, a minimal venv, then ``members``, in GNU format."""
    store = Store(root / "store")
    store.root.mkdir(parents=True)
    manifest = json.dumps({"key": KEY, "platform": PLATFORM.as_dict()}).encode()
    venv = [member(MANIFEST, data=manifest), member("venv", tarfile.DIRTYPE, mode=0o755),
            member("venv/pyvenv.cfg", data=b"home = /usr/bin\n")]
    with tarfile.open(store.path_for(KEY), "w", format=tarfile.GNU_FORMAT) as tar:
        for info, content in venv + members:
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return store


@pytest.mark.parametrize(("members", "problem"), [
    ([member("venv/lib/x.py")], None),
    ([member("venv/lib", tarfile.DIRTYPE, mode=0o755)], None),
    ([member("venv/bin/python", tarfile.SYMTYPE, "/usr/bin/python3.11")], None),
    ([member("venv/bin/python3", tarfile.SYMTYPE, "python")], None),
    ([member("venv/lib64", tarfile.SYMTYPE, "lib")], None),
    ([member("venv/lib/x.py"), member("venv/lib/y.py", tarfile.LNKTYPE, "venv/lib/x.py")], None),
    ([member("venv/lib/" + "n" * 150)], None),
    ([member("venv/lib/deep", tarfile.SYMTYPE, "../" + "lib/" * 40 + "x")], None),
    ([member("other/x")], "outside the venv"),
    ([member("/venv/x")], "outside the venv"),
    ([member("venv/../x")], "outside the venv"),
    ([member("venv/./x")], "outside the venv"),
    ([member("venv//x")], "outside the venv"),
    ([member("venv/lib/tool", tarfile.SYMTYPE, "/bin/sh")], "absolute link"),
    ([member("venv/lib/up", tarfile.SYMTYPE, "../../..")], "leaving the venv"),
    ([member("venv/lib/empty", tarfile.SYMTYPE, "")], "leaving the venv"),
    ([member("venv/lib/hard", tarfile.LNKTYPE, "etc/passwd")], "leaving the venv"),
    ([member("venv/lib64", tarfile.SYMTYPE, "lib"), member("venv/lib64/x")], "through a link"),
    ([member("venv/bin/python3", tarfile.SYMTYPE, "python"), member("venv/bin/python3")],
     "through a link"),
    # A hard link to a symlink would move its relative target to another directory.
    ([member("venv/lib/a/s", tarfile.SYMTYPE, "../x"),
      member("venv/h", tarfile.LNKTYPE, "venv/lib/a/s")], "through a link"),
    # Links are judged by where they resolve, following earlier links: `lib/d -> .` makes
    # this one climb out although it normalises to venv/lib/X.
    ([member("venv/lib/d", tarfile.SYMTYPE, "."),
      member("venv/lib/e", tarfile.SYMTYPE, "d/d/d/../../../X")], "leaving the venv"),
    ([member("venv/lib/d", tarfile.SYMTYPE, "."),
      member("venv/lib/e", tarfile.SYMTYPE, "d/d/d/../x")], None),
    # Only the interpreter's own links may leave, and nothing may leave through them.
    ([member("venv/bin/python", tarfile.SYMTYPE, "/"),
      member("venv/lib/x", tarfile.SYMTYPE, "../bin/python")], "leaving the venv"),
    ([member("venv/lib/x", tarfile.SYMTYPE, "../bin/python"),
      member("venv/bin/python", tarfile.SYMTYPE, "/etc")], "absolute link"),
    # uv's own layout: the aliases come before the link they name.
    ([member("venv/bin/python", tarfile.SYMTYPE, "python3.11"),
      member("venv/bin/python3", tarfile.SYMTYPE, "python3.11"),
      member("venv/bin/python3.11", tarfile.SYMTYPE, "/usr/bin/python3.11"),
      member("venv/lib64", tarfile.SYMTYPE, "lib")], None),
    # A later link must not change where an earlier one points.
    ([member("venv/a", tarfile.SYMTYPE, "x/.."), member("venv/x", tarfile.SYMTYPE, ".")],
     "goes through a directory"),
    ([member("venv/lib/a", tarfile.SYMTYPE, "a")], "through itself"),
    ([member("venv/lib/x.py"), member("venv/h", tarfile.LNKTYPE, "venv/lib/../lib/x.py")],
     "leaving the venv"),
    ([member("venv/dev", tarfile.CHRTYPE)], "not a file"),
    ([member("venv/fifo", tarfile.FIFOTYPE)], "not a file"),
    ([member("venv/bin/su", mode=0o4755)], "setuid"),
    ([member("venv/bin/sg", mode=0o2755)], "setgid"),
])
def test_members_are_vetted(tmp_path: Path, members: list[tuple[tarfile.TarInfo,
                                      bytes | None]], problem: str | None) -> None:
    store = store_with(tmp_path, members)
    into = tmp_path / "into"
    if problem is None:
        assert store.restore(KEY, into, PLATFORM) == into / "venv"
        assert all(os.path.lexists(into / info.name) for info, _ in members)
        return
    with pytest.raises(BadArchive) as refused:
        store.restore(KEY, into, PLATFORM)
    assert problem in str(refused.value) and store.path_for(KEY).name in str(refused.value)


def many_long_names(seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {f"venv/lib/{'n' * 110}-{i}.py": rng.randbytes(rng.randrange(0, 3000))
            for i in range(1500)}


def test_a_large_archive_of_long_names_restores_byte_for_byte(tmp_path: Path) -> None:
    files = many_long_names(8)
    store = store_with(tmp_path, [member(name, data=data) for name, data in files.items()])
    assert store.path_for(KEY).stat().st_size > 4 << 20  # many reads, headers across them
    store.restore(KEY, tmp_path / "into", PLATFORM)
    assert all((tmp_path / "into" / n).read_bytes() == d for n, d in files.items())


def test_without_a_system_tar_the_same_members_are_restored_and_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    which = shutil.which
    monkeypatch.setattr(shutil, "which",
                        lambda cmd, *a, **k: None if cmd == "tar" else which(cmd, *a, **k))
    files = many_long_names(9)
    good = [member(n, data=d) for n, d in files.items()]
    good += [member("venv/bin/python", tarfile.SYMTYPE, "/usr/bin/python3"),
             member("venv/lib/copy.py", tarfile.LNKTYPE, next(iter(files)))]
    store_with(tmp_path / "good", good).restore(KEY, tmp_path / "into", PLATFORM)
    assert all((tmp_path / "into" / n).read_bytes() == d for n, d in files.items())
    assert os.readlink(tmp_path / "into/venv/bin/python") == "/usr/bin/python3"
    assert (tmp_path / "into/venv/lib/copy.py").read_bytes() == next(iter(files.values()))
    bad = store_with(tmp_path / "bad", [member("venv/bin/python-x", tarfile.SYMTYPE, "/etc"),
                                        member("venv/bin/python-x/passwd", data=b"evil")])
    with pytest.raises(BadArchive, match="through a link"):
        bad.restore(KEY, tmp_path / "into2", PLATFORM)


def test_the_platform_is_the_same_however_the_interpreter_is_named(tmp_path: Path) -> None:
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    no_uv = Uv(Path("/bin/false"))  # an absolute path, ours or not, needs no `uv python find`
    version = ".".join(map(str, sys.version_info[:2]))
    here = platform_of(no_uv, default_python())
    assert here == platform_of(no_uv, str(wrapper))
    assert here == platform_of(Uv(fake_uv_shim(tmp_path / "bin")), version)

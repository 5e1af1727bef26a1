"""Snapshots: build once, restore elsewhere; bad archives fall back to a build."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.world import World


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
    assert world.venv_calls() == []
    assert world.installs() == []  # runtime and both skills came with the snapshot
    python = world.root / "other" / "bin" / "python"
    for module in ("alpha", "beta", "requests"):
        assert subprocess.run([str(python), "-c", f"import {module}"],
                              check=False).returncode == 0
    status = json.loads(world.run("status", "--json", env=elsewhere(world)).stdout)
    assert status["ready"] is True and status["snapshot"]["exists"] is True


def test_a_skill_changed_after_the_snapshot_is_reinstalled_alone(world: World) -> None:
    world.ensure()
    world.skill("beta", version="0.2.0")
    world.clear_log()
    out = json.loads(world.ensure("--json", env=elsewhere(world)).stdout)
    assert out["installed"] == ["beta"]
    assert world.venv_calls() == []
    assert [world.editables(c) for c in world.installs()] == [["beta"]]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other-platform", "unsafe",
                                    "link-out", "absolute-link", "device"])
def test_a_bad_snapshot_warns_by_name_and_builds(world: World, damage: str) -> None:
    world.ensure()
    [archive] = archives(world)
    data = archive.read_bytes()
    if damage == "garbage":
        archive.write_bytes(b"\x00not a tar" * 100)
    elif damage == "truncated":
        archive.write_bytes(data[: len(data) // 3])
    else:
        rewrite(archive, damage)
    world.clear_log()
    result = world.ensure("--json", env=elsewhere(world))
    assert archive.name in result.stderr and "snapshot" in result.stderr
    assert not list(world.root.rglob("escaped.txt"))
    assert not (world.root / "other" / "null").exists()
    assert len(world.venv_calls()) == 1
    python = world.root / "other" / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import alpha, requests"],
                          check=False).returncode == 0
    # The build rewrote a good snapshot under the same key.
    world.clear_log()
    world.ensure(env=elsewhere(world, "third"))
    assert world.venv_calls() == []


def rewrite(archive: Path, damage: str) -> None:
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None)  # type: ignore[union-attr]
                   for m in tar.getmembers()]
    with tarfile.open(archive, "w") as tar:
        for member, content in members:
            if member.name == "kernel-bootstrap-snapshot.json" and damage == "other-platform":
                manifest = json.loads(content or b"{}")
                manifest["platform"]["machine"] = "sparc64"
                content = json.dumps(manifest).encode()
                member.size = len(content)
            tar.addfile(member, io.BytesIO(content) if content is not None else None)
        if damage == "unsafe":
            evil = tarfile.TarInfo("venv/../../escaped.txt")
            evil.size = 4
            tar.addfile(evil, io.BytesIO(b"evil"))
        elif damage in ("link-out", "absolute-link"):
            link = tarfile.TarInfo("venv/lib/evil")
            link.type = tarfile.SYMTYPE
            link.linkname = "../../../etc" if damage == "link-out" else "/etc/passwd"
            tar.addfile(link)
        elif damage == "device":
            dev = tarfile.TarInfo("venv/null")
            dev.type = tarfile.CHRTYPE
            dev.devmajor, dev.devminor = 1, 3
            tar.addfile(dev)


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


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "",
          mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


@pytest.mark.parametrize(("member", "problem"), [
    (_info("venv/lib/x.py"), None),
    (_info("venv/bin/python", tarfile.SYMTYPE, "/usr/bin/python3.11"), None),
    (_info("venv/bin/python3", tarfile.SYMTYPE, "python"), None),
    (_info("venv/lib64", tarfile.SYMTYPE, "lib"), None),
    (_info("other/x"), "outside the venv"),
    (_info("/venv/x"), "outside the venv"),
    (_info("venv/../x"), "outside the venv"),
    (_info("venv/lib/tool", tarfile.SYMTYPE, "/bin/sh"), "absolute link"),
    (_info("venv/lib/up", tarfile.SYMTYPE, "../../.."), "leaving the venv"),
    (_info("venv/lib/hard", tarfile.LNKTYPE, "etc/passwd"), "leaving the venv"),
    (_info("venv/dev", tarfile.CHRTYPE), "not a file"),
    (_info("venv/fifo", tarfile.FIFOTYPE), "not a file"),
    (_info("venv/bin/su", mode=0o4755), "setuid"),
])
def test_members_are_vetted_lexically(member: tarfile.TarInfo, problem: str | None) -> None:
    from bootstrap.snapshot import _member_problem

    found = _member_problem(member, set())
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_a_member_reached_through_a_link_is_refused() -> None:
    from bootstrap.snapshot import _member_problem

    links = {"venv/bin/python3"}
    assert "through a link" in (_member_problem(_info("venv/bin/python3/x"), links) or "")

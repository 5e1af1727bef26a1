"""``push --exec "docker exec -i CID"`` into real containers: a throwaway dockerd with its own
data root and socket, an image made with no registry (``docker import`` of a static BusyBox
rootfs, the minimal sh and tar of Alpine-like sandboxes), and what each container sees
afterwards, checked from inside it."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import stat
import struct
import subprocess
import tarfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from testing.counting import Counted
from testing.skills import make_skill
from tests.trees.test_push import SKILLS, push_concurrently, run_cli, versions
from tests.trees.test_pushrecord import skills

IMAGE = "kb-test/busybox:latest"
DEST = "/skills"
PT_INTERP = 3  # ELF program header type naming the dynamic loader: absent in a static binary


@dataclass
class Docker:
    """The docker CLI pointed at the test daemon (DOCKER_HOST is set for the whole module, so a
    push's ``docker exec -i CID`` reaches it exactly as a user's would)."""

    containers: list[str]

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(["docker", *args], input=stdin, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
        return done.stdout

    def container(self, *run_args: str) -> str:
        """A new container of the BusyBox image, idle, with no network; removed at the end."""
        cid = self("run", "-d", "--network", "none", *run_args, IMAGE, "sleep", "3600").strip()
        self.containers.append(cid)
        return cid

    def sh(self, cid: str, script: str) -> str:
        return self("exec", "-i", cid, "sh", "-c", script)


def is_static_elf(path: Path) -> bool:
    """Whether ``path`` is a 64-bit little-endian ELF with no dynamic loader (runs in an empty
    rootfs)."""
    data = path.read_bytes()
    if data[:6] != b"\x7fELF\x02\x01":
        return False
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    types = (struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum))
    return PT_INTERP not in types


def static_busybox() -> Path:
    found = shutil.which("busybox")
    if found is None or not is_static_elf(Path(found).resolve()):
        pytest.skip("no static busybox on PATH (apt-get install -y busybox-static)")
    return Path(found).resolve()


def rootfs_tar(tmp: Path, busybox: Path) -> Path:
    """A rootfs holding only /bin/busybox, a link per applet it has (sh, tar, mv, mkdir, rm,
    sleep, cat, kill, dirname, basename, printf, test, stat, find, ...) and an empty /tmp."""
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    out = tmp / "rootfs.tar"
    with tarfile.open(out, "w") as tar:
        for name in ("bin", "tmp"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, "bin/busybox")
        for applet in applets:
            if applet != "busybox":
                info = tarfile.TarInfo(f"bin/{applet}")
                info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(info)
    return out


def start_dockerd(tmp: Path) -> subprocess.Popen[bytes]:
    """dockerd with everything of its own under ``tmp``: no bridge, no iptables rules, no
    effect on a system daemon. Skips with the daemon's last words when it does not come up."""
    sock = tmp / "docker.sock"
    if len(str(sock)) > 100:  # sun_path holds 108 bytes
        pytest.skip(f"temp dir too deep for a unix socket: {sock}")
    driver = [] if "overlay" in Path("/proc/filesystems").read_text() else [
        "--storage-driver=vfs"]
    log = tmp / "dockerd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["dockerd", "--data-root", str(tmp / "root"), "--exec-root", str(tmp / "exec"),
             "-H", f"unix://{sock}", "--pidfile", str(tmp / "dockerd.pid"),
             "--iptables=false", "--bridge=none", *driver],
            stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.skip(f"dockerd exited with {proc.returncode}: {log.read_text()[-800:]}")
        ping = subprocess.run(["docker", "-H", f"unix://{sock}", "version"],
                              capture_output=True, check=False)
        if ping.returncode == 0:
            return proc
        time.sleep(0.2)
    stop(proc)
    pytest.skip(f"dockerd did not answer within 30 s: {log.read_text()[-800:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()  # dockerd stops the containerd it started
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Docker]:
    if os.geteuid() != 0:
        pytest.skip("the test dockerd needs root")
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        pytest.skip("docker is not installed (apt-get install -y docker.io)")
    busybox = static_busybox()
    tmp = tmp_path_factory.mktemp("dockerd")
    proc = start_dockerd(tmp)
    cli = Docker(containers=[])
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DOCKER_HOST", f"unix://{tmp / 'docker.sock'}")
            cli("import", str(rootfs_tar(tmp, busybox)), IMAGE)
            yield cli
            if cli.containers:
                cli("rm", "-f", *cli.containers)
    finally:
        stop(proc)


# A skill tree as a shell inside the container sees it: kind, mode, link target, mtime and
# contents' sha256 of every entry, in byte order.
LISTING = r"""cd "$1" && find . | sort | while read -r p; do
  if [ -L "$p" ]; then echo "$p -> $(readlink "$p")"
  elif [ -d "$p" ]; then echo "$p dir $(stat -c %a "$p")"
  else echo "$p $(stat -c '%a %Y' "$p") $(sha256sum < "$p" | cut -d' ' -f1)"; fi
done"""

# Anything a push leaves besides the skills: staging or lock directories, anywhere.
LEFTOVERS = "find / -xdev -name '*kb-push*'"


def listing(docker: Docker, cid: str, path: str) -> list[str]:
    return docker.sh(cid, f"set -- {shlex.quote(path)}\n{LISTING}").splitlines()


def expected_listing(root: Path) -> list[str]:
    """:data:`LISTING` of the source tree, computed here: what every container must show."""
    lines: list[tuple[bytes, str]] = []
    for path in [root, *root.rglob("*")]:
        name = "." if path == root else f"./{path.relative_to(root)}"
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            line = f"{name} -> {os.readlink(path)}"
        elif stat.S_ISDIR(st.st_mode):
            line = f"{name} dir {stat.S_IMODE(st.st_mode):o}"
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            line = f"{name} {stat.S_IMODE(st.st_mode):o} {int(st.st_mtime)} {digest}"
        lines.append((name.encode(), line))
    return [line for _, line in sorted(lines)]


def tool_skill(parent: Path) -> Path:
    """A skill with an executable, a name with a space, a binary file and internal links."""
    return make_skill(parent, "tool", {"bin/run": "#!/bin/sh\necho ran\n", "docs/a b.txt": "a",
                                       "big.bin": os.urandom(300_000)},
                      executables=["bin/run"], symlinks={"run": "bin/run", "manual": "docs"})


def test_one_push_into_three_containers_lands_modes_links_and_contents_in_each(
        tmp_path: Path, docker: Docker, capsys: pytest.CaptureFixture[str]) -> None:
    tool = tool_skill(tmp_path / "src")
    data = make_skill(tmp_path / "src", "data", {"v1/x.txt": "one", "v1/ro.txt": "ro"},
                      symlinks={"current": "v1", "up/x": "../v1/x.txt"})
    (data / "v1/ro.txt").chmod(0o444)
    os.utime(tool / "docs/a b.txt", (1_600_000_000, 1_600_000_000))
    cids = [docker.container() for _ in range(3)]
    prefixes = [f"docker exec -i {cid}" for cid in cids]

    assert run_cli(tool, data, "--dest", DEST,
                   *[arg for p in prefixes for arg in ("--exec", p)]) == 0

    assert sorted(capsys.readouterr().out.splitlines()) == sorted(
        f"{p}: {n} -> {DEST}/{n}" for p in prefixes for n in ("tool", "data"))
    for cid in cids:
        assert docker.sh(cid, f"ls -A {DEST}") == "data\ntool\n"
        for skill in (tool, data):
            assert listing(docker, cid, f"{DEST}/{skill.name}") == expected_listing(skill)
        assert docker.sh(cid, f"{DEST}/tool/run; cat {DEST}/data/current/x.txt") == "ran\none"
        assert docker.sh(cid, LEFTOVERS) == ""


def test_a_push_as_an_unprivileged_user_keeps_modes_and_links(tmp_path: Path,
                                                             docker: Docker) -> None:
    # Not root inside the sandbox: tar no longer keeps modes unless asked (-p), and the
    # destination's parent must be one the user can write.
    tool = tool_skill(tmp_path / "src")
    cid = docker.container()
    docker.sh(cid, "mkdir -p /home/agent && chown 1000:1000 /home/agent")
    dest = "/home/agent/skills"

    assert run_cli(tool, "--dest", dest, "--exec", f"docker exec -i -u 1000:1000 {cid}") == 0

    assert listing(docker, cid, f"{dest}/tool") == expected_listing(tool)
    assert docker.sh(cid, f"stat -c %u {dest}/tool/bin/run") == "1000\n"
    assert docker.sh(cid, LEFTOVERS) == ""


def skill_versions(docker: Docker, cid: str) -> dict[str, tuple[str, str, str]]:
    """Per skill in DEST: its v.txt, its entries, and the distinct contents of its d/ files."""
    script = (f'cd {DEST} && for s in *; do printf "%s|%s|%s|%s\\n" "$s" "$(cat "$s/v.txt")" '
              '"$(ls -A "$s" | tr "\\n" " ")" "$(cat "$s"/d/*.txt | tr "\\n" " " | '
              'fold -w 2000 | sort -u | tr "\\n" " ")"; done')
    rows = [line.split("|") for line in docker.sh(cid, script).splitlines()]
    return {name: (version, entries, contents) for name, version, entries, contents in rows}


def assert_one_complete_version_each(docker: Docker, cid: str, allowed: range) -> None:
    """Every skill in DEST is exactly one of the ``allowed`` versions: not nested, not mixed;
    and no staging or lock is left."""
    found = skill_versions(docker, cid)
    assert sorted(found) == SKILLS
    for version, entries, contents in found.values():
        assert int(version) in allowed
        assert entries == f"SKILL.md d only-{version}.txt v.txt "
        assert contents == f"{version * 2000} "
    assert docker.sh(cid, LEFTOVERS) == ""


def test_concurrent_pushes_into_one_container_leave_one_complete_version(
        tmp_path: Path, docker: Docker) -> None:
    sources = versions(tmp_path, 4)
    cid = docker.container()
    for _ in range(2):  # the race needs the right interleaving: give it another chance
        results = push_concurrently(sources, DEST, f"docker exec -i {cid}")
        assert [r.returncode for r in results] == [0] * 4, [r.stderr for r in results]
        assert_one_complete_version_each(docker, cid, range(4))


def test_pushes_wait_for_a_live_lock_holder_then_take_turns(tmp_path: Path,
                                                           docker: Docker) -> None:
    # Holding the lock from outside lines the pushes up at it (a DEST pushed into before has a
    # record: each takes the lock before it reports what DEST holds, so that the report is
    # still true at its renames); releasing it lets them all race for it at the same instant.
    sources = versions(tmp_path, 4)
    cid = docker.container()
    prefix = f"docker exec -i {cid}"
    assert run_cli(*sources[0], "--dest", DEST, "--exec", prefix) == 0
    lock = f"/.{DEST[1:]}.kb-push-lock"  # beside DEST, as the push script takes it
    docker.sh(cid, f"mkdir {lock} && echo 1 > {lock}/pid")  # pid 1, the container's init: alive

    with ThreadPoolExecutor(1) as pool:
        pushes = pool.submit(push_concurrently, sources[1:], DEST, prefix)
        waiting = f"ls -d /.{DEST[1:]}.kb-push.*/new 2>/dev/null | wc -l"
        deadline = time.monotonic() + 60
        while docker.sh(cid, waiting).strip() != "3" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert docker.sh(cid, waiting).strip() == "3", "the pushes never lined up at the lock"
        time.sleep(0.5)  # time enough to rename, were the lock not respected
        assert not pushes.done()
        assert {v for v, _, _ in skill_versions(docker, cid).values()} == {"0"}
        docker.sh(cid, f"rm -rf {lock}")
        results = pushes.result(timeout=120)

    assert [r.returncode for r in results] == [0] * 3, [r.stderr for r in results]
    assert_one_complete_version_each(docker, cid, range(1, 4))


@pytest.mark.parametrize("volume", [["--tmpfs", DEST], ["-v", DEST]], ids=["tmpfs", "volume"])
def test_a_push_into_a_volume_is_staged_on_it_without_a_mountpoint_command(
        tmp_path: Path, docker: Docker, volume: list[str]) -> None:
    # The image's busybox has no `mountpoint`. Staged beside DEST, on the container's root, the
    # final rename would cross into the volume and busybox mv would copy instead, exit 0:
    # readers would see a half-copied skill. A live lock inside DEST holds the push once it has
    # unpacked, to see where it staged.
    tool = tool_skill(tmp_path / "src")
    cid = docker.container(*volume)
    lock = f"{DEST}/.kb-push-lock"
    docker.sh(cid, f"mkdir {lock} && echo 1 > {lock}/pid")  # pid 1, the container's init: alive

    with ThreadPoolExecutor(1) as pool:
        push = pool.submit(push_concurrently, [[tool]], DEST, f"docker exec -i {cid}")
        unpacked = f"ls -d {DEST}/.kb-push.*/new/.kb-push-complete 2>/dev/null | wc -l"
        deadline = time.monotonic() + 60
        while (docker.sh(cid, unpacked).strip() != "1" and not push.done()
               and time.monotonic() < deadline):
            time.sleep(0.2)
        assert docker.sh(cid, unpacked).strip() == "1", "the push never staged inside DEST"
        assert docker.sh(cid, LEFTOVERS) == ""  # nothing on the root file system, beside DEST
        docker.sh(cid, f"rm -rf {lock}")
        [result] = push.result(timeout=120)

    assert result.returncode == 0, result.stderr
    assert listing(docker, cid, f"{DEST}/tool") == expected_listing(tool)
    assert docker.sh(cid, f"find {DEST} -name '*kb-push*'") == ""


def test_an_unchanged_push_into_a_container_sends_no_file_contents(
        tmp_path: Path, docker: Docker) -> None:
    cid = docker.container()
    counted = Counted(tmp_path, ("docker", "exec", "-i", cid))
    sources = [tool_skill(tmp_path / "src"), *skills(tmp_path / "src")]
    calls, first = counted.push(sources, DEST)
    assert calls == 1 and b"content-s1" in first
    calls, second = counted.push(sources, DEST)
    assert calls == 1 and b"content-s" not in second and len(second) <= 10 * 1024
    (sources[1] / "f3.txt").write_text("changed\n")
    _, third = counted.push(sources, DEST)
    assert b"changed\n" in third and b"content-s1" not in third and b"ran" not in third
    for skill in sources:  # what a full push leaves: modes, links, mtimes, contents
        assert listing(docker, cid, f"{DEST}/{skill.name}") == expected_listing(skill)
    assert docker.sh(cid, LEFTOVERS) == ""

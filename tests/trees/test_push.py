"""``kernel-bootstrap push``, observed from outside: what lands at the destination, how many exec
calls it took, what is refused before anything is sent, and how failures are reported."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bootstrap.cli import main
from bootstrap.trees.push import push, push_sync
from bootstrap.trees.skilltree import SkillTree
from bootstrap.trees.targets import PushedSkill, PushReport, target_for
from testing.processes import peak_rss_run
from testing.skills import make_skill

REPO = Path(__file__).resolve().parents[2]


def logging_prefix(
        tmp_path: Path, exit_code: int | None = None, message: str = "") -> tuple[str, Path]:
    """A wrapper that logs one line per call, then runs the command (or fails)."""
    log = tmp_path / f"calls-{exit_code}.log"
    wrapper = tmp_path / f"wrap-{exit_code}.sh"
    tail = f'echo "{message}" >&2\nexit {exit_code}\n' if exit_code is not None else 'exec "$@"\n'
    wrapper.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$1\" >> {log}\n{tail}")
    wrapper.chmod(0o755)
    return str(wrapper), log


def calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def run_cli(*args: str | Path) -> int:
    return main(["push", *map(str, args)])


def no_staging_left(dest: Path) -> None:
    leftovers = [p for d in (dest.parent, dest) for p in d.iterdir() if ".kb-push" in p.name]
    assert leftovers == []


# --- what lands ---------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["local", "exec"])
def test_push_copies_contents_modes_and_internal_symlinks(
        tmp_path: Path, transport: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_skill(tmp_path / "src", "pdf", {"bin/run": "#!/bin/sh\necho hi\n",
                                                "docs/a.txt": "a"}, executables=["bin/run"])
    (src / "run").symlink_to("bin/run")
    os.utime(src / "docs/a.txt", (1_600_000_000, 1_600_000_000))
    dest = tmp_path / "sandbox" / "skills"
    execs = ["--exec", "env"] if transport == "exec" else []

    assert run_cli(src, "--dest", dest, *execs) == 0

    out = dest / "pdf"
    assert (out / "SKILL.md").read_text().startswith("---\nname: pdf")
    assert (out / "bin/run").stat().st_mode & 0o777 == 0o755
    assert (out / "docs/a.txt").stat().st_mode & 0o777 == 0o644
    assert os.readlink(out / "run") == "bin/run"
    assert (out / "run").read_text() == "#!/bin/sh\necho hi\n"
    assert int((out / "docs/a.txt").stat().st_mtime) == 1_600_000_000
    runtime = "env" if transport == "exec" else "local"
    assert capsys.readouterr().out == f"{runtime}: pdf -> {out}\n"


def test_exec_push_of_128_files_is_one_exec_call(tmp_path: Path) -> None:
    files = {f"f{i:03}/data.txt": f"file {i}\n" * 50 for i in range(128)}
    src = make_skill(tmp_path / "src", "many", files, executables=[f"f{i:03}/data.txt"
                                                                   for i in range(0, 128, 3)])
    prefix, log = logging_prefix(tmp_path)
    dest = tmp_path / "dest"

    assert run_cli(src, "--dest", dest, "--exec", prefix) == 0

    assert calls(log) == 1  # the issue allows up to 5; one stream is all it takes
    got = sorted(p.relative_to(dest / "many").as_posix() for p in (dest / "many").rglob("*.txt"))
    assert got == sorted(files)
    assert os.access(dest / "many/f003/data.txt", os.X_OK)
    assert not os.access(dest / "many/f001/data.txt", os.X_OK)


@pytest.mark.parametrize("transport", ["local", "exec"])
def test_repeated_push_replaces_the_tree(tmp_path: Path, transport: str) -> None:
    src = make_skill(tmp_path / "v1", "tool", {"old.txt": "old", "keep.txt": "1"})
    dest = tmp_path / "dest"
    execs = ["--exec", "env"] if transport == "exec" else []
    assert run_cli(src, "--dest", dest, *execs) == 0

    shutil.rmtree(src)
    make_skill(tmp_path / "v1", "tool", {"keep.txt": "2", "new/n.txt": "n"})
    assert run_cli(src, "--dest", dest, *execs) == 0

    tree = sorted(p.relative_to(dest / "tool").as_posix() for p in (dest / "tool").rglob("*"))
    assert tree == ["SKILL.md", "keep.txt", "new", "new/n.txt"]
    assert (dest / "tool/keep.txt").read_text() == "2"
    assert sorted(p.name for p in dest.iterdir()) == ["tool"]
    no_staging_left(dest)


def test_push_replaces_a_file_or_link_in_the_way(tmp_path: Path) -> None:
    src = make_skill(tmp_path / "src", "tool")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "tool").write_text("not a skill")
    assert run_cli(src, "--dest", dest, "--exec", "env") == 0
    assert (dest / "tool/SKILL.md").is_file()


def test_exec_push_through_an_ssh_style_prefix_and_home_dest(tmp_path: Path,
                                                              isolated_home: Path) -> None:
    # ssh joins its arguments into one line for the remote shell; this fake does the same.
    fake_ssh = tmp_path / "bin" / "ssh"
    fake_ssh.parent.mkdir()
    fake_ssh.write_text('#!/bin/sh\nshift\nexec sh -c "$*"\n')
    fake_ssh.chmod(0o755)
    src = make_skill(tmp_path / "src", "quoting", {"a b'c.txt": "spaces and quotes"})

    assert run_cli(src, "--dest", "~/agent skills", "--exec", f"{fake_ssh} somehost") == 0

    assert (isolated_home / "agent skills/quoting/a b'c.txt").read_text() == "spaces and quotes"


def test_dead_pushes_staging_is_reaped_and_a_live_ones_kept(tmp_path: Path) -> None:
    src = make_skill(tmp_path / "src", "tool")
    dest = tmp_path / "dest"
    dest.mkdir()
    dead = tmp_path / ".dest.kb-push.0000.999999999"  # no such pid
    live = tmp_path / f".dest.kb-push.0000.{os.getpid()}"
    for d in (dead, live):
        (d / "new").mkdir(parents=True)
    # A push killed while it tried a hard link into DEST (to learn whether a rename from
    # beside DEST stays on one mount) leaves that link inside DEST.
    dead_link = dest / ".kb-push.0000.999999999"
    dead_link.write_text("")

    assert run_cli(src, "--dest", dest, "--exec", "env") == 0

    assert not dead.exists()
    assert not dead_link.exists()
    assert live.exists()


# --- refused before anything is sent ------------------------------------------------------------


def test_same_name_from_two_sources_is_exit_2_naming_both_and_nothing_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_skill(tmp_path / "team-a", "pdf")
    b = make_skill(tmp_path / "team-b", "pdf")
    prefix, log = logging_prefix(tmp_path)
    dest = tmp_path / "dest"

    assert run_cli(a, b, "--dest", dest, "--exec", prefix, "--exec", "env") == 2

    err = capsys.readouterr().err
    assert str(a) in err and str(b) in err
    assert calls(log) == 0
    assert not dest.exists()


def test_names_equal_up_to_case_are_refused_and_nothing_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Skill names are lowercase by rule, so "PDF" is refused by name before it can collide
    # with "pdf" on a case-insensitive sandbox: either way exit 2, nothing sent.
    a = make_skill(tmp_path / "x", "pdf")
    b = make_skill(tmp_path / "y", "PDF")
    prefix, log = logging_prefix(tmp_path)
    dest = tmp_path / "dest"

    assert run_cli(a, b, "--dest", dest, "--exec", prefix) == 2

    assert str(b) in capsys.readouterr().err
    assert calls(log) == 0
    assert not dest.exists()


@pytest.mark.parametrize("breakage", ["no-skill-md", "escaping-symlink", "fifo", "unreadable"])
def test_invalid_skill_is_exit_2_and_nothing_sent(tmp_path: Path, breakage: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    good = make_skill(tmp_path / "src", "good")
    bad = make_skill(tmp_path / "src", "bad", {"data.txt": "x"})
    if breakage == "no-skill-md":
        (bad / "SKILL.md").unlink()
    elif breakage == "escaping-symlink":
        (bad / "secrets").symlink_to("../../..")
    elif breakage == "fifo":
        os.mkfifo(bad / "pipe")
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads every file")
        (bad / "data.txt").chmod(0)
    prefix, log = logging_prefix(tmp_path)
    dest = tmp_path / "dest"

    assert run_cli(good, bad, "--dest", dest, "--exec", prefix) == 2

    assert str(bad) in capsys.readouterr().err
    assert calls(log) == 0
    assert not dest.exists()


def test_the_same_runtime_twice_is_a_usage_error(tmp_path: Path) -> None:
    src = make_skill(tmp_path / "src", "tool")
    assert run_cli(src, "--dest", tmp_path / "d", "--exec", "env", "--exec", "env") == 2
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("prefix", ["", "'unbalanced"])
def test_unusable_exec_prefix_is_a_usage_error(tmp_path: Path, prefix: str) -> None:
    src = make_skill(tmp_path / "src", "tool")
    assert run_cli(src, "--dest", tmp_path / "d", "--exec", prefix) == 2


# --- failures -----------------------------------------------------------------------------------


def test_exec_false_is_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_skill(tmp_path / "src", "tool")
    assert run_cli(src, "--dest", tmp_path / "d", "--exec", "false") == 1
    err = capsys.readouterr().err
    assert "push to false failed (exit code 1)" in err


def test_missing_exec_command_is_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_skill(tmp_path / "src", "tool")
    assert run_cli(src, "--dest", tmp_path / "d", "--exec", "no-such-exec-prefix -i box") == 1
    assert "no-such-exec-prefix: not found" in capsys.readouterr().err


def test_failing_runtime_is_reported_per_runtime_while_another_succeeds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = make_skill(tmp_path / "src", "tool")
    bad, _ = logging_prefix(tmp_path, exit_code=3, message="sandbox vanished: container gone")
    dest = tmp_path / "dest"

    assert run_cli(src, "--dest", dest, "--exec", bad, "--exec", "env", "--json") == 1

    captured = capsys.readouterr()
    assert "sandbox vanished: container gone" in captured.err
    reports = json.loads(captured.out)["runtimes"]
    assert [(r["runtime"], r["ok"]) for r in reports] == [(bad, False), ("env", True)]
    assert "exit code 3" in reports[0]["error"]
    assert "sandbox vanished: container gone" in reports[0]["error"]
    assert reports[0]["skills"] == []
    assert reports[1] == {"runtime": "env", "dest": str(dest), "ok": True, "error": None,
                          "skills": [{"name": "tool", "path": str(dest / "tool")}],
                          "removed": []}
    assert (dest / "tool/SKILL.md").is_file()


def test_a_stream_that_never_arrives_changes_nothing(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # `docker exec` without -i: the command runs with an empty stdin.
    src = make_skill(tmp_path / "src", "tool", {"v.txt": "new"})
    dest = tmp_path / "dest"
    make_skill(dest, "tool", {"v.txt": "old"})
    no_stdin = tmp_path / "no-stdin.sh"
    no_stdin.write_text('#!/bin/sh\nexec "$@" </dev/null\n')
    no_stdin.chmod(0o755)

    assert run_cli(src, "--dest", dest, "--exec", no_stdin) == 1

    assert "-i" in capsys.readouterr().err
    assert (dest / "tool/v.txt").read_text() == "old"
    no_staging_left(dest)


def test_a_file_shrinking_mid_push_changes_nothing(tmp_path: Path) -> None:
    src = make_skill(tmp_path / "src", "tool", {"big.bin": "x" * 1_000_000})
    dest = tmp_path / "dest"
    make_skill(dest, "tool", {"v.txt": "old"})

    class Shrinking:
        """Truncates the file after validation, as a concurrent writer would."""

        name = "shrinking"

        async def push(self, trees: Sequence[SkillTree], dest: str, *,
                       prune: bool = False) -> PushReport:
            (src / "big.bin").write_text("x" * 10)
            return await target_for("env").push(trees, dest, prune=prune)

    [report] = push_sync([src], str(dest), [Shrinking()])

    assert not report.ok
    assert report.error is not None and "shrank" in report.error
    assert (dest / "tool/v.txt").read_text() == "old"
    no_staging_left(dest)


# --- the library ----------------------------------------------------------------------------------


@dataclass
class CountingRuntime:
    name: str
    active: list[int] = field(default_factory=lambda: [0, 0])  # [now, peak], shared

    async def push(self, trees: Sequence[SkillTree], dest: str, *,
                   prune: bool = False) -> PushReport:
        self.active[0] += 1
        self.active[1] = max(self.active[1], self.active[0])
        await asyncio.sleep(0.02)
        self.active[0] -= 1
        return PushReport(self.name, dest, ok=True,
                          skills=tuple(PushedSkill(t.name, f"{dest}/{t.name}") for t in trees))


def test_library_push_runs_at_most_jobs_runtimes_at_once_in_order(tmp_path: Path) -> None:
    src = make_skill(tmp_path / "src", "tool")
    shared = [0, 0]
    runtimes = [CountingRuntime(f"rt{i}", shared) for i in range(7)]

    reports = asyncio.run(push([src], "/skills", runtimes, jobs=3))

    assert [r.runtime for r in reports] == [f"rt{i}" for i in range(7)]
    assert all(r.ok and r.skills == (PushedSkill("tool", "/skills/tool"),) for r in reports)
    assert shared[1] == 3


def test_library_push_turns_a_runtime_error_into_a_failed_report(tmp_path: Path) -> None:
    src = make_skill(tmp_path / "src", "tool")

    class Broken:
        name = "broken"

        async def push(self, trees: Sequence[SkillTree], dest: str, *,
                       prune: bool = False) -> PushReport:
            raise OSError(28, "No space left on device")

    [report, good] = push_sync([src], "/skills", [Broken(), CountingRuntime("ok")])

    assert not report.ok
    assert report.error == "push to broken failed: [Errno 28] No space left on device"
    assert good.ok


# --- resources ----------------------------------------------------------------------------------


def test_pushing_300_mib_keeps_peak_rss_under_120_mib(tmp_path: Path) -> None:
    src = make_skill(tmp_path / "src", "huge")
    block = os.urandom(1 << 20)
    with open(src / "data.bin", "wb") as f:
        for _ in range(300):
            f.write(block)
    dest = tmp_path / "dest"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()

    code, _, peak, stderr = peak_rss_run([sys.executable, "-m", "bootstrap", "push", str(src),
                                          "--dest", str(dest), "--exec", "env"], env)

    assert code == 0, stderr
    peak_mib = peak / (1 << 20)
    print(f"peak RSS pushing 300 MiB: {peak_mib:.1f} MiB in {time.monotonic() - start:.1f} s")
    assert peak_mib < 120
    assert (dest / "huge/data.bin").stat().st_size == 300 << 20
    with open(dest / "huge/data.bin", "rb") as f:
        f.seek(123 << 20)
        assert f.read(1 << 20) == block


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run the sandbox side as another user")
def test_modes_survive_an_unprivileged_sandbox_with_a_strict_umask(tmp_path: Path) -> None:
    # Non-root tar applies the umask unless -p; and a parent we cannot write makes the script
    # stage inside DEST instead. Both must still give exact modes and leave nothing behind.
    src = make_skill(tmp_path / "src", "tool", {"bin/run": "echo", "data": "d"},
                     executables=["bin/run"])
    (src / "data").chmod(0o640)
    prefix = "setpriv --reuid 65534 --regid 65534 --clear-groups sh -c 'umask 077; exec \"$@\"' sh"
    # pytest's tmp root is 0700: the sandbox user needs a path it can walk.
    with tempfile.TemporaryDirectory(prefix="kb-push-box-") as tmp:
        box = Path(tmp)
        box.chmod(0o755)
        (box / "skills").mkdir()
        os.chown(box / "skills", 65534, 65534)

        assert run_cli(src, "--dest", box / "skills", "--exec", prefix) == 0

        _check_unprivileged_result(box / "skills")


def _check_unprivileged_result(skills: Path) -> None:

    out = skills / "tool"
    assert stat.S_IMODE((out / "bin/run").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "data").stat().st_mode) == 0o640
    assert (out / "bin/run").stat().st_uid == 65534
    # The parent is not writable: staging, the lock and the record of what was pushed (the one
    # that stays) go inside DEST.
    assert sorted(p.name for p in skills.iterdir()) == [".kb-record", "tool"]
    no_staging_left(skills)


class _Interrupt(KeyboardInterrupt):
    """^C at a narrow seam: after part of the stream has gone out."""


def test_interrupt_mid_stream_stops_the_runtime_and_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bootstrap.trees.targets as runtimes

    src = make_skill(tmp_path / "src", "tool", {"big.bin": "x" * 3_000_000, "v.txt": "new"})
    dest = tmp_path / "dest"
    make_skill(dest, "tool", {"v.txt": "old"})
    real_stream = runtimes.tar_stream

    def interrupted(trees: Sequence[SkillTree], *, manifest: bytes) -> Iterator[bytes]:
        for i, data in enumerate(real_stream(trees, chunk=65536, manifest=manifest)):
            if i == 5:
                raise _Interrupt
            yield data

    monkeypatch.setattr(runtimes, "tar_stream", interrupted)

    with pytest.raises(_Interrupt):
        push_sync([src], str(dest), [target_for("env")])

    assert (dest / "tool/v.txt").read_text() == "old"
    no_staging_left(dest)


@pytest.mark.parametrize("transport", ["local", "exec"])
def test_a_symlinked_source_is_pushed_under_its_own_name(tmp_path: Path, transport: str) -> None:
    # skills/tool -> store/tool-v2: the skill is "tool", as in publish (front matter says so too).
    real = make_skill(tmp_path / "store", "tool", {"v.txt": "2"})
    real = real.rename(tmp_path / "store" / "tool-v2")
    (tmp_path / "skills").mkdir()
    (tmp_path / "skills/tool").symlink_to(real)
    dest = tmp_path / "dest"
    execs = ["--exec", "env"] if transport == "exec" else []

    assert run_cli(tmp_path / "skills/tool", "--dest", dest, *execs) == 0

    assert (dest / "tool/v.txt").read_text() == "2"
    assert not (dest / "tool-v2").exists()


@pytest.mark.parametrize("dest", ["/", "//", ""])
def test_unusable_dest_is_a_usage_error_before_anything_is_sent(tmp_path: Path, dest: str) -> None:
    src = make_skill(tmp_path / "src", "tool")
    prefix, log = logging_prefix(tmp_path)
    assert run_cli(src, "--dest", dest, "--exec", prefix) == 2
    assert calls(log) == 0


# --- pushes from separate invocations -----------------------------------------------------------


SKILLS = [f"tool{k}" for k in range(8)]  # several per push: a longer run of renames to race


def versions(tmp_path: Path, count: int) -> list[list[Path]]:
    """``count`` versions of the skills in SKILLS, each version with its own files."""
    return [[make_skill(tmp_path / f"v{i}", name, {"v.txt": str(i), f"only-{i}.txt": "x",
                                                   **{f"d/{j}.txt": f"{i}" * 2000
                                                      for j in range(10)}})
             for name in SKILLS] for i in range(count)]


def push_concurrently(sources: Sequence[Sequence[Path]], dest: str, prefix: str
                      ) -> list[subprocess.CompletedProcess[str]]:
    """Run one ``kernel-bootstrap push`` per group of sources, all at once, each its own
    process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "bootstrap", "push", *map(str, group),
                               "--dest", dest, "--exec", prefix], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for group in sources]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def assert_one_complete_version(skill: Path, count: int) -> None:
    """``skill`` is exactly one of the versions :func:`versions` made: not nested, not mixed."""
    version = int((skill / "v.txt").read_text())
    assert 0 <= version < count
    assert not (skill / skill.name).exists()
    assert sorted(p.name for p in skill.iterdir()) == ["SKILL.md", "d", f"only-{version}.txt",
                                                       "v.txt"]
    assert {(skill / "d" / f"{j}.txt").read_text() for j in range(10)} == {f"{version}" * 2000}


def test_four_concurrent_exec_pushes_into_one_dest_leave_one_complete_version(
        tmp_path: Path) -> None:
    sources = versions(tmp_path, 4)
    dest = tmp_path / "sandbox" / "skills"
    for _ in range(3):  # the race needs the right interleaving: give it a few chances
        results = push_concurrently(sources, str(dest), "env")
        assert [r.returncode for r in results] == [0] * 4, [r.stderr for r in results]
        assert sorted(p.name for p in dest.iterdir()) == SKILLS
        for name in SKILLS:
            assert_one_complete_version(dest / name, 4)
        no_staging_left(dest)


def test_a_push_killed_holding_the_lock_does_not_block_the_next(tmp_path: Path) -> None:
    # A sandbox push SIGKILLed between taking the lock and releasing it leaves the lock behind
    # with its (now dead) pid: the next push breaks it rather than waiting for minutes.
    src = make_skill(tmp_path / "src", "tool", {"v.txt": "new"})
    dest = tmp_path / "dest"
    lock = tmp_path / ".dest.kb-push-lock"
    lock.mkdir()
    (lock / "pid").write_text("999999999\n")  # no such process

    assert run_cli(src, "--dest", dest, "--exec", "env") == 0

    assert (dest / "tool/v.txt").read_text() == "new"
    assert not lock.exists()
    no_staging_left(dest)


def test_exec_true_names_the_runtime_once(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    src = make_skill(tmp_path / "src", "tool")
    assert run_cli(src, "--dest", tmp_path / "d", "--exec", "true") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: push to true failed: the runtime exited 0 but never "
                          "confirmed the push"), err
    assert err.count("push to true failed") == 1

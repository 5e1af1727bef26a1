"""Write faults at the three seams where we replace what other processes read.

ENOSPC, EIO and EACCES are injected on the write, the fsync and the replace/rename of the
marker (a merge during the skill sync), of ``publish`` (copying files, the hash record, the
swap) and of the venv swap (RENAME_EXCHANGE and rename-aside), plus a Windows-style
PermissionError on ``os.replace`` N times, then success. Each test asserts what another process
sees: the previous state byte for byte (marker bytes, the published tree's content hash, the old
venv's marker and interpreter), no temp or staging file left after the failing call itself, and
one clear message from the CLI (exit 1, one ``error:`` line, no traceback).

By default each seam is tried with one of the errors, rotating so that every error is used;
``KB_STRESS=1`` runs every seam with every error.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import bootstrap.trees.skilltree as skilltree
from bootstrap.cli import main
from bootstrap.config import load_config
from bootstrap.engine.ensure import ensure
from bootstrap.engine.status import status
from bootstrap.env import generations
from bootstrap.env.marker import read_marker
from bootstrap.env.venv import leftovers
from bootstrap.errors import BootstrapError
from bootstrap.primitives import log
from bootstrap.primitives.atomic import WRITE_ATTEMPTS
from bootstrap.trees.publish import publish, state_dir
from bootstrap.trees.skilltree import load_skill_tree, tree_hash
from testing.seams import Seam, apply_seams
from testing.skills import versioned_skill
from testing.world import World

ERRORS = ("ENOSPC", "EIO", "EACCES")
STRESS = bool(os.environ.get("KB_STRESS"))
WINDOWS_DENIED = "Access is denied"  # what Windows says while a reader holds the file open


def matrix(seams: list[str]) -> list[tuple[str, str]]:
    """(seam, error) pairs: all of them under KB_STRESS, else each seam once, errors rotating."""
    if STRESS:
        return list(itertools.product(seams, ERRORS))
    return list(zip(seams, itertools.cycle(ERRORS), strict=False))


def one_clear_error(code: int, err: str, *needles: str) -> None:
    assert code == 1, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    for needle in needles:
        assert needle in errors[0], errors[0]


def strerror(name: str) -> str:
    return os.strerror(getattr(errno, name))


FAULTS: list[tuple[str, str, str, str]] = []  # (seam, fault, outcome, left after the call)


def outcome(seam: str, fault: str, result: str, left: str = "nothing") -> None:
    FAULTS.append((seam, fault, result, left))


@pytest.fixture(scope="module", autouse=True)
def print_fault_matrix() -> Iterator[None]:
    yield
    if FAULTS:
        head = ("seam", "fault", "outcome (asserted)", "left after the failing call")
        widths = [max(len(r[i]) for r in [head, *FAULTS]) for i in range(4)]
        lines = [" | ".join(x.ljust(n) for x, n in zip(r, widths, strict=True))
                 for r in [head, tuple("-" * n for n in widths), *FAULTS]]
        print(f"\n\nwrite-fault matrix ({len(FAULTS)} cases)\n" + "\n".join(lines))


# --- the marker: a merge during the skill sync ---------------------------------------------

MARKER = ".bootstrap-version"
BETA_RECORD = '"project": "beta"'  # in the merge that lands beta, not in the attempt before it


@pytest.fixture(autouse=True)
def fresh_logger() -> None:
    # In-process runs log through a logger bound to the sys.stderr of its first use, which an
    # earlier test's capture may have closed since.
    log.configure()


@contextlib.contextmanager
def ready_world(root: Path, monkeypatch: pytest.MonkeyPatch,
                env: dict[str, str] | None = None) -> Iterator[World]:
    """A ready venv with skill alpha; in-process runs find the fake uv as the children do
    (and get ``env``, as the children do)."""
    w = World(root)
    w.env.update(env or {})
    w.write_config(requirements=["requests>=2"])
    w.skill("alpha")
    w.ensure()
    w.clear_log()
    with monkeypatch.context() as m:
        m.setenv("KERNEL_BOOTSTRAP_UV", str(w.uv))
        m.setenv("FAKE_UV_LOG", str(w.uv_log))
        for key, value in (env or {}).items():
            m.setenv(key, value)
        yield w


def ready(w: World) -> bool:
    return status(load_config(w.config)).ready


@pytest.fixture
def synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """Then beta is added: the next ensure is a skills-only sync."""
    with ready_world(tmp_path, monkeypatch) as w:
        w.skill("beta")
        yield w


def marker_temps(venv: Path) -> list[str]:
    return [n for n in os.listdir(venv) if n.startswith(f".{MARKER}.tmp-")]


@pytest.mark.parametrize(("call", "error"), matrix(["write", "fsync", "replace"]))
def test_a_failed_marker_merge_keeps_the_previous_marker_byte_for_byte(
    synced: World, call: str, error: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seam = Seam(call, error, match=MARKER, contains=BETA_RECORD)
    with monkeypatch.context() as m:
        run = apply_seams(m, seam)
        with pytest.raises(BootstrapError) as failed:
            ensure(load_config(synced.config))
    previous = run.faults[0]["previous"]
    assert previous is not None and b'"alpha"' in previous
    assert (synced.venv / MARKER).read_bytes() == previous
    assert read_marker(synced.venv).state == "ok"
    assert marker_temps(synced.venv) == []  # gone after the failing call itself
    message = str(failed.value)
    assert str(synced.venv / MARKER) in message and strerror(error) in message

    with monkeypatch.context() as m:  # the same fault through the CLI: one clear line
        run = apply_seams(m, seam)
        capsys.readouterr()
        code = main(["ensure", "--config", str(synced.config)])
    one_clear_error(code, capsys.readouterr().err, str(synced.venv / MARKER), strerror(error))
    assert (synced.venv / MARKER).read_bytes() == run.faults[0]["previous"]

    out = json.loads(synced.ensure("--json").stdout)  # the next normal run records beta
    assert out["installed"] == ["beta"] and ready(synced)
    assert marker_temps(synced.venv) == []
    outcome(f"marker merge: {call}", error, "exit 1, one line; marker byte-identical; the next "
            "ensure records the skill")


@pytest.mark.parametrize("denials", [1, WRITE_ATTEMPTS - 1, WRITE_ATTEMPTS])
def test_a_marker_replace_denied_n_times_is_retried_then_gives_up_cleanly(
    synced: World, denials: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = (synced.venv / MARKER).read_bytes()
    with monkeypatch.context() as m:
        run = apply_seams(m, Seam("replace", "EACCES", match=MARKER, contains=BETA_RECORD,
                                  times=denials, message=WINDOWS_DENIED))
        if denials < WRITE_ATTEMPTS:
            result = ensure(load_config(synced.config))
        else:
            with pytest.raises(BootstrapError, match=WINDOWS_DENIED):
                ensure(load_config(synced.config))
    assert len(run.faults) == denials
    assert marker_temps(synced.venv) == []
    if denials < WRITE_ATTEMPTS:
        assert result.installed == ("beta",)
        data = read_marker(synced.venv).data
        assert data is not None and "beta" in data["skills"]
    else:
        assert (synced.venv / MARKER).read_bytes() == run.faults[0]["previous"]
        assert before != run.faults[0]["previous"]  # the attempt record had landed first
    outcome("marker merge: replace", f"PermissionError x{denials}",
            "retried, written" if denials < WRITE_ATTEMPTS else "exit 1; marker byte-identical")


# --- the venv swap -----------------------------------------------------------------------------

NEW_RUNTIME = ["requests>=2", "six"]
# A venv without generations (Windows): the staged swap, and with no exchange its rename-aside.
PLAIN = {"KERNEL_BOOTSTRAP_NO_GENERATIONS": "1"}
ASIDE = {**PLAIN, "KERNEL_BOOTSTRAP_NO_EXCHANGE": "1"}
SWAP_SEAMS: dict[str, tuple[dict[str, str], str, str]] = {
    # seam id: (the venv's kind, call, a path substring)
    "pin (new generation)": ({}, "replace", "000-kernel-bootstrap-pin.pth"),
    "base marker (new generation)": ({}, "replace", ".bootstrap-version"),
    "flip: the link's rename": ({}, "rename", ".venv.link-"),
    "base marker (staging)": (PLAIN, "replace", ".venv.stage-"),
    "exchange": (PLAIN, "exchange", "/venv"),
    "journal write": (ASIDE, "write", ".venv.swap.tmp-"),
    "journal fsync": (ASIDE, "fsync", ".venv.swap.tmp-"),
    "journal replace": (ASIDE, "replace", ".venv.swap.tmp-"),
    "old venv aside": (ASIDE, "rename", ".venv.retired-"),
    "new venv in": (ASIDE, "rename", ".venv.stage-"),
}


@pytest.fixture
def rebuilding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               request: pytest.FixtureRequest) -> Iterator[World]:
    """Then the runtime changes: a rebuild into a new generation and a flip (or, for a venv
    without generations, a staged rebuild and a swap)."""
    env = getattr(request, "param", {})
    with ready_world(tmp_path, monkeypatch, env) as w:
        w.write_config(requirements=NEW_RUNTIME)
        yield w


def runs(python: Path) -> bool:
    done = subprocess.run([str(python), "-c", "import sys"], capture_output=True, check=False)
    return done.returncode == 0


def beside(w: World) -> list[str]:
    names = [p.name for p in leftovers(w.venv) + generations.others(w.venv)]
    return names + ([".venv.swap"] if (w.root / ".venv.swap").exists() else [])


@pytest.mark.parametrize(("rebuilding", "seam", "error"),
                         [(SWAP_SEAMS[s][0], s, e) for s, e in matrix(list(SWAP_SEAMS))],
                         indirect=["rebuilding"])
def test_a_failed_venv_swap_keeps_the_old_venv_and_leaves_nothing_beside_it(
    rebuilding: World, seam: str, error: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, call, match = SWAP_SEAMS[seam]
    marker = (rebuilding.venv / MARKER).read_bytes()
    with monkeypatch.context() as m:
        run = apply_seams(m, Seam(call, error, match=match))
        capsys.readouterr()
        code = main(["ensure", "--config", str(rebuilding.config)])
    assert run.faults, "the seam was never reached"
    one_clear_error(code, capsys.readouterr().err, strerror(error))
    assert (rebuilding.venv / MARKER).read_bytes() == marker
    assert runs(rebuilding.python) and rebuilding.imports("alpha")
    assert not rebuilding.imports("six")
    assert beside(rebuilding) == []  # staging, journal, retired: gone after the failing call

    out = json.loads(rebuilding.ensure("--json").stdout)
    assert out["action"] == "rebuild" and rebuilding.imports("six")
    assert beside(rebuilding) == [] and ready(rebuilding)
    outcome(f"venv swap: {seam}", error, "exit 1, one line; old venv runs, marker "
            "byte-identical; the next ensure rebuilds")


@pytest.mark.parametrize("error", ["EIO"] if not STRESS else list(ERRORS))
def test_a_directory_fsync_failing_after_the_swap_is_a_warning_not_a_failed_rebuild(
    rebuilding: World, error: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with monkeypatch.context() as m:
        run = apply_seams(m, Seam("fsync", error, path=str(rebuilding.root)))
        capsys.readouterr()
        code = main(["ensure", "--config", str(rebuilding.config)])
    err = capsys.readouterr().err
    assert run.faults and code == 0, err
    assert "new venv is in place" in err and strerror(error) in err
    assert rebuilding.imports("six") and ready(rebuilding)
    assert beside(rebuilding) == []
    outcome("venv swap: directory fsync after it", error, "exit 0 + warning; new venv in place")


@pytest.mark.parametrize("rebuilding", [PLAIN], indirect=True)
@pytest.mark.parametrize("denials", [1, WRITE_ATTEMPTS])
def test_a_swap_journal_replace_denied_n_times(
    rebuilding: World, denials: int, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    marker = (rebuilding.venv / MARKER).read_bytes()
    with monkeypatch.context() as m:
        m.setenv("KERNEL_BOOTSTRAP_NO_EXCHANGE", "1")
        apply_seams(m, Seam("replace", "EACCES", match=".venv.swap.tmp-", times=denials,
                            message=WINDOWS_DENIED))
        capsys.readouterr()
        code = main(["ensure", "--config", str(rebuilding.config)])
    err = capsys.readouterr().err
    if denials < WRITE_ATTEMPTS:
        assert code == 0, err
        assert rebuilding.imports("six") and ready(rebuilding)
    else:
        one_clear_error(code, err, WINDOWS_DENIED)
        assert (rebuilding.venv / MARKER).read_bytes() == marker
    assert beside(rebuilding) == []
    outcome("venv swap: journal replace", f"PermissionError x{denials}",
            "retried, swapped" if denials < WRITE_ATTEMPTS else "exit 1; old venv unchanged")


# --- publish -----------------------------------------------------------------------------------

V1 = ("SKILL.md", "a.txt", "sub/c.txt")
V2 = ("SKILL.md", "b.txt", "sub/d.txt", "sub/deep/e.txt")


def content(top: Path) -> dict[str, tuple[int, str]]:
    """Every entry below ``top``: mode and content digest, as a reader would see them."""
    out = {}
    for dirpath, dirs, files in os.walk(top):
        for n in dirs + files:
            p = Path(dirpath) / n
            st = p.lstat()
            body = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
            out[str(p.relative_to(top))] = (st.st_mode, body)
    return out


def publish_leftovers(root: Path) -> dict[str, list[str]]:
    base = state_dir(root)
    found = {d: sorted(os.listdir(base / d)) for d in ("staging", "journal", "retired")}
    found["temp"] = [n for n in os.listdir(base / "hashes") if ".tmp-" in n]
    return found


CLEAN: dict[str, list[str]] = {"staging": [], "journal": [], "retired": [], "temp": []}


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path, Path]:
    """ROOT holding v1 of `demo` (grace 0: nothing retired), and a v2 source."""
    root = tmp_path / "out" / "skills"
    v1 = versioned_skill(tmp_path / "v1", "v1", V1)
    v2 = versioned_skill(tmp_path / "v2", "v2", V2)
    publish([v1], root, grace=0)
    return root, v1, v2


def publish_cli(capsys: pytest.CaptureFixture[str], src: Path, root: Path) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["publish", str(src), "--into", str(root), "--grace", "0"])
    return code, capsys.readouterr().err


PUBLISH_SEAMS = {
    # seam id: (KERNEL_BOOTSTRAP_NO_EXCHANGE?, copy mode, call, a path substring)
    "copy: write": (False, "", "write", "/staging/"),
    "copy: fsync (per file)": (False, "each", "fsync", "/staging/"),
    "copy: syncfs": (False, "syncfs", "syncfs", "/staging/"),
    "swap: exchange": (False, "", "exchange", "/staging/"),
    "swap: journal write": (True, "", "write", "/journal/"),
    "swap: journal fsync": (True, "", "fsync", "/journal/"),
    "swap: journal replace": (True, "", "replace", "/journal/"),
    "swap: old tree aside": (True, "", "rename", "/retired/"),
    "swap: new tree in": (True, "", "rename", "/staging/"),
}


def copy_mode(m: pytest.MonkeyPatch, mode: str) -> None:
    if mode == "each":  # no syncfs: an fsync per file and directory
        m.setattr(skilltree, "_syncfs", lambda: None)
    elif mode == "syncfs":  # whatever this kernel has, take the syncfs branch
        m.setattr(skilltree, "_syncfs", lambda: lambda fd: 0)


@pytest.mark.parametrize(("seam", "error"), matrix(list(PUBLISH_SEAMS)))
def test_a_failed_publish_leaves_the_published_tree_as_it_was(
    published: tuple[Path, Path, Path], seam: str, error: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    root, _, v2 = published
    no_exchange, mode, call, match = PUBLISH_SEAMS[seam]
    before, digest = content(root), tree_hash(load_skill_tree(root / "demo"))
    with monkeypatch.context() as m:
        if no_exchange:
            m.setenv("KERNEL_BOOTSTRAP_NO_EXCHANGE", "1")
        copy_mode(m, mode)
        run = apply_seams(m, Seam(call, error, match=match))
        code, err = publish_cli(capsys, v2, root)
    assert run.faults, "the seam was never reached"
    one_clear_error(code, err, strerror(error), "'demo'")
    assert content(root) == before and tree_hash(load_skill_tree(root / "demo")) == digest
    assert publish_leftovers(root) == CLEAN  # after the failing call itself

    code, err = publish_cli(capsys, v2, root)
    assert code == 0, err
    assert (root / "demo" / "sub" / "deep" / "e.txt").read_text() == "v2\n"
    assert publish_leftovers(root) == CLEAN
    outcome(f"publish {seam}", error, "exit 1, one line; tree hash unchanged")


AFTER_THE_SWAP = {
    # The new tree is already live when these fail: the publish has happened, so it succeeds
    # with a warning (the hash record is a cache; the outgoing tree loses its grace period).
    "hash record write": (False, "write", "/hashes/"),
    "hash record fsync": (False, "fsync", "/hashes/"),
    "hash record replace": (False, "replace", "/hashes/"),
    "outgoing tree to retired/": (False, "rename", "/retired/"),
    "skill root fsync": (False, "fsync", "ROOT"),
}


@pytest.mark.parametrize(("seam", "error"), matrix(list(AFTER_THE_SWAP)))
def test_a_fault_after_the_swap_publishes_with_a_warning(
    published: tuple[Path, Path, Path], seam: str, error: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    root, _, v2 = published
    no_exchange, call, match = AFTER_THE_SWAP[seam]
    rule = Seam(call, error, path=str(root)) if match == "ROOT" else Seam(call, error, match)
    with monkeypatch.context() as m:
        if no_exchange:
            m.setenv("KERNEL_BOOTSTRAP_NO_EXCHANGE", "1")
        run = apply_seams(m, rule)
        code, err = publish_cli(capsys, v2, root)
    assert run.faults, "the seam was never reached"
    assert code == 0, err
    assert "Traceback" not in err and "warning" in err and strerror(error) in err
    assert tree_hash(load_skill_tree(root / "demo")) == tree_hash(load_skill_tree(v2))
    assert publish_leftovers(root) == CLEAN

    code, err = publish_cli(capsys, v2, root)  # the next run hashes the tree and finds it done
    assert code == 0, err
    assert publish_leftovers(root) == CLEAN
    outcome(f"publish after the swap: {seam}", error, "exit 0 + warning; new tree whole")


@pytest.mark.parametrize(("target", "denials"), [("/journal/", 1), ("/journal/", WRITE_ATTEMPTS),
                                                 ("/hashes/", WRITE_ATTEMPTS - 1),
                                                 ("/hashes/", WRITE_ATTEMPTS)])
def test_a_publish_replace_denied_n_times(
    published: tuple[Path, Path, Path], target: str, denials: int,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    root, _, v2 = published
    before = content(root)
    with monkeypatch.context() as m:
        m.setenv("KERNEL_BOOTSTRAP_NO_EXCHANGE", "1")
        run = apply_seams(m, Seam("replace", "EACCES", match=target, times=denials,
                                  message=WINDOWS_DENIED))
        code, err = publish_cli(capsys, v2, root)
    assert len(run.faults) == denials
    if target == "/journal/" and denials == WRITE_ATTEMPTS:
        one_clear_error(code, err, WINDOWS_DENIED)
        assert content(root) == before
    else:  # retried into success, or only the hash record (a cache) could not be written
        assert code == 0, err
        assert (root / "demo" / "b.txt").read_text() == "v2\n"
    assert publish_leftovers(root) == CLEAN
    failed = target == "/journal/" and denials == WRITE_ATTEMPTS
    outcome(f"publish {target.strip('/')} replace", f"PermissionError x{denials}",
            "exit 1; tree unchanged" if failed else
            "retried, published" if denials < WRITE_ATTEMPTS else "exit 0 + warning")

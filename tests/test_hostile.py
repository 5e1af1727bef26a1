"""Hostile skill trees, through ``publish`` and ``push --exec env`` alike.

Refused before anything is written (exit 2, the offending path named, no destination created):
symlinks that leave the skill (``..`` as written or as resolved, absolute targets, even
absolute ones that point back inside), fifos, names that differ only in case or in Unicode
normalisation, names that are not valid UTF-8. Delivered, and delivered right: symlinks with an
internal ``..``, symlink loops (kept as links, never followed), hard links (copied as
independent files, inside or reaching outside the skill), a name holding a newline. And a big
tree: 10^4 files by default, 10^5 with ``KB_STRESS=1``; each run's wall time and peak RSS
(``os.wait4``) is printed and bounded.
"""

from __future__ import annotations

import os
import sys
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest

from bootstrap.cli import main
from testing.processes import peak_rss_run
from testing.skills import make_skill

TRANSPORTS = ("publish", "push")
Build = Callable[[Path], tuple[Path, str]]
Check = Callable[[Path, Path], None]


def deliver(capsys: pytest.CaptureFixture[str], transport: str, src: Path, dest: Path
            ) -> tuple[int, str]:
    capsys.readouterr()
    if transport == "publish":
        code = main(["publish", str(src), "--into", str(dest)])
    else:
        code = main(["push", str(src), "--dest", str(dest), "--exec", "env"])
    return code, capsys.readouterr().err


def skill(tmp_path: Path) -> Path:
    return make_skill(tmp_path / "src", "hostile", {"a.txt": "a\n", "sub/b.txt": "b\n"})


# --- refused -----------------------------------------------------------------------------------

def link(target: str | Callable[[Path], str], at: str = "link") -> Build:
    def build(tmp_path: Path) -> tuple[Path, str]:
        s = skill(tmp_path)
        text = target(s) if callable(target) else target
        (s / at).parent.mkdir(parents=True, exist_ok=True)
        (s / at).symlink_to(text)
        return s, f"{s / at}: symlink"

    return build


def hop_out(tmp_path: Path) -> tuple[Path, str]:
    # Each link looks harmless alone: sub/up -> .. is the skill root, x -> sub/up/.. lexically
    # is sub; followed, it is the skill's parent.
    s = skill(tmp_path)
    (s / "sub" / "up").symlink_to("..")
    (s / "x").symlink_to("sub/up/..")
    return s, f"{s / 'x'}: symlink 'sub/up/..' points outside"


def fifo(tmp_path: Path) -> tuple[Path, str]:
    s = skill(tmp_path)
    os.mkfifo(s / "sub" / "pipe")  # opening it for the copy would block forever
    return s, "pipe: is a fifo"


def case_twins(tmp_path: Path) -> tuple[Path, str]:
    s = skill(tmp_path)
    (s / "README").write_text("upper\n")
    (s / "readme").write_text("lower\n")
    return s, "differ only in case"


def normalisation_twins(tmp_path: Path) -> tuple[Path, str]:
    s = skill(tmp_path)
    (s / unicodedata.normalize("NFC", "caf\u00e9")).write_text("composed\n")
    (s / unicodedata.normalize("NFD", "caf\u00e9")).write_text("decomposed\n")
    return s, "differ only in case"


def not_utf8(tmp_path: Path) -> tuple[Path, str]:
    s = skill(tmp_path)
    try:
        os.close(os.open(os.fsencode(s) + b"/bad-\xff\xfe", os.O_CREAT | os.O_WRONLY, 0o644))
    except OSError as e:  # a file system that only takes UTF-8 names
        pytest.skip(f"this file system refuses the name: {e}")
    return s, "file name is not valid UTF-8"


REFUSED: dict[str, Build] = {
    "dotdot out": link("../../etc/passwd"),
    "dotdot out, lexically": link("sub/../../outside"),
    "dotdot to a sibling": link("../../../other-skill", at="sub/deep/x"),
    "absolute": link("/etc/passwd"),
    "absolute, back inside": link(lambda s: str(s / "a.txt")),
    "root": link("/"),
    "out through another link": hop_out,
    "fifo": fifo,
    "names equal up to case": case_twins,
    "names equal up to NFC": normalisation_twins,
    "name not UTF-8": not_utf8,
}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", list(REFUSED))
def test_a_hostile_tree_is_refused_before_anything_is_written(
    tmp_path: Path, case: str, transport: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src, expected = REFUSED[case](tmp_path)
    dest = tmp_path / "out" / "skills"
    began = time.monotonic()
    code, err = deliver(capsys, transport, src, dest)
    assert time.monotonic() - began < 10  # a fifo or a loop never makes it wait
    assert code == 2, err
    assert "Traceback" not in err
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert expected in line and "hostile" in line
    assert not (tmp_path / "out").exists()  # nothing created: no root, no state, no staging


# --- delivered ---------------------------------------------------------------------------------

def internal_dotdot(tmp_path: Path) -> tuple[Path, Check]:
    s = skill(tmp_path)
    (s / "sub" / "to-a").symlink_to("../a.txt")
    (s / "sub" / "up").symlink_to("..")  # the skill root itself: a directory loop

    def check(out: Path, src: Path) -> None:
        assert os.readlink(out / "sub" / "to-a") == "../a.txt"
        assert (out / "sub" / "to-a").read_text() == "a\n"
        assert os.readlink(out / "sub" / "up") == ".."  # a link, never a copied loop
        assert (out / "sub" / "up" / "sub" / "b.txt").read_text() == "b\n"

    return s, check


def loops(tmp_path: Path) -> tuple[Path, Check]:
    s = skill(tmp_path)
    (s / "ping").symlink_to("pong")
    (s / "pong").symlink_to("ping")
    (s / "sub" / "self").symlink_to("self")

    def check(out: Path, src: Path) -> None:
        assert os.readlink(out / "ping") == "pong" and os.readlink(out / "pong") == "ping"
        assert os.readlink(out / "sub" / "self") == "self"
        assert not (out / "ping").exists()  # still a loop: dangling, as in the source

    return s, check


def hard_links(tmp_path: Path) -> tuple[Path, Check]:
    s = skill(tmp_path)
    os.link(s / "a.txt", s / "sub" / "a-again.txt")
    outside = tmp_path / "outside.txt"
    outside.write_text("from outside\n")
    os.link(outside, s / "ext.txt")

    def check(out: Path, src: Path) -> None:
        a, again, ext = out / "a.txt", out / "sub" / "a-again.txt", out / "ext.txt"
        assert a.read_text() == again.read_text() == "a\n"
        assert ext.read_text() == "from outside\n"
        assert {p.stat().st_nlink for p in (a, again, ext)} == {1}  # independent copies
        assert a.stat().st_ino != again.stat().st_ino
        a.write_text("changed at the destination\n")
        assert again.read_text() == "a\n" and (src / "a.txt").read_text() == "a\n"
        assert outside.read_text() == "from outside\n"

    return s, check


def newline_name(tmp_path: Path) -> tuple[Path, Check]:
    s = skill(tmp_path)
    (s / "sub" / "two\nlines.txt").write_text("nl\n")
    (s / "tab\tand space .txt").write_text("ws\n")

    def check(out: Path, src: Path) -> None:
        assert (out / "sub" / "two\nlines.txt").read_text() == "nl\n"
        assert (out / "tab\tand space .txt").read_text() == "ws\n"

    return s, check


DELIVERED: dict[str, Callable[[Path], tuple[Path, Check]]] = {
    "internal dotdot and a directory loop": internal_dotdot,
    "symlink loops": loops,
    "hard links": hard_links,
    "newline in a name": newline_name,
}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", list(DELIVERED))
def test_an_awkward_but_safe_tree_is_delivered_faithfully(
    tmp_path: Path, case: str, transport: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src, check = DELIVERED[case](tmp_path)
    dest = tmp_path / "out" / "skills"
    code, err = deliver(capsys, transport, src, dest)
    assert code == 0, err
    assert sorted(os.listdir(dest)) == ["hostile"]
    check(dest / "hostile", src)


# --- a big tree --------------------------------------------------------------------------------

FILES = 100_000 if os.environ.get("KB_STRESS") else 10_000
# Generous (2 cores, other jobs running): a bound on memory; the time printed is a figure.
MAX_RSS = {10_000: 150 << 20, 100_000: 300 << 20}


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = make_skill(tmp_path_factory.mktemp("big"), "big")
    per_dir = 100
    for d in range(FILES // per_dir):
        folder = src / f"d{d:04}"
        folder.mkdir()
        for f in range(per_dir):
            (folder / f"f{f:03}.txt").write_bytes(b"x" * (f % 7) + b"\n")
    return src


def count_files(top: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(top))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_big_tree_is_delivered_in_bounded_time_and_memory(
    big_tree: Path, tmp_path: Path, transport: str
) -> None:
    dest = tmp_path / "out" / "skills"
    cli = [sys.executable, "-m", "bootstrap"]
    if transport == "publish":
        argv = [*cli, "publish", str(big_tree), "--into", str(dest)]
    else:
        argv = [*cli, "push", str(big_tree), "--dest", str(dest), "--exec", "env"]
    code, seconds, rss, err = peak_rss_run(argv, dict(os.environ))
    assert code == 0, err
    assert count_files(dest / "big") == FILES + 1  # and SKILL.md
    print(f"\n{transport} of {FILES} files: {seconds:.2f} s, peak RSS {rss / 2**20:.0f} MiB")
    assert rss < MAX_RSS[FILES]  # memory bounds the tree's size; its time is a benchmark's


# --- a file swapped for a link after validation ------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_file_swapped_for_a_link_out_after_validation_leaks_nothing(
    tmp_path: Path, transport: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import bootstrap.trees.publish as pub
    import bootstrap.trees.push as push
    from bootstrap.trees.skilltree import SkillTree, tree_hash

    src = skill(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy me\n")

    def swap_in_link() -> None:
        (src / "a.txt").unlink()
        (src / "a.txt").symlink_to(secret)

    if transport == "publish":
        def hash_then_swap(tree: SkillTree) -> str:
            digest = tree_hash(tree)
            swap_in_link()
            return digest

        monkeypatch.setattr(pub, "tree_hash", hash_then_swap)
    else:
        real_check = push._check_readable

        def check_then_swap(tree: SkillTree) -> None:
            real_check(tree)
            swap_in_link()

        monkeypatch.setattr(push, "_check_readable", check_then_swap)
    dest = tmp_path / "out" / "skills"
    code, err = deliver(capsys, transport, src, dest)
    # publish compares the hash of what it copied (exit 2); push opens with O_NOFOLLOW and
    # aborts the stream before its end marker, so the runtime swaps nothing in (exit 1).
    assert code == (2 if transport == "publish" else 1), err
    assert "Traceback" not in err
    assert not (dest / "hostile").exists()
    leaked = [p for p in tmp_path.joinpath("out").rglob("*")
              if p.is_file() and not p.is_symlink() and b"do not copy" in p.read_bytes()]
    assert leaked == []

"""The shared skill-tree walk: what it refuses, the order it lists, and what its hash covers."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bootstrap.errors import SkillError
from bootstrap.trees.skilltree import (
    Entry,
    SkillTree,
    check_collisions,
    copy_tree,
    load_skill_tree,
    tree_hash,
)
from testing.skills import make_skill


def rels(src: Path) -> list[str]:
    return [e.rel for e in load_skill_tree(src).entries]


def test_entries_are_sorted_by_utf8_bytes_with_parents_before_children(tmp_path: Path) -> None:
    # "é" sorts after "z" as bytes (0xc3 > 0x7a); a locale-aware sort would put it first.
    skill = make_skill(tmp_path, files={"z.txt": "", "é.txt": "", "a/b": "", "a-b": "", "B": ""})
    assert rels(skill) == ["B", "SKILL.md", "a", "a-b", "a/b", "z.txt", "é.txt"]
    listed = rels(skill)
    for rel in listed:
        if "/" in rel:
            assert listed.index(rel.rsplit("/", 1)[0]) < listed.index(rel)


def test_entries_carry_kind_mode_size_and_absolute_path(tmp_path: Path) -> None:
    skill = make_skill(tmp_path, files={"bin/run": "#!/bin/sh\n"})
    (skill / "bin" / "run").chmod(0o755)
    (skill / "run").symlink_to("bin/run")
    tree = load_skill_tree(skill)
    by_rel = {e.rel: e for e in tree.entries}
    assert tree.name == "demo"
    assert tree.root == skill.resolve()
    assert by_rel["bin"].kind == "dir" and by_rel["bin"].size == 0
    assert by_rel["bin/run"] == Entry(
        "bin/run", "file", 0o755, 10, (skill / "bin/run").stat().st_mtime_ns,
        skill.resolve() / "bin/run", None,
    )
    assert by_rel["run"].kind == "symlink" and by_rel["run"].target == "bin/run"


def test_a_relative_src_gets_an_absolute_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_skill(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert load_skill_tree(Path("demo")).root == (tmp_path / "demo").resolve()


def test_internal_symlinks_are_kept_not_followed_even_when_they_loop(tmp_path: Path) -> None:
    skill = make_skill(tmp_path, files={"sub/a": "x"})
    (skill / "to-dir").symlink_to("sub")
    (skill / "loop1").symlink_to("loop2")
    (skill / "loop2").symlink_to("loop1")
    (skill / "dangling").symlink_to("not-there")
    tree = load_skill_tree(skill)
    kinds = {e.rel: e.kind for e in tree.entries}
    assert kinds["to-dir"] == "symlink"
    assert "to-dir/a" not in kinds  # a symlinked directory is not descended into
    assert {kinds["loop1"], kinds["loop2"], kinds["dangling"]} == {"symlink"}


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("abs", "/etc/passwd"),
        ("up", "../outside"),
        ("sub/up2", "../../outside"),
        ("sneaky", "sub/../../outside"),
    ],
)
def test_symlinks_that_leave_the_skill_are_refused(tmp_path: Path, link: str, target: str) -> None:
    skill = make_skill(tmp_path, files={"sub/a": "x"})
    (skill / link).symlink_to(target)
    with pytest.raises(SkillError, match="demo") as info:
        load_skill_tree(skill)
    assert str(skill / link) in str(info.value)


def test_a_hop_through_another_link_that_escapes_is_refused(tmp_path: Path) -> None:
    # Lexically "d/e/link/.." is inside, but link -> ../.. is the skill root, so its ".." is not.
    skill = make_skill(tmp_path)
    (skill / "d" / "e").mkdir(parents=True)
    (skill / "d/e/link").symlink_to("../..")
    (skill / "d/e/x").symlink_to("link/..")
    with pytest.raises(SkillError, match="points outside"):
        load_skill_tree(skill)


def test_fifos_and_sockets_are_refused_naming_the_path(tmp_path: Path) -> None:
    skill = make_skill(tmp_path)
    os.mkfifo(skill / "pipe")
    with pytest.raises(SkillError, match="fifo") as info:
        load_skill_tree(skill)
    assert str(skill / "pipe") in str(info.value)
    (skill / "pipe").unlink()
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(skill / "sock"))
        with pytest.raises(SkillError, match="socket"):
            load_skill_tree(skill)
    finally:
        sock.close()


def test_names_equal_up_to_case_in_one_directory_are_refused(tmp_path: Path) -> None:
    skill = make_skill(tmp_path, files={"docs/README": "a", "docs/readme": "b"})
    with pytest.raises(SkillError, match="differ only in case"):
        load_skill_tree(skill)


def test_composed_and_decomposed_accents_collide_too(tmp_path: Path) -> None:
    skill = make_skill(tmp_path, files={"caf\u00e9": "a", "cafe\u0301": "b"})
    with pytest.raises(SkillError, match="differ only in case"):
        load_skill_tree(skill)


def test_a_file_name_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    skill = make_skill(tmp_path)
    fd = os.open(os.fsencode(skill) + b"/bad-\xff", os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(fd)
    with pytest.raises(SkillError, match="not valid UTF-8"):
        load_skill_tree(skill)


@pytest.mark.parametrize("name", [".hidden", "Upper", "a--b", "a..b", "a-", "x" * 65])
def test_invalid_skill_names_are_refused(tmp_path: Path, name: str) -> None:
    skill = tmp_path / name
    skill.mkdir()
    (skill / "SKILL.md").write_text(f"---\nname: {name}\ndescription: test\n---\n")
    with pytest.raises(SkillError, match="invalid skill name"):
        load_skill_tree(skill)


def test_missing_skill_md_and_missing_dir_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SkillError, match=r"no SKILL\.md"):
        load_skill_tree(tmp_path / "empty")
    with pytest.raises(SkillError, match="not a directory"):
        load_skill_tree(tmp_path / "nope")


def _tree(name: str, root: str) -> SkillTree:
    return SkillTree(name=name, root=Path(root), entries=())


def test_collisions_name_both_sources() -> None:
    with pytest.raises(SkillError) as info:
        check_collisions([_tree("foo", "/a/foo"), _tree("bar", "/b/bar"), _tree("foo", "/c/foo")])
    assert "/a/foo" in str(info.value) and "/c/foo" in str(info.value)
    with pytest.raises(SkillError, match="/x/Foo"):
        check_collisions([_tree("foo", "/a/foo"), _tree("Foo", "/x/Foo")])
    check_collisions([_tree("foo", "/a/foo"), _tree("bar", "/b/bar")])


# --- the hash ----------------------------------------------------------------------------------


def reference_hash(tree: SkillTree) -> str:
    """The documented record format, written out independently of the implementation."""
    h = hashlib.sha256()

    def field(b: bytes) -> None:
        h.update(len(b).to_bytes(8, "big") + b)

    field(b"kernel-bootstrap tree v1")
    for e in sorted(tree.entries, key=lambda e: e.rel.encode()):
        if e.kind == "file":
            content = hashlib.sha256(e.path.read_bytes()).digest()
        else:
            content = (e.target or "").encode()
        mode = 0 if e.kind == "symlink" else e.mode
        for b in (e.rel.encode(), e.kind.encode(), oct(mode)[2:].encode(), str(e.size).encode(),
                  content):
            field(b)
    return "sha256:" + h.hexdigest()


def test_tree_hash_follows_the_documented_format(tmp_path: Path) -> None:
    skill = make_skill(tmp_path, files={"a/b.txt": "hello", "c": "x" * 3_000_000})
    (skill / "link").symlink_to("a/b.txt")
    tree = load_skill_tree(skill)
    assert tree_hash(tree) == reference_hash(tree)
    assert tree_hash(tree).startswith("sha256:")


def test_tree_hash_ignores_mtime_but_not_content_mode_or_links(tmp_path: Path) -> None:
    skill = make_skill(tmp_path, files={"a.txt": "one"})
    (skill / "link").symlink_to("a.txt")
    base = tree_hash(load_skill_tree(skill))
    os.utime(skill / "a.txt", ns=(1, 1))
    assert tree_hash(load_skill_tree(skill)) == base
    (skill / "a.txt").chmod(0o755)
    assert tree_hash(load_skill_tree(skill)) != base
    (skill / "a.txt").chmod(0o644)
    (skill / "a.txt").write_text("two")
    assert tree_hash(load_skill_tree(skill)) != base
    (skill / "a.txt").write_text("one")
    (skill / "link").unlink()
    (skill / "link").symlink_to("SKILL.md")
    assert tree_hash(load_skill_tree(skill)) != base


def test_length_prefixes_keep_different_splits_apart(tmp_path: Path) -> None:
    one = make_skill(tmp_path / "1", files={"ab": "c"})
    two = make_skill(tmp_path / "2", files={"a": "bc"})
    assert tree_hash(load_skill_tree(one)) != tree_hash(load_skill_tree(two))


_names = st.text(alphabet="abcXY._-é", min_size=1, max_size=6).filter(
    lambda n: n not in {".", ".."}
)


@settings(max_examples=30, deadline=None)
@given(files=st.dictionaries(_names, st.binary(max_size=64), min_size=1, max_size=8),
       data=st.data())
def test_hash_does_not_depend_on_creation_order(
    tmp_path_factory: pytest.TempPathFactory, files: dict[str, bytes], data: st.DataObject
) -> None:
    if len({n.casefold() for n in files}) != len(files):
        return  # case collisions are refused; covered above
    order = data.draw(st.permutations(sorted(files)))
    trees = []
    for names in (sorted(files), order):
        skill = make_skill(tmp_path_factory.mktemp("h"))
        for n in names:
            (skill / "d").mkdir(exist_ok=True)
            (skill / "d" / n).write_bytes(files[n])
        trees.append(load_skill_tree(skill))
    assert [e.rel for e in trees[0].entries] == [e.rel for e in trees[1].entries]
    assert tree_hash(trees[0]) == tree_hash(trees[1])


# --- the copy ----------------------------------------------------------------------------------


def test_copy_tree_keeps_modes_mtimes_and_links_and_returns_the_same_hash(tmp_path: Path) -> None:
    skill = make_skill(tmp_path / "src", files={"bin/run": "#!/bin/sh\n", "ro/data": "d"})
    (skill / "bin/run").chmod(0o755)
    (skill / "link").symlink_to("bin/run")
    (skill / "ro").chmod(0o555)
    os.utime(skill / "bin/run", ns=(10**18, 10**18))
    tree = load_skill_tree(skill)
    dest = tmp_path / "dest" / "demo"
    dest.parent.mkdir()
    assert copy_tree(tree, dest) == tree_hash(tree)
    assert stat.S_IMODE((dest / "bin/run").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "ro").stat().st_mode) == 0o555
    assert (dest / "bin/run").stat().st_mtime_ns == 10**18
    assert os.readlink(dest / "link") == "bin/run"
    copied = load_skill_tree(dest)
    assert [(e.rel, e.mode, e.mtime_ns) for e in copied.entries] == [
        (e.rel, e.mode, e.mtime_ns) for e in tree.entries
    ]
    (skill / "ro").chmod(0o755)
    (dest / "ro").chmod(0o755)

"""skills-lock.toml: written sorted and stable, read back as an untrusted file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootstrap.errors import ConfigError
from bootstrap.sources.lockfile import LockedSkill, read, write

A = LockedSkill("alpha", "https://example.com/a.git", "branch", "main", "skills/*",
                "skills/alpha", "1" * 40, "a" * 64)
B = LockedSkill("beta", "git://example.com/b é\x7f\"q", "tag", "v1", None, "", "2" * 40, "b" * 64)


def test_written_sorted_stable_and_read_back(tmp_path: Path) -> None:
    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    assert write(one, [B, A]) is True
    assert write(two, [A, B]) is True
    assert one.read_bytes() == two.read_bytes()
    assert write(one, [A, B]) is False  # unchanged bytes: not rewritten
    assert read(one) == [A, B]
    text = one.read_text()
    assert text.index('name = "alpha"') < text.index('name = "beta"')
    assert 'path = "."' in text


@pytest.mark.parametrize(("text", "words"), [
    ('version = 2\n', "version"),
    ('version = 1\n[[skill]]\nname = "../../x"\ngit = "g"\npath = "p"\ncommit = "'
     + "1" * 40 + '"\nsha256 = "' + "a" * 64 + '"\n', "invalid skill name"),
    ('version = 1\n[[skill]]\nname = "x"\ngit = "g"\npath = "p"\ncommit = "abc"\n'
     'sha256 = "' + "a" * 64 + '"\n', "40"),
    ('version = 1\n[[skill]]\nname = "x"\ngit = "g"\npath = "../p"\ncommit = "'
     + "1" * 40 + '"\nsha256 = "' + "a" * 64 + '"\n', "inside the repository"),
    ('version = 1\n[[skill]]\nname = "x"\n', "missing"),
    ('not toml [', "not a valid skills lock"),
])
def test_a_bad_lock_is_an_error_naming_the_file(tmp_path: Path, text: str, words: str) -> None:
    lock = tmp_path / "skills-lock.toml"
    lock.write_text(text)
    with pytest.raises(ConfigError, match=words) as caught:
        read(lock)
    assert str(lock) in str(caught.value)


def test_a_symlinked_or_huge_lock_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.toml"
    write(target, [A])
    link = tmp_path / "skills-lock.toml"
    os.symlink(target, link)
    with pytest.raises(ConfigError, match="cannot read the skills lock"):
        read(link)
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (9 * 1024 * 1024))
    with pytest.raises(ConfigError, match="cannot read the skills lock"):
        read(huge)

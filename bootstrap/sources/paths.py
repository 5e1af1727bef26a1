"""Where the git cache keeps things: ``<user cache>/git/``, its repositories and its trees.

A module of its own so that knowing a tree's place costs no import of git, fetching or
hashing: the config names cached git skills by their place at every load (``cached``).
"""

from __future__ import annotations

from pathlib import Path

from bootstrap import warm


def root() -> Path:
    return Path(warm.cache_dir()) / "git"


def trees_root() -> Path:
    return Path(warm.git_trees_dir())


def tree_path(sha256: str, name: str) -> Path:
    return trees_root() / sha256 / name

"""The pin's files are durable before the base marker that says their generation is complete.

Issue 31, item 13 cut the pin's fsyncs from six to four (an empty ``.in-use`` created in place,
one directory fsync for the module and the ``.pth``). A power loss cannot be staged here, so the
test keeps the model of one: at the instant the base marker is renamed into a new generation,
every file of the pin must have its directory entry in a directory fsync made before (the names
listed when it ran) and its bytes in a file fsync of its inode (or have none).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest

from bootstrap.cli import main
from bootstrap.env.marker import MARKER_NAME
from bootstrap.env.pin import IN_USE, MODULE, PIN_NAME
from testing.world import World


class Durability:
    """What fsync has made durable so far: names per directory, inodes whose bytes are."""

    def __init__(self) -> None:
        self.names: dict[str, set[str]] = defaultdict(set)
        self.inodes: set[tuple[int, int]] = set()
        self.checked: list[Path] = []

    def synced(self, fd: int) -> None:
        st = os.fstat(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            self.names[path] |= set(os.listdir(path))
        else:
            self.inodes.add((st.st_dev, st.st_ino))

    def lacking(self, path: Path) -> list[str]:
        """What a power loss now could take from ``path``."""
        st = path.lstat()
        lost = [] if path.name in self.names[str(path.parent)] else ["its directory entry"]
        if st.st_size and (st.st_dev, st.st_ino) not in self.inodes:
            lost.append("its bytes")
        return lost


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names an fd through /proc")
def test_the_pin_is_durable_before_the_base_marker(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(tmp_path)
    w.write_config(requirements=["requests>=2"])
    w.ensure()
    w.write_config(requirements=["requests>=2", "six"])
    seen = Durability()
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        real_fsync(fd)
        seen.synced(fd)

    def replace(src: str | Path, dst: str | Path, **kwargs: object) -> None:
        target = Path(os.fsdecode(dst))
        if target.name == MARKER_NAME and ".gen-" in target.parent.name:
            pin = [target.parent / IN_USE]
            for site in target.parent.glob("lib/python*/site-packages"):
                pin += [site / f"{MODULE}.py", site / PIN_NAME]
            assert {str(p): seen.lacking(p) for p in pin} == {str(p): [] for p in pin}
            seen.checked += pin
        real_replace(src, dst, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setenv("KERNEL_BOOTSTRAP_UV", str(w.uv))
        m.setenv("FAKE_UV_LOG", str(w.uv_log))
        m.setattr(os, "fsync", fsync)
        m.setattr(os, "replace", replace)
        assert main(["ensure", "--config", str(w.config)]) == 0
    assert len(seen.checked) == 3  # the base marker of the new generation was written
    assert w.imports("six")

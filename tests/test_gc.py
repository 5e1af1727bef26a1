"""`gc --root`: what a killed publish left beside a skill root is removed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from testing.world import World


def test_gc_removes_the_staging_of_a_dead_publish(tmp_path: Path) -> None:
    world = World(tmp_path / "w")
    skill = world.skill("alpha", python=False)
    root = tmp_path / "skills-root"
    done = subprocess.run([sys.executable, "-m", "bootstrap", "publish", str(skill),
                           "--into", str(root)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    # A dead process's staging copy, named as publish names them (pid first).
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    staging = tmp_path / ".skills-root.kb-publish" / "staging" / f"{dead.pid}-deadbeef"
    (staging / "alpha").mkdir(parents=True)
    (staging / "alpha" / "SKILL.md").write_text("half")
    result = subprocess.run([sys.executable, "-m", "bootstrap", "gc", "--root", str(root),
                             "--json"], capture_output=True, text=True, check=False,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert any(str(staging) in line for line in json.loads(result.stdout)["done"])
    assert not staging.exists()
    assert (root / "alpha" / "SKILL.md").is_file()
    assert sorted(p.name for p in root.iterdir()) == ["alpha"]

"""The in-process warm ``ensure()`` (a kernel that calls the library at every start) parses no
SKILL.md the warm fingerprint vouches for, so it never imports PyYAML (~20 ms)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bootstrap import warm
from testing.world import World

CHILD = """
import json, sys
from bootstrap import ensure, load_config
result = ensure(load_config(sys.argv[1]))
print(json.dumps({"action": result.action, "failed": sorted(result.failed),
                  "yaml": "yaml" in sys.modules}))
"""


def _in_process(world: World) -> dict[str, object]:
    result = subprocess.run([sys.executable, "-c", CHILD, str(world.config)], capture_output=True,
                            text=True, env=world.env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    out: dict[str, object] = json.loads(result.stdout)
    return out


def _settled(world: World) -> None:
    world.ensure()
    time.sleep(0.05)  # a stamp within a clock tick of an edit is not trusted
    path = warm.fingerprint_path(str(world.config))
    assert path is not None
    Path(path).unlink()
    world.ensure()


def test_a_warm_in_process_ensure_imports_no_yaml(tmp_path: Path) -> None:
    world = World(tmp_path)
    for name in ("alpha", "beta"):
        world.skill(name)
    world.skill("notes", python=False)
    _settled(world)
    world.clear_log()
    assert _in_process(world) == {"action": "ready", "failed": [], "yaml": False}
    assert world.uv_calls() == []


def test_an_edited_skill_md_is_checked_again_in_process(tmp_path: Path) -> None:
    world = World(tmp_path)
    skill = world.skill("alpha")
    _settled(world)
    (skill / "SKILL.md").write_text("---\nname: alpha\ndescription: [unclosed\n---\n")
    assert _in_process(world)["failed"] == ["alpha"]  # no longer vouched for: checked

"""Which uv calls a group of skills needs when some paths hold ``#``.

Such a skill is reached only by a uv running beside it (``python_skill.working_dir``); skills
with no ``#`` go as absolute ``file://`` URLs and install from anywhere, so they join any call.
Skills under two different such directories need a uv call each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from bootstrap.skills.python_skill import PythonSkill, working_dir


def calls(group: Sequence[PythonSkill],
          wheels: Mapping[str, Path]) -> list[tuple[Path | None, list[PythonSkill]]]:
    """``group`` as uv calls: (working directory, skills), in the group's order. One call
    unless it holds ``#`` skills of more than one directory (built wheels go by URL)."""
    out: list[tuple[Path | None, list[PythonSkill]]] = []
    plain: list[PythonSkill] = []
    for skill in group:
        cwd = None if skill.name in wheels else working_dir(skill)
        if cwd is None:
            plain.append(skill)
            continue
        for where, members in out:
            if where == cwd:
                members.append(skill)
                break
        else:
            out.append((cwd, [skill]))
    if not out:
        return [(None, plain)]
    out[0][1][:0] = plain  # the plain ones ride with the first call
    return out

"""``kernel-bootstrap verify [--json] [--into ROOT]``: is every tree in use what it should be?

Three checks, each against a record that says what should be there: the git skills'
materialised trees against the skills lock's sha256; each tree ``publish`` recorded in a skill
root (``--into ROOT``, repeatable) against its recorded hash; each installed Python skill's
editable (its ``direct_url.json``, PEP 610) against the directory the marker says. Read-only;
exit 1 naming each changed, missing or extra file (per skill), 0 when all match. The trees are
hashed in this process (bootstrap.sources.verify); git runs only to name the files of a tree
that does not match.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bootstrap.config import Config, load_config
from bootstrap.env.venv import editable_urls, project_key, url_path
from bootstrap.errors import EXIT_FAILED, EXIT_OK
from bootstrap.sources.verify import Problem


def verify(config_path: Path | None, *, into: list[Path], as_json: bool) -> int:
    config = load_config(config_path)
    checked: dict[str, int] = {}
    problems: list[Problem] = []
    checked["git"], found = _git(config)
    problems += found
    checked["published"] = 0
    if into:
        from bootstrap.sources.verify import check_published

        local = {s.name: s.path for s in config.skills}
        for root in into:
            count, found = check_published(root.absolute(), local)
            checked["published"] += count
            problems += found
    checked["editables"], found = _editables(config.venv)
    problems += found
    if as_json:
        print(json.dumps({"ok": not problems, "checked": checked,
                          "problems": [_as_dict(p) for p in problems]}))
    else:
        _print(checked, problems)
    return EXIT_FAILED if problems else EXIT_OK


def _git(config: Config) -> tuple[int, list[Problem]]:
    if not config.git_sources or config.skills_lock is None:
        return 0, []
    from bootstrap.sources import fetch, lockfile
    from bootstrap.sources.verify import check_git

    by_key = {lockfile.source_key(s): s for s in config.git_sources}
    entries = [e for e in lockfile.read(config.skills_lock) if e.source_key in by_key]
    return check_git(entries, lambda e: fetch.repo_path(by_key[e.source_key]))


def _editables(venv: Path) -> tuple[int, list[Problem]]:
    """Each Python skill the marker records installed, against its ``direct_url.json``."""
    from bootstrap.env.marker import read_marker

    marker = read_marker(venv)
    if marker.data is None:
        bad = marker.state == "corrupt"
        return 0, [Problem("editable", "-", str(venv), marker.problem)] if bad else []
    urls = editable_urls(venv)
    problems = []
    for name, record in sorted(marker.data["skills"].items()):
        want = os.path.realpath(record["path"])
        url = urls.get(project_key(record["project"]))
        where = url_path(url) if url else None
        if where is None:
            detail = f"no editable install of {record['project']} in {venv}"
        elif where != want:
            detail = f"the editable points at {where}, the marker says {want}"
        elif not os.path.isdir(want):
            detail = f"the editable points at {want}, which is gone"
        else:
            continue
        problems.append(Problem("editable", name, want, detail))
    return len(marker.data["skills"]), problems


def _as_dict(p: Problem) -> dict[str, Any]:
    return {"kind": p.kind, "name": p.name, "path": p.path, "detail": p.detail,
            "changed": list(p.changed), "missing": list(p.missing), "extra": list(p.extra)}


def _print(checked: dict[str, int], problems: list[Problem]) -> None:
    for p in problems:
        print(f"{p.kind} {p.name} ({p.path}): {p.detail}")
        for label, files in (("changed", p.changed), ("missing", p.missing),
                             ("extra", p.extra)):
            for rel in files:
                print(f"  {label}: {rel}")
    counts = ", ".join(f"{n} {k}" for k, n in checked.items())
    print(f"{'verified' if not problems else 'FAILED'}: {counts} checked, "
          f"{len(problems)} problem{'s' if len(problems) != 1 else ''}")

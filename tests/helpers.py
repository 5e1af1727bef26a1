"""Helpers shared by the test modules. Append new helpers; do not rewrite others' code."""

from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _fake_uv_needs_pythonpath() -> bool:
    """Whether a child `python -m fake_uv`, run from outside the repo, cannot import it.

    It can when kernel-bootstrap is installed (editable) in the venv running the tests; a plain
    checkout needs the repo root on PYTHONPATH. Asked once per session, from `/`, because `-m`
    puts the working directory on sys.path and would hide the difference.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([sys.executable, "-c", "import fake_uv.__main__"], cwd="/", env=env,
                           capture_output=True, check=False)
    return probe.returncode != 0


def fake_uv_shim(directory: Path) -> Path:
    """Write an executable `directory/uv` that runs fake_uv with this interpreter; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["#!/bin/sh"]
    if _fake_uv_needs_pythonpath():
        root = shlex.quote(str(REPO_ROOT))
        lines.append(f'PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}}; export PYTHONPATH')
    lines.append(f'exec {shlex.quote(sys.executable)} -m fake_uv "$@"')
    shim = directory / "uv"
    shim.write_text("\n".join(lines) + "\n", encoding="utf-8")
    shim.chmod(0o755)
    return shim


def read_uv_log(log: Path) -> list[list[str]]:
    """The argv of every fake_uv call logged to `log` ($FAKE_UV_LOG), oldest first."""
    return [entry["argv"] for entry in read_uv_entries(log)]


def read_uv_entries(log: Path) -> list[dict[str, Any]]:
    """Every fake_uv call, oldest first: ``argv`` and ``pid``, and for ``pip install`` calls
    that got as far as reading their requirements, ``editables`` (directory names) and
    ``requirements`` (names) — the contents of -r files included."""
    try:
        text = log.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    calls: list[dict[str, Any]] = []
    by_pid: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry.get("detail"):
            call = by_pid.get(entry["pid"])
            if call is not None:
                call["editables"] = entry["editables"]
                call["requirements"] = entry["requirements"]
            continue
        calls.append(entry)
        by_pid[entry["pid"]] = entry
    return calls


def make_skill(parent: Path, name: str, files: dict[str, str] | None = None,
               executables: tuple[str, ...] | list[str] = ()) -> Path:
    """A skill directory ``parent/name`` with SKILL.md plus ``files`` (rel -> text); the paths in
    ``executables`` get mode 0o755. (Added by the push tests.)"""
    root = parent / name
    root.mkdir(parents=True)
    (root / "SKILL.md").write_text(f"---\nname: {name}\ndescription: test skill\n---\n")
    for rel, text in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel in executables:
        (root / rel).chmod(0o755)
    return root


def run_with_tty_stderr(cmd: list[str], env: dict[str, str], timeout: float = 60.0,
                        ) -> tuple[int, str, str]:
    """Run ``cmd`` with stderr on a pseudo-terminal (stdout stays a pipe): what a person at a
    shell sees. Returns (exit code, stdout, stderr) with the terminal's CRLF turned back into LF.
    (Added by the logging and progress tests.)"""
    import pty
    import select
    import time

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=slave, env=env)
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
        else:
            proc.kill()
            raise AssertionError(f"{cmd} did not finish within {timeout} s")
        assert proc.stdout is not None
        stdout = proc.stdout.read().decode()
        code = proc.wait(timeout=timeout)
    finally:
        os.close(master)
        if proc.stdout is not None:
            proc.stdout.close()
    return code, stdout, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")

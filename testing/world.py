"""A throwaway world for engine tests: a config, skills on disk, fake uv, and the CLI as a child.

Everything a test asserts is what another process would see: the CLI's stdout/stderr/exit code,
files on disk, the fake uv's invocation log, and what the venv's interpreter can import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testing.skills import Package, make_skill
from testing.uvlog import Call, fake_uv_shim, read_calls


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(value)


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.skills_dir = root / "skills"
        self.skills_dir.mkdir(parents=True, exist_ok=True)
        self.config = root / "kernel-bootstrap.toml"
        self.venv = root / "venv"
        self.uv_log = root / "uv.log"
        self.uv = fake_uv_shim(root / "bin")
        self.env: dict[str, str] = {
            **os.environ,
            "KERNEL_BOOTSTRAP_UV": str(self.uv),
            "FAKE_UV_LOG": str(self.uv_log),
        }
        self.write_config()

    # -- building the world ----------------------------------------------------------------
    def write_config(self, **keys: Any) -> None:
        settings: dict[str, Any] = {"venv": "venv", "skills": ["skills/*"]}
        settings.update({k.replace("_", "-"): v for k, v in keys.items()})
        lines = [f"{k} = {toml_value(v)}" for k, v in settings.items() if v is not None]
        self.config.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def skill(self, name: str, *, python: bool = True, deps: Sequence[str] = (),
              version: str = "0.1.0", project: str | None = None, flat: bool = False,
              files: Mapping[str, str | bytes] | None = None) -> Path:
        """A skill in the skills directory, by default a Python project (src layout)."""
        package = Package(project, version, deps, flat) if python else None
        return make_skill(self.skills_dir, name, files, description=f"test skill {name}",
                          body=f"# {name}\n", package=package, exist_ok=True)

    # -- running ---------------------------------------------------------------------------
    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "bootstrap", *args, "--config", str(self.config)]

    def run(self, *args: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args), capture_output=True, text=True,
                              env={**self.env, **(env or {})}, timeout=timeout, check=False)

    def ensure(self, *args: str, env: dict[str, str] | None = None,
               ok: bool = True) -> subprocess.CompletedProcess[str]:
        result = self.run("ensure", *args, env=env)
        if ok:
            assert result.returncode == 0, result.stderr
        return result

    def status(self) -> dict[str, Any]:
        result = self.run("status", "--json")
        assert result.returncode in (0, 1, 3), result.stderr  # 3: ready, but a skill failed
        data: dict[str, Any] = json.loads(result.stdout)
        return data

    # -- observing -------------------------------------------------------------------------
    def uv_calls(self) -> list[Call]:
        return read_calls(self.uv_log)

    def clear_log(self) -> None:
        self.uv_log.unlink(missing_ok=True)

    def installs(self) -> list[Call]:
        return [c for c in self.uv_calls() if c[:2] == ["pip", "install"]]

    @staticmethod
    def editables(call: Call) -> list[str]:
        return call.editables

    def venv_calls(self) -> list[Call]:
        return [c for c in self.uv_calls() if c[:1] == ["venv"]]

    def marker(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.venv / ".bootstrap-version").read_bytes())
        return data

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def imports(self, module: str) -> bool:
        # A bare environment (no PYTHONPATH leaks in) but for HOME: without it the account's
        # own home would be the child's (tests/conftest.py's home guard refuses that).
        env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
        result = subprocess.run([str(self.python), "-c", f"import {module}"],
                                capture_output=True, env=env, check=False)
        return result.returncode == 0

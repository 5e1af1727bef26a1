"""The runtime identity: one hash over everything that forces a rebuild of the venv.

It covers the interpreter request and the version the venv actually runs (read from
``pyvenv.cfg``, so the warm path needs no child process), the requirements (whitespace-
insensitive, order-insensitive), the constraints file's digest, ``uv-args``, the marker
schema and, when a ``lock`` is configured, the lock file's digest. Skills are not part of it:
a skill change never rebuilds the runtime.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NotRequired, TypedDict

from bootstrap.config import Config

SCHEMA = 1


class RuntimeInputs(TypedDict):
    schema: int
    python: str
    python_version: str
    requirements: list[str]
    constraints: str | None
    uv_args: list[str]
    lock: NotRequired[str | None]  # only with a `lock` configured



def normalise_requirement(text: str) -> str:
    # PEP 508 ignores whitespace outside quoted values, so "a >= 1" and "a>=1" are one runtime;
    # quoted marker values never contain spaces that matter in practice.
    return "".join(text.split())


def file_digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def runtime_inputs(config: Config, python_version: str) -> RuntimeInputs:
    inputs: RuntimeInputs = {
        "schema": SCHEMA,
        "python": config.python,
        "python_version": python_version,
        "requirements": sorted({normalise_requirement(r) for r in config.requirements}),
        "constraints": file_digest(config.constraints) if config.constraints else None,
        "uv_args": list(config.uv_args),
    }
    if config.lock is not None:
        # The key exists only with a lock configured: adding it to every identity would change
        # the identity of every existing venv and rebuild them all on upgrade.
        inputs["lock"] = _digest_or_none(config.lock)
    return inputs


def _digest_or_none(path: Path) -> str | None:
    # A missing or unreadable lock is refused before anything is built; here it only has to
    # differ from any recorded digest.
    try:
        return file_digest(path) if path.is_file() else None  # a FIFO would hang the read
    except OSError:
        return None


def identity_of(inputs: RuntimeInputs) -> str:
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def describe_change(old: dict[str, object], new: RuntimeInputs) -> list[str]:
    """Human reasons why a recorded runtime is stale ("requirements: +x -y")."""
    reasons: list[str] = []
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        if isinstance(value, list) and isinstance(before, list):
            added = [v for v in value if v not in before]
            removed = [v for v in before if v not in value]
            parts = [f"+{v}" for v in added] + [f"-{v}" for v in removed]
            reasons.append(f"{key}: {' '.join(parts)}")
        else:
            reasons.append(f"{key}: {before!r} -> {value!r}")
    return reasons

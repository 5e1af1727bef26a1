"""`uv pip compile --generate-hashes`, and installing hashed requirements (`--require-hashes`).

The fake index gives every release one "file" whose sha256 is that of `fake:NAME==VERSION`, so a
lock written here installs here, and a hand-edited hash fails the way uv fails. Unpinned
requirements resolve to the version in $FAKE_UV_LATEST (`name=version,...`), else the existing
output file's pin (uv keeps those unless `--upgrade`), else a lower bound, else 1.0.0.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from fake_uv import cli, reqs
from fake_uv.errors import UvExit, failure

COMPILE_SPEC: Final = cli.spec(
    "uv pip compile [OPTIONS] <SRC_FILE|--group <GROUP>>",
    flags={"--generate-hashes", "--upgrade", "--no-header", "--no-annotate", "--universal",
           "--no-index", "--strict"},
    valued={"--output-file", "--format", "--python", "--constraints", "--exclude-newer",
            "--index-url", "--extra-index-url", "--default-index", "--index", "--find-links",
            "--prerelease", "--resolution", "--python-version", "--python-platform",
            "--index-strategy"},
    aliases={"-o": "--output-file", "-c": "--constraints", "--constraint": "--constraints",
             "-U": "--upgrade", "-p": "--python", "-i": "--index-url", "-f": "--find-links"},
)
PYLOCK: Final = "pylock.toml"


def fake_hash(norm: str, version: str) -> str:
    return "sha256:" + hashlib.sha256(f"fake:{norm}=={version}".encode()).hexdigest()


def is_pylock(path: Path) -> bool:
    return path.name == PYLOCK or (path.name.startswith("pylock.")
                                   and path.name.endswith(".toml"))


def compile_(args: Sequence[str]) -> int:
    opts = cli.parse(args, COMPILE_SPEC)
    if not opts.positionals:
        raise UvExit(2, "error: the following required arguments were not provided:\n"
                        f"  <SRC_FILE|--group <GROUP>>\n\nUsage: {COMPILE_SPEC.usage}")
    requests = reqs.Requests()
    for source in opts.positionals:
        requests.read(Path(source))
    for path in opts.values("--constraints"):
        requests.read(Path(path), constraints=True)
    output = opts.value("--output-file")
    pylock = _wants_pylock(output, opts.value("--format"))
    previous = {} if opts.flag("--upgrade") or output is None else _pins(Path(output))
    resolved = _resolve(requests, previous)
    hashes = opts.flag("--generate-hashes")
    text = _pylock(resolved, hashes) if pylock else _requirements(resolved, hashes)
    if output is not None:
        Path(output).write_text(text, encoding="utf-8")
    if output is None or not opts.flag("--quiet"):
        print(text, end="")
    return 0


def _wants_pylock(output: str | None, fmt: str | None) -> bool:
    if fmt not in (None, "requirements.txt", PYLOCK):
        raise UvExit(2, f"error: invalid value '{fmt}' for '--format <FORMAT>'\n  "
                        "[possible values: requirements.txt, pylock.toml]")
    pylock = fmt == PYLOCK or (fmt is None and output is not None and is_pylock(Path(output)))
    if pylock and output is not None and not is_pylock(Path(output)):
        raise failure(2, "Expected the output filename to be `pylock.toml` or "
                         f"`pylock.<name>.toml`, where `<name>` is non-empty and contains no "
                         f"dots; found `{Path(output).name}`")
    return pylock


def _resolve(requests: reqs.Requests, previous: dict[str, str]) -> list[tuple[str, str]]:
    off_index = reqs.env_names("FAKE_UV_OFFINDEX")
    latest = _latest()
    resolved: dict[str, str] = {}
    for requirement in requests.requirements:
        if requirement.norm in off_index:
            raise failure(1, "No solution found when resolving dependencies", [
                f"Because {requirement.norm} was not found in the package registry and you "
                f"require {requirement.norm}, we can conclude that your requirements are "
                "unsatisfiable."])
        explicit = requests.version_for(requirement)
        has_bound = explicit != reqs.DEFAULT_VERSION or requirement.specifiers
        version = explicit if has_bound else previous.get(
            requirement.norm, latest.get(requirement.norm, explicit))
        resolved[requirement.norm] = version
    return sorted(resolved.items())


def _latest() -> dict[str, str]:
    found: dict[str, str] = {}
    for item in os.environ.get("FAKE_UV_LATEST", "").split(","):
        name, sep, version = item.partition("=")
        if sep:
            found[reqs.normalize(name.strip())] = version.strip()
    return found


def _requirements(resolved: list[tuple[str, str]], hashes: bool) -> str:
    lines = []
    for norm, version in resolved:
        if hashes:
            lines += [f"{norm}=={version} \\", f"    --hash={fake_hash(norm, version)}"]
        else:
            lines.append(f"{norm}=={version}")
        lines.append("    # via -r requirements.in")
    return "".join(f"{line}\n" for line in lines)


def _pylock(resolved: list[tuple[str, str]], hashes: bool) -> str:
    out = ['lock-version = "1.0"', 'created-by = "uv"', 'requires-python = ">=3.8"']
    if not resolved:
        out.append("packages = []")
    for norm, version in resolved:
        digest = fake_hash(norm, version).removeprefix("sha256:")
        wheel = f'{{ url = "https://fake.invalid/{norm}-{version}-py3-none-any.whl"'
        wheel += f', hashes = {{ sha256 = "{digest}" }} }}' if hashes else " }"
        out += ["", "[[packages]]", f'name = "{norm}"', f'version = "{version}"',
                f"wheels = [{wheel}]"]
    return "\n".join(out) + "\n"


def _pins(path: Path) -> dict[str, str]:
    """name -> version of an existing lock; its hashes do not matter for preferences."""
    return {norm: version for norm, version, _ in locked(path) if version} if path.is_file() else {}


def locked(path: Path) -> list[tuple[str, str | None, list[str]]]:
    """(name, pinned version or None, hashes) of each requirement in a lock or requirements file."""
    text = path.read_text(encoding="utf-8")
    if is_pylock(path):
        return _pylock_entries(text)
    entries: list[tuple[str, str | None, list[str]]] = []
    for line in text.replace("\\\n", " ").splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0].startswith("-"):
            continue
        hashes = [w.removeprefix("--hash=") for w in words[1:] if w.startswith("--hash=")]
        requirement = reqs.parse(" ".join(w for w in words if not w.startswith("--hash=")))
        entries.append((requirement.norm, requirement.pinned("==", "==="), hashes))
    return entries


def _pylock_entries(text: str) -> list[tuple[str, str | None, list[str]]]:
    import tomllib

    entries: list[tuple[str, str | None, list[str]]] = []
    for package in tomllib.loads(text).get("packages", []):
        files = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
        hashes = [f"sha256:{f['hashes']['sha256']}" for f in files if "sha256" in
                  f.get("hashes", {})]
        entries.append((reqs.normalize(package["name"]), package.get("version"), hashes))
    return entries


def add_locked(requests: reqs.Requests, path: Path, require_hashes: bool) -> None:
    """Add a hashed requirements file (or pylock.toml) to `requests`, checking hashes first."""
    for norm, version, hashes in locked(path):
        if require_hashes and version is None:
            raise failure(2, "In `--require-hashes` mode, all requirements must have their "
                             f"versions pinned with `==`, but found: {norm}")
        if require_hashes and not hashes:
            raise failure(2, "Hash-checking is required, but no trusted hash was provided "
                             f"for: `{norm}`")
        if version is not None and hashes and fake_hash(norm, version) not in hashes:
            raise _mismatch(norm, version, hashes)
        requests.add_requirement(f"{norm}=={version}" if version else norm, str(path))


def _mismatch(norm: str, version: str, hashes: list[str]) -> UvExit:
    expected = "\n".join(f"  {h}" for h in hashes)
    return failure(1, f"Failed to download `{norm}=={version}`", [
        f"Hash mismatch for `{norm}=={version}`\n\nExpected:\n{expected}\n\n"
        f"Computed:\n  {fake_hash(norm, version)}"])



def hashed(path: Path, require_hashes: bool) -> bool:
    """Whether `path` is read as a lock: a pylock.toml, hashes required, or a `--hash` in it."""
    if is_pylock(path) or require_hashes:
        return True
    try:
        return "--hash=" in path.read_text(encoding="utf-8")
    except OSError:
        return False  # the ordinary reader reports it as uv does

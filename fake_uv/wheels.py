"""Wheels: the fake index's `hatchling` carries a working PEP 660 backend, and a requirement
`name @ file:///x.whl` installs that wheel's files.

With these, kernel-bootstrap's batched builds and its build cache work against the fake uv as
against the real one (tests turn KERNEL_BOOTSTRAP_BATCH_BUILDS back on), so a rebuild's
cached skills ride along in the runtime's uv call.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Final

from fake_uv import dists, venvs
from fake_uv.errors import failure

# `hatchling/build.py` in the fake index's hatchling: run by the build worker with `-I`, so
# the standard library alone. An editable wheel is a .pth naming the import root.
BACKEND: Final = '''
import base64, hashlib, os, tomllib, zipfile

def get_requires_for_build_editable(config_settings=None):
    return []

def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    with open("pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    name, version = project["name"], project.get("version", "0.0.0")
    dist = name.replace("-", "_").replace(".", "_").lower()
    root = os.path.abspath("src" if os.path.isdir("src") else ".")
    info = f"{dist}-{version}.dist-info"
    metadata = "".join([f"Metadata-Version: 2.3\\nName: {name}\\nVersion: {version}\\n",
                        *(f"Requires-Dist: {d}\\n" for d in project.get("dependencies", []))])
    files = {f"_{dist}.pth": root + "\\n", f"{info}/METADATA": metadata,
             f"{info}/WHEEL": "Wheel-Version: 1.0\\nGenerator: fake\\nRoot-Is-Purelib: true\\n"
                              "Tag: py3-none-any\\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
        record.append(f"{path},sha256={digest.rstrip(b'=').decode()},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\\n".join([*record, f"{info}/RECORD,,"]) + "\\n"
    wheel = f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel
'''


def version_of(wheel: Path) -> str:
    """A wheel's version, from its file name: {distribution}-{version}-{tags}.whl."""
    return wheel.name.split("-")[1]


def install(venv: venvs.Venv, wheel: Path) -> None:
    """Unpack ``wheel`` into site-packages, its dist-info last, then record it as uv does."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise failure(2, f"Failed to read `{wheel.name}`", [str(exc)]) from None
    with archive:
        members = {i.filename: archive.read(i) for i in archive.infolist() if not i.is_dir()}
    info = f"{'-'.join(wheel.name.split('-')[:2])}.dist-info"
    meta = {n.removeprefix(f"{info}/"): d.decode() for n, d in members.items()
            if n.startswith(f"{info}/") and n != f"{info}/RECORD"}
    meta["INSTALLER"] = "uv"
    files = {n: d.decode() for n, d in members.items() if not n.startswith(f"{info}/")}
    dists.write(venv, files, info, meta)

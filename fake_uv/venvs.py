"""`uv venv`, and finding the venv a `uv pip` command targets."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, NamedTuple

from fake_uv import cli
from fake_uv.errors import UvExit, failure
from fake_uv.output import Console

_VERSION_REQUEST: Final = re.compile(r"(?:cpython-?|python)?(\d+(?:\.\d+){0,2})")
_BIN: Final = "Scripts" if sys.platform == "win32" else "bin"
_EXE: Final = "python.exe" if sys.platform == "win32" else "python"
_NO_VENV: Final = ("No virtual environment found; run `uv venv` to create an environment, or "
                   "pass `--system` to install into a non-virtual environment")

VENV_SPEC: Final = cli.spec(
    "uv venv [OPTIONS] [PATH]",
    flags={"--relocatable", "--clear", "--allow-existing", "--seed", "--force",
           "--system-site-packages"},
    valued={"--python", "--prompt", "--link-mode", "--index-url", "--exclude-newer"},
    aliases={"-p": "--python", "-c": "--clear"},
)


class Venv(NamedTuple):
    """A virtual environment on disk; `shown` is its root as the caller spelled it."""

    root: Path
    shown: str
    version: str
    relocatable: bool

    @property
    def bin(self) -> Path:
        return self.root / _BIN

    @property
    def python(self) -> Path:
        return self.bin / _EXE

    @property
    def site(self) -> Path:
        if sys.platform == "win32":
            return self.root / "Lib" / "site-packages"
        major_minor = ".".join(self.version.split(".")[:2])
        if major_minor:
            return self.root / "lib" / f"python{major_minor}" / "site-packages"
        found = sorted(self.root.glob("lib/python*/site-packages"))
        return found[0] if found else self.root / "lib" / "python" / "site-packages"


def locate(python: str | None) -> Venv:
    """The venv `--python PY` names (its interpreter or its root), else `$VIRTUAL_ENV`."""
    if python is None:
        active = os.environ.get("VIRTUAL_ENV")
        if not active:
            raise failure(2, _NO_VENV)
        return _read(Path(active), active)
    given = Path(python)
    if (given / "pyvenv.cfg").is_file():
        return _read(given, python)
    if not given.exists():  # a dangling bin/python symlink too: uv cannot query it either
        raise failure(2, f"Failed to inspect Python interpreter from provided path at `{python}`",
                      ["No such file or directory (os error 2)"])
    root = given.parent.parent
    if not (root / "pyvenv.cfg").is_file():
        raise failure(2, f"No virtual environment found for `{python}`: fake_uv installs only "
                         "into virtual environments (no pyvenv.cfg above its bin directory)")
    return _read(root, str(root))


def _read(root: Path, shown: str) -> Venv:
    config = _read_cfg(root / "pyvenv.cfg")
    version = config.get("version_info") or config.get("version", "")
    return Venv(Path(os.path.normpath(root.absolute())), shown, version,
                config.get("relocatable", "").lower() == "true")


def _read_cfg(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    pairs = (line.partition("=") for line in text.splitlines())
    return {key.strip(): value.strip() for key, sep, value in pairs if sep}


class Interpreter(NamedTuple):
    path: Path
    version: str
    running: bool  # the interpreter fake_uv itself runs on: build the venv in-process


def create(args: Sequence[str]) -> int:
    """`uv venv`: build a real venv with the stdlib, refusing to clobber like uv does."""
    opts = cli.parse(args, VENV_SPEC)
    if len(opts.positionals) > 1:
        raise failure(2, f"unexpected argument '{opts.positionals[1]}' found")
    console = Console(opts.flag("--quiet"))
    path = Path(opts.positionals[0] if opts.positionals else ".venv")
    interpreter = _interpreter(opts.value("--python"))
    console.say(f"Using CPython {interpreter.version} interpreter at: {interpreter.path}")
    seeded = " with seed packages" if opts.flag("--seed") else ""
    console.say(f"Creating virtual environment{seeded} at: {path}")
    clear = _check_target(path, clear=opts.flag("--clear") or _env_true("UV_VENV_CLEAR"),
                          allow_existing=opts.flag("--allow-existing"), force=opts.flag("--force"))
    _build(interpreter, path, clear=clear,
           system_site=opts.flag("--system-site-packages"))
    if opts.flag("--relocatable"):
        with (path / "pyvenv.cfg").open("a", encoding="utf-8") as cfg:
            cfg.write("relocatable = true\n")
    console.say(f"Activate with: source {path}/{_BIN}/activate")
    return 0


def _interpreter(request: str | None) -> Interpreter:
    running = Interpreter(Path(getattr(sys, "_base_executable", sys.executable)),
                          ".".join(map(str, sys.version_info[:3])), True)
    if request is None:
        return running
    version = _VERSION_REQUEST.fullmatch(request)
    if version:
        wanted = version[1].split(".")
        if running.version.split(".")[: len(wanted)] == wanted:
            return running
        raise failure(2, f"No interpreter found for Python {request} in managed installations "
                         "or search path")
    path = Path(request) if os.sep in request else Path(shutil.which(request) or request)
    if not path.exists():
        raise failure(2, f"No interpreter found for path `{request}`")
    if path.resolve() in (Path(sys.executable).resolve(), running.path.resolve()):
        return running._replace(path=path)
    return Interpreter(path, _query_version(path), False)


def _query_version(python: Path) -> str:
    import subprocess

    code = "import sys; print('.'.join(map(str, sys.version_info[:3])))"
    try:
        done = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True,
                              check=False)
    except OSError as exc:
        raise failure(2, f"Failed to inspect Python interpreter at `{python}`",
                      [str(exc)]) from None
    if done.returncode != 0:
        raise failure(2, f"Failed to inspect Python interpreter at `{python}`",
                      [f"exit status {done.returncode}", done.stderr.strip()])
    return done.stdout.strip()


def _check_target(path: Path, *, clear: bool, allow_existing: bool, force: bool) -> bool:
    """Whether to clear `path` first; exit 2 where uv 0.13.9 refuses (wording copied from it)."""
    if not path.exists():
        return False
    if not path.is_dir():
        raise failure(2, "Failed to create virtual environment", [f"File exists at `{path}`"])
    if not any(path.iterdir()) or allow_existing:
        return False
    is_venv = (path / "pyvenv.cfg").is_file()
    if clear and (is_venv or force):
        return True
    if clear:
        raise failure(2, "Failed to create virtual environment",
                      ["uv will not clear a directory that is not a virtual environment"],
                      hint="Use the `--force` flag to remove the existing directory anyway")
    what = "virtual environment" if is_venv else "directory"
    raise failure(2, "Failed to create virtual environment",
                  [f"A {what} already exists at: {path}"],
                  hint=f"Use the `--clear` flag or set `UV_VENV_CLEAR=1` to replace the "
                       f"existing {what}")


def _build(interpreter: Interpreter, path: Path, *, clear: bool, system_site: bool) -> None:
    if interpreter.running:
        import venv  # ~20 ms: only `uv venv` pays for it

        venv.EnvBuilder(system_site_packages=system_site, clear=clear, symlinks=True,
                        with_pip=False).create(path)
        return
    import subprocess

    command = [str(interpreter.path), "-m", "venv", "--without-pip", "--symlinks"]
    command += ["--clear"] * clear + ["--system-site-packages"] * system_site + [str(path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise failure(2, "Failed to create virtual environment", [done.stderr.strip()])


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


FIND_SPEC = cli.spec("uv python find [OPTIONS] [REQUEST]", flags={"--system", "--no-project"})


def find(args: Sequence[str]) -> int:
    """`uv python find [--system] [REQUEST]`: print the interpreter a request resolves to."""
    opts = cli.parse(args, FIND_SPEC)
    if len(opts.positionals) > 1:
        raise failure(2, f"unexpected argument '{opts.positionals[1]}' found")
    request = opts.positionals[0] if opts.positionals else None
    try:
        interpreter = _interpreter(request)
    except UvExit:
        raise failure(2, f"No interpreter found for Python {request} in virtual environments, "
                         "managed installations, or search path") from None
    print(interpreter.path)
    return 0

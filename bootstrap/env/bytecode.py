"""The venv's bytecode matches ``compile-bytecode``, also when the key changed after a build.

Every install into the venv compiles what it installs (``--compile-bytecode``, added by
``Uv._install`` alone), and the marker records whether the whole venv is compiled. That record
can disagree with the config: the key was turned on over a venv built without it (or built by a
release that never compiled, or restored from a snapshot built without it), or turned off. uv
0.13.9 compiles only what a call installs, and a call that installs nothing compiles nothing
(measured), so turning the key on needs a compile of its own: the venv's interpreter runs
``compileall`` over site-packages, as uv itself does. Turning it off removes nothing (the
files are harmless) but is recorded at once, before anything is installed uncompiled, so that
turning it on again compiles those installs too.
"""

from __future__ import annotations

from typing import Final

from bootstrap.config import Config
from bootstrap.env.marker import compiled, read_marker, write_marker
from bootstrap.env.venv import Venv
from bootstrap.errors import ProcessError
from bootstrap.primitives import log, process, progress

# Compiling ipykernel's runtime took ~2 s here; a stuck compile must not hold the lock forever.
TIMEOUT: Final = 600.0


def settle(config: Config) -> None:
    """Under the lock, before the skills sync: compile what is installed if the config asks
    for bytecode and the marker does not record it; record the config's choice."""
    data = read_marker(config.venv).data
    if data is None or compiled(data) == config.compile_bytecode:
        return
    if config.compile_bytecode:
        log.info("compiling the bytecode of what the venv holds (compile-bytecode is on; the "
                 "venv was built without it)", venv=str(config.venv))
        compile_installed(Venv.at(config.venv))
    data["bytecode"] = config.compile_bytecode
    write_marker(config.venv, data)


def compile_installed(venv: Venv) -> None:
    """Compile every module in ``venv``'s site-packages (what is compiled already is skipped).

    Best effort, as uv's own compile: a file that does not compile (a package shipping test
    data in an older syntax) or a compile that fails is a warning, never a failed ``ensure``;
    the record is written all the same, or every later start would take the lock to retry.
    """
    progress.note("compiling bytecode")
    for site in venv.site_packages():
        if not site.is_dir():
            continue
        try:
            # -j 0: one worker per core, as uv does; -q: only what fails is printed.
            found = process.run(venv.python, "-m", "compileall", "-q", "-j", "0", str(site),
                                check=False, timeout=TIMEOUT,
                                what=f"could not compile the bytecode of {site}")
        except ProcessError as e:
            log.warning("the venv's packages could not be compiled; kernels will start slower "
                        "under PYTHONDONTWRITEBYTECODE=1", site=str(site), error=str(e))
            continue
        if found.returncode != 0:
            log.info("some files in the venv did not compile", site=str(site),
                     output=(found.stdout + found.stderr)[-2000:])

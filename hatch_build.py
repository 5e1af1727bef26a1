"""Builds the native stand-in (native/standin.c) into the wheel, where a C compiler is at hand.

The kernelspec then starts it instead of an interpreter (bootstrap.env.kernelspec.kernel_argv):
a served kernel's stand-in costs a small C program, not a Python start (BENCHMARKS.md). Without
a compiler, or off Linux, the wheel is the pure-Python one and kernelspecs take the lean argv:
nothing on the user's machine ever needs a compiler. An editable install builds it in place,
where the package is imported from.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = os.path.join("native", "standin.c")
TARGET = os.path.join("bootstrap", "kernels", "kb-standin")
# Warnings are not fatal here: another compiler's new warning must not cost a user the stand-in
# (tests/test_packaging.py holds the source to no warning with this machine's compiler).
FLAGS = ("-O2", "-std=c11", "-Wall", "-Wextra")


class NativeStandIn(BuildHookInterface):  # type: ignore[type-arg]  # generic in its config
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or not sys.platform.startswith("linux"):
            return
        built = self._compile()
        if built is None:
            return
        from packaging.tags import sys_tags

        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{next(iter(sys_tags())).platform}"
        if version != "editable":
            build_data["force_include"][built] = TARGET

    def _compile(self) -> str | None:
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        source, target = os.path.join(self.root, SOURCE), os.path.join(self.root, TARGET)
        if compiler is None or not os.path.isfile(source):
            missing = "no C compiler" if compiler is None else f"no {SOURCE}"
            self.app.display_warning(f"{missing}: the wheel holds no native stand-in")
            return None
        partial = f"{target}.{os.getpid()}.tmp"
        done = subprocess.run([compiler, *FLAGS, "-o", partial, source], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            self.app.display_warning(f"the native stand-in did not build: {done.stderr[-2000:]}")
            return None
        os.replace(partial, target)
        return target

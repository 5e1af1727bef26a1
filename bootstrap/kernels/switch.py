"""Whether kernels are served at all: the platform, $KERNEL_BOOTSTRAP_KERNEL_SERVER, the config.

Its own module (the family's ``__init__`` imports nothing, tests/test_imports.py): ``run``
asks it on the warm path for every kernel launch, so ``os`` and ``sys`` only.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing's import is not paid on the warm path
    from collections.abc import Mapping

# bootstrap.config_kernel.KERNEL_SERVER_ENV (not imported: the warm path does not load the config)
SWITCH = "KERNEL_BOOTSTRAP_KERNEL_SERVER"


def enabled(config_kernel_server: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Whether kernels are served: never off Linux (the server needs pidfds, SO_PEERCRED and
    /proc); there, $KERNEL_BOOTSTRAP_KERNEL_SERVER (0 or 1) wins over the config's
    ``kernel-server``. ``environ``: the kernel's environment, when not ours (the provisioner's
    kernels)."""
    if not sys.platform.startswith("linux"):
        return False
    switch = (os.environ if environ is None else environ).get(SWITCH, "")
    if switch in ("0", "1"):
        return switch == "1"
    return config_kernel_server

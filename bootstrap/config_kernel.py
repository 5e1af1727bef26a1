"""The config's kernel-server keys (``kernel-server``, ``kernel-preload``,
``kernel-idle-timeout``, ``kernel-preload-timeout``, ``kernel-spares``) and
``$KERNEL_BOOTSTRAP_KERNEL_SERVER``, read and checked for :mod:`bootstrap.config`."""

from __future__ import annotations

import os
from typing import Any, Final

from bootstrap.config_file import Reader, short, source_name
from bootstrap.errors import ConfigError

# 0 turns the kernel server off, 1 on, whatever the config says (bootstrap.kernels.enabled).
KERNEL_SERVER_ENV: Final = "KERNEL_BOOTSTRAP_KERNEL_SERVER"
MAX_SPARES: Final = 8


def kernel_keys(reader: Reader) -> dict[str, Any]:
    """``kernel-server``, ``kernel-preload`` (module names), ``kernel-idle-timeout`` and
    ``kernel-preload-timeout`` (seconds, > 0), checked; and $KERNEL_BOOTSTRAP_KERNEL_SERVER,
    which must be 0 or 1."""
    value = os.environ.get(KERNEL_SERVER_ENV, "")
    if value not in ("", "0", "1"):
        raise ConfigError(f"{KERNEL_SERVER_ENV}={short(value)}: must be 0 (off) or 1 (on)")
    preload = reader.strings("kernel-preload")
    for index, name in enumerate(preload):
        # The server imports each by name: a path or a typo with a space is no module.
        if not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(f"{source_name(reader.file)}: kernel-preload[{index}]: not a "
                              f"module name (dotted identifiers, e.g. \"numpy.linalg\"): "
                              f"{short(name)}")
    return {"kernel_server": reader.boolean("kernel-server", default=True),
            "kernel_preload": preload,
            "kernel_idle_timeout": _seconds(reader, "kernel-idle-timeout", 900.0),
            "kernel_preload_timeout": _seconds(reader, "kernel-preload-timeout", 60.0),
            "kernel_spares": _spares(reader)}


def _spares(reader: Reader) -> int:
    value = reader.data.get("kernel-spares", 1)
    # Each spare is a kernel's memory held in advance: a handful is plenty for one venv.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SPARES:
        raise reader.bad("kernel-spares", f"a whole number from 0 (off) to {MAX_SPARES}")
    return value


def _seconds(reader: Reader, key: str, default: float) -> float:
    value = reader.data.get(key, default)
    # bool is an int to Python, and NaN compares false both ways: neither is a number of seconds.
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value < float("inf"):
        raise reader.bad(key, "a number of seconds greater than 0")
    return float(value)

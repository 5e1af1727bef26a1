"""kernel-bootstrap: keep an agent kernel's venv and skills ready.

The public API is imported lazily so that ``import bootstrap`` stays cheap on the warm path::

    from bootstrap import ensure, load_config
    result = ensure(load_config("kernel-bootstrap.toml"))
    result.python  # the interpreter to start the kernel with
    result.failed  # {skill name: uv's error}

Used in-process, it writes nothing to stderr: events go to the standard ``logging`` module under
the logger ``kernel_bootstrap``. Expected failures raise :class:`BootstrapError` subclasses.
"""

from __future__ import annotations

# Not `from typing import ...`: typing costs ~5 ms and this module is on the warm path.
TYPE_CHECKING = False

__version__ = "0.1.0.dev0"

_LAZY = {
    "Config": "bootstrap.config",
    "load_config": "bootstrap.config",
    "ensure": "bootstrap.engine.ensure",
    "EnsureResult": "bootstrap.engine.results",
    "status": "bootstrap.engine.status",
    "repair": "bootstrap.engine.repair",
    "publish": "bootstrap.trees.publish",
    "push": "bootstrap.trees.push",
    "BootstrapError": "bootstrap.errors",
    "ConfigError": "bootstrap.errors",
    "SkillError": "bootstrap.errors",
    "LockTimeout": "bootstrap.errors",
    "UvError": "bootstrap.errors",
}

__all__ = [
    "BootstrapError",
    "Config",
    "ConfigError",
    "EnsureResult",
    "LockTimeout",
    "SkillError",
    "UvError",
    "__version__",
    "ensure",
    "load_config",
    "publish",
    "push",
    "repair",
    "status",
]

if TYPE_CHECKING:
    from bootstrap.config import Config, load_config
    from bootstrap.engine.ensure import ensure
    from bootstrap.engine.results import EnsureResult
    from bootstrap.errors import BootstrapError, ConfigError, LockTimeout, SkillError, UvError


def __getattr__(name: str) -> object:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'bootstrap' has no attribute {name!r}")
    import importlib

    # "module:attr" where the public name differs from the module's own.
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr or name)

"""The gate's warm check, made for a launcher that did not run it: the jupyter_client provisioner
(in Jupyter's process) and the native stand-in (the server makes it on the request's behalf,
``"warm": true``, see :mod:`protocol`). A start is served only when the gate's own warm path
would have offered it to the server: the config's fingerprint holds in the kernel's environment
(:func:`bootstrap.warm.holds`), nothing is to be reported (a failed or invalid skill, a refused
rebuild: the gate says those, and only its full path), the venv is the fingerprint's, and
kernels are served. Anything else is the gate's to do, so the start takes the argv.

Standard library and the warm path's modules only: the server imports it beside its preload.
"""

from __future__ import annotations

import os

from bootstrap import warm
from bootstrap.kernels import switch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# Where the fingerprint and the server are found, and the clock its backoffs read: the kernel's
# environment must agree with ours on them (warm.holds reads the rest from the kernel's).
SAME = ("HOME", "XDG_CACHE_HOME", warm.CLOCK_ENV)


def refusal(config: object, venv: object, env: Mapping[str, str]) -> str | None:
    """Why a start of ``venv`` through the gate of ``config`` (an absolute config file) in the
    environment ``env`` is not the gate's warm one, or None when it is."""
    if not isinstance(config, str) or warm.config_file_for(config) != config:
        return "the kernelspec names no absolute config file"
    for name in SAME:
        if env.get(name) != os.environ.get(name):
            return f"the kernel's {name} is not this process's"
    if env.get("KERNEL_BOOTSTRAP_PYTHON") \
            or env.get(warm.LOG_FORMAT_ENV, "") not in ("", "console", "json"):
        return "the gate takes its full path"
    held = warm.holds(config, env)
    if held is None:
        return "the warm fingerprint does not hold"
    if held[2] or held[3] or held[4] is not None:
        return "the gate has a skill failure to report"
    if not isinstance(venv, str) or os.path.abspath(venv) != held[0]:
        return "the kernelspec's venv is not the fingerprint's"
    if not switch.enabled(held[6], env):
        return "kernels are not served"
    return None

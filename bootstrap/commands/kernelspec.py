"""``kernel-bootstrap kernelspec install``: ensure, then a Jupyter kernelspec for the venv."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bootstrap.config import load_config
from bootstrap.errors import EXIT_OK
from bootstrap.primitives import log


def install(config_path: Path | None, *, name: str, display_name: str | None, user: bool,
            prefix: Path | None, as_json: bool, direct: bool = False,
            provisioner: bool = False) -> int:
    """``user`` is the default location; it is a flag only so that it can be said explicitly.
    ``direct``: the spec starts the venv's interpreter itself, without the gate.
    ``provisioner``: jupyter_client starts it through ours (the gate's argv its fallback)."""
    from bootstrap.engine.ensure import ensure
    from bootstrap.env import kernelspec

    del user  # the user's data dir is what we use whenever no --prefix is given
    kernel = kernelspec.check_name(name)
    config = load_config(config_path)
    # Before ensure: a config without ipykernel must not cost a venv build to find out.
    kernelspec.require_ipykernel(config)
    if config.venv_from == "default" and not direct:
        # A config naming no venv gets one under the user data dir, which a launcher with
        # another HOME or XDG_DATA_HOME finds elsewhere: it silently built a second venv. The
        # spec's env carries the venv resolved here; set for ensure too, so that the warm
        # fingerprint it saves (the env is part of it) is the one the first kernel start finds.
        os.environ["KERNEL_BOOTSTRAP_VENV"] = str(config.venv)
    # The first kernel start is then warm; every start goes through the gate unless --direct.
    result = ensure(config)
    spec = kernelspec.spec_for(result.python, kernel, display_name, config, direct=direct,
                               provisioner=provisioner)
    if provisioner and not kernelspec.provisioner_installed():
        # jupyter_client lists no kernel whose provisioner it cannot load.
        log.warning(f"{kernelspec.PROVISIONER} is not installed beside this interpreter; "
                    "Jupyter lists this kernel only where kernel-bootstrap is installed in "
                    "Jupyter's own environment", provisioner=kernelspec.PROVISIONER)
    path = kernelspec.install_spec(kernelspec.kernels_dir(prefix), kernel, spec)
    log.info("kernelspec installed", name=kernel, path=str(path),
             display_name=spec["display_name"])
    if as_json:
        print(json.dumps({"name": kernel, "path": str(path), "argv": spec["argv"]}))
    else:
        print(path)
    return EXIT_OK

"""The jupyter_client provisioner's registration: jupyter_client finds it by the name the
kernelspec gives (the package's entry point), and the tool's core never imports jupyter_client."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bootstrap.env import kernelspec

jupyter_client = pytest.importorskip("jupyter_client")


def test_jupyter_client_finds_the_provisioner_a_kernelspec_names() -> None:
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import KernelManager
    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    from bootstrap.kernels.provisioner import BootstrapProvisioner

    spec = KernelSpec(argv=["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                      display_name="k", language="python",
                      metadata={"kernel_provisioner": {"provisioner_name":
                                                       kernelspec.PROVISIONER}})
    factory = KernelProvisionerFactory.instance()
    assert factory.is_provisioner_available(spec)
    provisioner = factory.create_provisioner_instance("id", spec, parent=KernelManager())
    assert type(provisioner) is BootstrapProvisioner
    assert kernelspec.provisioner_installed()


def test_only_the_provisioner_imports_jupyter_client() -> None:
    code = ("import sys, bootstrap.cli, bootstrap.commands.kernelspec, bootstrap.env.kernelspec, "
            "bootstrap.kernels.client, bootstrap.kernels.child, bootstrap.kernels.loop; "
            "print(sorted(m for m in sys.modules if m.startswith('jupyter')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"

"""A jupyter_client kernel provisioner (issue 36): kernels straight from the venv's kernel server,
with no stand-in between, and no port race.

A kernelspec installed with ``kernelspec install --provisioner`` names it in
``metadata.kernel_provisioner``; its argv stays the gate's (``kernel-bootstrap run``), the
fallback. At each start the provisioner checks, in-process, what the gate would: the warm
fingerprint of the config ``metadata.kernel_bootstrap`` names, in the kernel's environment
(:func:`bootstrap.warm.holds`), and whether kernels are served. When it holds and the venv's
server answers, it writes the connection file with jupyter_client's key and ports 0 and asks
the server for a kernel with ``"ports": true`` (:mod:`protocol`): ipykernel binds ports of its
own choosing, so none can be taken between a pick and a bind, and the kernel reports them. The
request connection stays open for the kernel's life (the kernel's watchdog kills it when it
closes: this process died) and carries the kernel's wait status (``exit``); signals go to the
kernel's process group, as jupyter_client's ``killpg`` reaches a bare kernel, while a pidfd says
the kernel lives. Anything else (no fingerprint, a failure to report, no server, a refusal, a
start jupyter_client shapes in a way a fork cannot reproduce) launches the argv exactly as
:class:`~jupyter_client.provisioning.local_provisioner.LocalProvisioner` would, through one: the
gate then does the full check, and spawns the server for next time.

jupyter_client is no dependency of the tool: only this module imports it, and only
jupyter_client loads this module (the ``jupyter_client.kernel_provisioners`` entry point).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase

from bootstrap.kernels import gate, protocol, provisioned
from bootstrap.kernels.protocol import PORTS
from bootstrap.kernels.provisioned import Plan, Served

# What start_kernel may hand the launch for a served start; any other keyword (a pipe to read,
# preexec_fn, ...) or an independent kernel (it must outlive us) gets the ordinary start.
_KNOWN = frozenset({"env", "cwd", "stdin", "stdout", "stderr", "independent", "kernel_id",
                    "extra_arguments", "transport_encryption"})


class BootstrapProvisioner(KernelProvisionerBase):
    """See the module docstring. Served kernels are tracked here; ordinary ones by the
    :class:`LocalProvisioner` it delegates to."""

    pid: int | None = None
    pgid: int | None = None
    cwd: str | None = None
    _local: LocalProvisioner | None = None
    _plan: Plan | None = None
    _served: Served | None = None
    _kwargs: dict[str, Any] = {}  # noqa: RUF012  # pre_launch's, for an ordinary start after all

    @property
    def has_process(self) -> bool:
        return self._served is not None or (self._local is not None and self._local.has_process)

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The ordinary start's Popen, as LocalProvisioner's; None for a served kernel."""
        return None if self._served is not None or self._local is None else self._local.process

    def _delegate(self) -> LocalProvisioner:
        if self._local is None:
            self._local = LocalProvisioner(kernel_id=self.kernel_id, kernel_spec=self.kernel_spec,
                                           parent=self.parent)
        return self._local

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        self._kwargs, self._plan = dict(kwargs), None
        base = await KernelProvisionerBase.pre_launch(self, env=kwargs.get("env", os.environ))
        env: dict[str, str] = base["env"]
        found = self._servable(kwargs, env)
        if isinstance(found, str):
            self.log.debug("kernel-bootstrap: the ordinary start: %s", found)
            return await self._delegate().pre_launch(**kwargs)
        venv, config = found
        km: Any = self.parent
        _write_connection_file(km, env if "env" in kwargs else None)
        cmd = km.format_kernel_cmd(extra_arguments=kwargs.get("extra_arguments", []))
        cwd = os.path.abspath(kwargs.get("cwd") or os.getcwd())
        env["JPY_PARENT_PID"] = str(os.getpid())  # as jupyter_client's launch_kernel sets it
        self._plan = Plan(venv, config, cmd[cmd.index("--") + 1:], cwd, env,
                          kwargs.get("stdout"), kwargs.get("stderr"))
        launch = {k: v for k, v in kwargs.items()
                  if k not in ("extra_arguments", "transport_encryption")}
        return {**launch, "cmd": cmd, "env": env}

    def _servable(self, kwargs: dict[str, Any], env: dict[str, str]) -> tuple[str, str] | str:
        """(venv, config file) for a start the venv's server may serve; else why not."""
        metadata = (self.kernel_spec.metadata or {}).get("kernel_bootstrap") or {}
        config, venv = metadata.get("config"), metadata.get("venv")
        km = self.parent
        if not hasattr(os, "pidfd_open") or km is None:
            return "no pidfds here, or no kernel manager"
        unknown = set(kwargs) - _KNOWN
        if unknown or kwargs.get("independent") or kwargs.get("stdin") is not None \
                or kwargs.get("transport_encryption"):
            return f"start_kernel was given {sorted(unknown) or 'stdin or independent'}"
        if None in (provisioned.stream(kwargs.get("stdout"), 1),
                    provisioned.stream(kwargs.get("stderr"), 2)):
            return "stdout or stderr is a pipe"
        if km.transport != "tcp" or getattr(km, "curve_publickey", None) is not None:
            return "not a tcp kernel without CurveZMQ"
        args = self.kernel_spec.argv
        if "--" not in args or protocol.served_module(args[args.index("--") + 1:]) is None:
            return "the kernelspec's argv is not the gate's ipykernel launch"
        reason = gate.refusal(config, venv, env)
        if reason is not None:
            return reason
        assert isinstance(venv, str) and isinstance(config, str)  # gate.refusal's None says so
        return os.path.abspath(venv), config

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        plan, self._plan = self._plan, None
        if plan is not None:
            asked = await asyncio.to_thread(provisioned.ask, plan, self.log)
            if asked is not None:
                return self._started(plan, *asked)
            _forget_connection_file(self.parent)
            kwargs = await self._delegate().pre_launch(**self._kwargs)
            cmd = kwargs.pop("cmd")
        self.connection_info = await self._delegate().launch_kernel(cmd, **kwargs)
        local = self._delegate()
        self.pid, self.pgid, self.cwd = local.pid, local.pgid, local.cwd
        return self.connection_info

    def _started(self, plan: Plan, served: Served, ports: dict[str, int]) -> KernelConnectionInfo:
        km: Any = self.parent
        km.load_connection_info(ports)  # its ports are 0 (or already these): taken as given
        self.connection_info = km.get_connection_info()
        self._served = served
        self.pid = self.pgid = served.pid
        self.cwd = self._delegate().cwd = plan.cwd  # resolve_path's base, as LocalProvisioner's
        return self.connection_info

    async def poll(self) -> int | None:
        if self._served is not None:
            return self._served.returncode()
        return await self._local.poll() if self._local is not None else 0

    async def wait(self) -> int | None:
        served = self._served
        if served is None:
            return await self._local.wait() if self._local is not None else 0
        if served.pidfd is not None and not served.ended():
            await _readable(served.pidfd)
        code = served.returncode()
        served.close()
        self._served = None  # has_process is False from now on, as LocalProvisioner's
        return code

    async def send_signal(self, signum: int) -> None:
        if self._served is not None:
            self._served.signal(signum)
        elif self._local is not None:
            await self._local.send_signal(signum)

    async def kill(self, restart: bool = False) -> None:
        if self._served is not None:
            self._served.signal(signal.SIGKILL)
        elif self._local is not None:
            await self._local.kill(restart)

    async def terminate(self, restart: bool = False) -> None:
        if self._served is not None:
            self._served.signal(signal.SIGTERM)
        elif self._local is not None:
            await self._local.terminate(restart)

    async def cleanup(self, restart: bool = False) -> None:
        if self._served is not None:
            self._served.close()
            self._served = None
        if self._local is not None:
            await self._local.cleanup(restart)

    def resolve_path(self, path: str) -> str | None:
        return self._delegate().resolve_path(path)

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info.update({"pid": self.pid, "pgid": self.pgid})
        return info


def _write_connection_file(km: Any, env: dict[str, str] | None) -> None:
    """The kernel manager's connection file as its own ``write_connection_file`` writes it,
    but with its ports as they are: 0 where none was chosen (the kernel chooses)."""
    from jupyter_core.paths import secure_write

    if not km.connection_file:
        import tempfile

        fd, km.connection_file = tempfile.mkstemp(".json")
        os.close(fd)
    km._record_random_port_names()  # which ports a restart with newports=True forgets
    info: dict[str, object] = {name: getattr(km, name) for name in PORTS}
    info.update(ip=km.ip, key=km.session.key.decode(), transport=km.transport,
                signature_scheme=km.session.signature_scheme, kernel_name=km.kernel_name)
    if env is not None:
        info["jupyter_session"] = env.get("JPY_SESSION_NAME", "")
    with secure_write(km.connection_file) as f:
        f.write(json.dumps(info, indent=2))
    km._connection_file_written = True


def _forget_connection_file(km: Any) -> None:
    """Before the ordinary start: LocalProvisioner keeps a file it finds written."""
    with contextlib.suppress(OSError):
        os.remove(km.connection_file)
    km._connection_file_written = False


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def ready() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await done
    finally:
        loop.remove_reader(fd)

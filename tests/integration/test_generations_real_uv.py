"""Running kernels keep their environment (real uv, six from the package index): a process
started from ``<venv>/bin/python`` before a rebuild imports its own generation's files after
it, and that generation goes once the process is gone, whether it exited or was SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import RealWorld

# Started before the rebuild; imports six only when told to, after it.
KERNEL = ("import sys\n"
          "print(sys.prefix, flush=True)\n"
          "sys.stdin.readline()\n"
          "import os, six\n"
          "print(six.__version__, six.__file__, os.path.isfile(six.__file__), flush=True)\n"
          "sys.stdin.readline()\n")


def six_in(python: Path) -> str:
    done = subprocess.run([str(python), "-c", "import six; print(six.__version__)"],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def generation_of(real: RealWorld) -> Path:
    return real.root / os.readlink(real.venv)


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_a_kernel_keeps_its_generation_across_a_rebuild(real: RealWorld, ending: str) -> None:
    real.write_config(requirements=["six==1.16.0"])
    result = real.ensure()
    assert result.stdout.strip() == str(real.venv / "bin" / "python")
    old = generation_of(real)
    kernel = subprocess.Popen([str(real.python), "-c", KERNEL], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert kernel.stdin is not None and kernel.stdout is not None
        assert kernel.stdout.readline().strip() == str(old)  # pinned, by its real path

        real.write_config(requirements=["six==1.17.0"])
        result = real.ensure("--json")
        assert json.loads(result.stdout)["action"] == "rebuild"
        assert json.loads(result.stdout)["python"] == str(real.venv / "bin" / "python")
        new = generation_of(real)
        assert new != old and six_in(real.python) == "1.17.0"

        kernel.stdin.write("import\n")
        kernel.stdin.flush()
        version, path, exists = kernel.stdout.readline().split()
        assert version == "1.16.0" and exists == "True"
        assert path.startswith(str(old) + "/")
        status = real.status()["generation"]
        assert status == {"current": str(new), "others": [{"path": str(old), "in_use": True}]}
        kept = json.loads(real.run("gc", "--json").stdout)["generations"]
        assert kept == {"removed": [], "in_use": [str(old)]} and old.is_dir()

        if ending == "exit":
            kernel.stdin.close()
        else:
            kernel.send_signal(signal.SIGKILL)
        kernel.wait(timeout=30)
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait()
    gone = json.loads(real.run("gc", "--json").stdout)["generations"]
    assert gone == {"removed": [str(old)], "in_use": []}
    assert not old.exists() and new.is_dir()
    assert sorted(n for n in os.listdir(real.root) if n.startswith(".venv.")) == [new.name]
    assert six_in(real.python) == "1.17.0"

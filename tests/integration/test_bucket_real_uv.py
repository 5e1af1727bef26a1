"""A real-uv venv baked into a bucket (moto's S3 server) restores in a second sandbox."""

from __future__ import annotations

import json
import subprocess

import pytest

from testing import s3server
from tests.integration.conftest import RealWorld

pytest.importorskip("moto.server", reason="moto[server] is not installed (test extra)")
pytest.importorskip("obstore", reason="obstore is not installed (cloud extra)")


def test_a_bucket_snapshot_restores_with_an_empty_uv_cache(real: RealWorld) -> None:
    with s3server.running() as endpoint:
        s3server.make_bucket(endpoint, "fleet")
        real.env.update(s3server.client_env(endpoint))
        real.write_config(requirements=[real.runtime_package()], snapshots="s3://fleet/kb")
        real.skill("alpha")
        real.ensure()
        real.clear_log()
        other = real.root / "other"
        result = real.ensure("--json", env={"KERNEL_BOOTSTRAP_VENV": str(other),
                                            "UV_CACHE_DIR": str(real.root / "empty-cache")})
    out = json.loads(result.stdout)
    assert out["action"] == "rebuild" and out["installed"] == [], result.stderr
    assert real.venv_calls() == [] and real.installs() == []
    script = subprocess.run([str(other / "bin" / "kb-runtime-demo")], capture_output=True,
                            text=True, check=False)
    assert script.stdout.strip() == "runtime ok"
    assert subprocess.run([str(other / "bin" / "python"), "-c", "import alpha"],
                          check=False).returncode == 0

"""``repair`` against the real uv (six from the package index): a runtime file deleted by hand
is found through its distribution's RECORD and put back (issue 31, item 8)."""

from __future__ import annotations

import json

from tests.integration.conftest import RealWorld


def test_a_deleted_six_py_is_found_and_reinstalled(real: RealWorld) -> None:
    real.skill("alpha")
    real.write_config(requirements=["six==1.17.0"])
    real.ensure()
    [six] = real.venv.glob("lib/python*/site-packages/six.py")
    six.unlink()
    assert not real.imports("six")
    assert real.status()["ready"] is True  # the marker and the metadata still say installed

    result = real.run("repair", "--json")
    data = json.loads(result.stdout)
    assert result.returncode == 0, result.stderr
    assert data["found"] == ["package six 1.17.0: six.py is missing"]
    assert data["done"][0].startswith("rebuilt the runtime")
    assert data["healthy"] is True and data["remaining"] == []
    assert six.is_file() and real.imports("six") and real.imports("alpha")
    again = json.loads(real.run("repair", "--json").stdout)
    assert again["found"] == [] and again["healthy"] is True

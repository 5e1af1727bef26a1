"""A pytest of its own, with the suite's guards (tests/conftest.py), for testing those guards:
what they do to a test is seen only once that test has ended."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

from testing import REPO_ROOT

# What the outer test's home fixture set; the inner run starts from a person's shell instead.
_PERSONAL = ("HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
             "UV_CACHE_DIR")


def run(tmp: Path, source: str, home: Path, env: Mapping[str, str] | None = None,
        ) -> subprocess.Popen[str]:
    """Start pytest on a test file of ``source`` in ``tmp``, as a person whose home is
    ``home`` would (no XDG variables), with ``env`` added. It loads tests/conftest.py as a
    plugin and keeps its temporary directories in ``tmp`` (not beside the outer run's, which a
    pytest of its own would prune)."""
    probe = tmp / "test_probe.py"
    probe.write_text(textwrap.dedent(source), encoding="utf-8")
    (tmp / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
            "tests.conftest", "-c", str(tmp / "pytest.ini"), "--rootdir", str(tmp),
            "--basetemp", str(tmp / "basetemp"), str(probe)]
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    ours = {k: v for k, v in os.environ.items() if k not in _PERSONAL}
    return subprocess.Popen(argv, cwd=tmp, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            env={**ours, "HOME": str(home), "PYTHONPATH": pythonpath,
                                 **(env or {})})

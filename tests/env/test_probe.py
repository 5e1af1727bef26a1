"""The one interpreter-child script (env/probe.py), run in a real interpreter: what it reports
about the interpreter, its distributions and imports, and how it fails."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from bootstrap.env.platform import local_platform
from bootstrap.env.probe import probe
from bootstrap.errors import ProcessError


def test_it_reports_the_interpreter_its_distributions_and_imports() -> None:
    found = probe(Path(sys.executable), ["pytest", "surely-not-installed"],
                  {"ok": ["json", "pathlib"], "broken": ["json", "surely_not_a_module"]})
    assert found.version == platform.python_version()
    assert found.markers["python_version"] == "{}.{}".format(*sys.version_info[:2])
    assert found.dists["surely-not-installed"] is None
    pytest_dist = found.dists["pytest"]
    assert pytest_dist is not None and pytest_dist.version == pytest.__version__
    assert found.import_errors["ok"] is None
    assert (found.import_errors["broken"] or "").startswith(
        "import surely_not_a_module: ModuleNotFoundError")
    assert found.everything == {}  # only when asked: importlib.metadata costs ~76 ms


def test_everything_lists_every_distribution_by_canonical_name() -> None:
    found = probe(Path(sys.executable), everything=True)
    version, requires = found.everything["pytest"]
    assert version == pytest.__version__
    assert any(r.startswith("pluggy") for r in requires)
    assert all(name == name.lower() and "_" not in name for name in found.everything)


def test_its_platform_is_what_this_process_sees_of_itself() -> None:
    found = probe(Path(sys.executable), isolated=True)
    assert found.platform == local_platform(platform.python_version()).as_dict()


def test_an_executable_that_is_not_python_names_the_probe_not_its_script(
        tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho nope >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(ProcessError) as raised:
        probe(fake)
    message = str(raised.value)
    assert f"the interpreter {fake} does not run" in message and "nope" in message
    assert "importlib" not in message  # the 40-line script is shown with -v only

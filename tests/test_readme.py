"""README.md stays true: every shell block that can run here runs, as written, in a throwaway
home and directory (against the fake uv), and every one that cannot is listed with the reason.

A new shell block must be added to one of the two tables below: an example nobody runs is how
the README came to advise commands that did not work for a newcomer (issue 31).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from bootstrap import config
from bootstrap.errors import ConfigError
from testing import REPO_ROOT
from testing.skills import make_skill
from testing.uvlog import fake_uv_shim

README = REPO_ROOT / "README.md"
SHELLS = ("sh", "bash", "shell")


def blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number, language, body) of every fenced block."""
    found: list[tuple[int, str, str]] = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL):
        line = text.count("\n", 0, match.start()) + 1
        found.append((line, match.group(1), match.group(2)))
    return found


def _publish(work: Path) -> Callable[[], None]:
    make_skill(work / "path" / "to", "my-skill")
    make_skill(work, "other-skill")

    def check() -> None:
        root = Path(os.environ["HOME"]) / ".claude" / "skills"
        assert sorted(p.name for p in root.iterdir()) == ["my-skill", "other-skill"]
        assert (root / "my-skill" / "SKILL.md").is_file()
    return check


def _kernelspecs(work: Path) -> Callable[[], None]:
    (work / "kernel-bootstrap.toml").write_text('requirements = ["ipykernel"]\n')

    def check() -> None:
        kernels = Path(os.environ["XDG_DATA_HOME"]) / "jupyter" / "kernels"
        assert sorted(p.name for p in kernels.iterdir()) == ["agent", "kernel-bootstrap"]
        conda = work / "conda" / "share" / "jupyter" / "kernels" / "kernel-bootstrap"
        assert (conda / "kernel.json").is_file()
    return check


def _first_config(work: Path) -> Callable[[], None]:
    def check() -> None:
        assert (work / "kernel-bootstrap.toml").is_file()
    return check


# The first words of a block that runs here -> what it needs first; returns its own check.
RUNNABLE: dict[str, Callable[[Path], Callable[[], None]]] = {
    "kernel-bootstrap publish path/to/my-skill": _publish,
    "kernel-bootstrap kernelspec install": _kernelspecs,
    "kernel-bootstrap init": _first_config,
}
# The first words of a block that cannot run here -> why not (and what covers it instead).
SKIPPED: dict[str, str] = {
    "bash scripts/run-example": "builds with the real uv from PyPI: needs the network "
                                "(tests/integration/test_real_uv.py builds the same way)",
    "bash scripts/run-tests": "is the whole test suite, this test among them",
    "python3 -m pip install uv": "installs from PyPI: needs the network",
    "exec kernel-bootstrap run": "starts a kernel on $CONNECTION_FILE: needs a Jupyter client "
                                 "(tests/integration/test_jupyter.py)",
    "PY=$(kernel-bootstrap ensure": "reads /etc/agent and starts a kernel: needs a Jupyter "
                                    "client (tests/integration/test_jupyter.py)",
    "# Docker: -i is required": "needs docker, kubectl and an ssh server "
                                "(tests/integration/test_docker.py, test_sshd.py)",
    "export AWS_ENDPOINT_URL": "needs an S3 server and credentials "
                               "(tests/integration/test_bucket_real_uv.py)",
}


def shell_blocks() -> list[tuple[int, str]]:
    return [(line, body) for line, lang, body in blocks(README.read_text(encoding="utf-8"))
            if lang in SHELLS]


def _kind(body: str) -> str:
    keys = [key for key in (*RUNNABLE, *SKIPPED) if body.startswith(key)]
    assert len(keys) == 1, f"add this README block to RUNNABLE or SKIPPED:\n{body}"
    return keys[0]


def test_every_shell_block_is_run_or_skipped_with_a_reason() -> None:
    kinds = [_kind(body) for _, body in shell_blocks()]
    assert sorted(kinds) == sorted({*RUNNABLE, *SKIPPED}), "a listed block left the README"


@pytest.mark.parametrize(("line", "body"), shell_blocks(), ids=lambda v: f"L{v}"
                         if isinstance(v, int) else "")
def test_a_readme_shell_block_runs_as_written(line: int, body: str, tmp_path: Path) -> None:
    kind = _kind(body)
    if kind in SKIPPED:
        pytest.skip(f"README.md:{line}: {SKIPPED[kind]}")
    work = tmp_path / "work"
    work.mkdir()
    check = RUNNABLE[kind](work)
    bin_dir = tmp_path / "bin"
    fake_uv_shim(bin_dir)
    command = bin_dir / "kernel-bootstrap"  # the console script, from this checkout
    command.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO_ROOT))}\n"
                       f'export PYTHONPATH\nexec {shlex.quote(sys.executable)} -m bootstrap "$@"\n')
    command.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "KERNEL_BOOTSTRAP_UV": str(bin_dir / "uv"), "CONDA_PREFIX": str(work / "conda"),
           "FAKE_UV_LOG": str(tmp_path / "uv.log")}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=work, env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, f"README.md:{line}\n{result.stdout}\n{result.stderr}"
    check()


def test_what_it_touches_names_every_file_beside_the_venv() -> None:
    # `<venv>.rebuild-failed` was written beside the venv but missing from this promise.
    architecture = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = architecture[architecture.index("| path | what | written by |"):]
    table = table[:table.index("\n\n")]
    beside = {name for name in re.findall(r"^\| `(\.?<venv>[^`/]*)`", table, flags=re.MULTILINE)
              if name != "<venv>"}
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("## What it touches"):]
    promise = section[:section.index("\n- **It reads")]
    spelled = {name.replace("-<pid>-<token>", "-*") for name in beside}
    assert "<venv>.rebuild-failed" in spelled
    assert [name for name in sorted(spelled) if f"`{name}`" not in promise] == []


def test_the_full_config_example_is_a_reference_and_writes_only_beside_itself(
        tmp_path: Path) -> None:
    # Used as written it wrote 60 MB to /mnt/kb-snapshots and failed one missing file at a time.
    readme = README.read_text(encoding="utf-8")
    start = readme.index("The keys, for reference")
    intro = readme[start:readme.index("```toml", start)]
    assert "not a config to copy as it is" in intro
    body = next(b for _, lang, b in blocks(readme[start:]) if lang == "toml")
    data = tomllib.loads(body)
    assert set(data) <= set(config._KEYS)
    for key in ("venv", "snapshots"):  # what it writes
        assert not Path(data[key]).is_absolute() and ".." not in Path(data[key]).parts, key
    example = tmp_path / "example" / "kernel-bootstrap.toml"
    example.parent.mkdir()
    example.write_text(body, encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        config.load_config(example)
    named = re.findall(r"`([^`]+)`", intro.split(";")[0])
    assert named == ["constraints.txt", "pylock.toml", "skills/", "../shared/pdf"]
    paths = [os.path.normpath(example.parent / name) for name in named]
    assert all(path in str(refused.value) for path in paths), str(refused.value)


def test_every_uv_install_it_advises_compiles_the_bytecode() -> None:
    # `uv tool install .` leaves the tool without bytecode: a warm `ensure` cost 1.46x a
    # `python -c pass` where it could not write it, 0.94x with it (issue 38).
    text = " ".join(README.read_text(encoding="utf-8").split())
    advised = re.findall(r"uv (?:tool|pip) install[^`\n]*?\.(?=[`\s])", text)
    assert advised, "the README no longer advises a uv install"
    assert [a for a in advised if "--compile-bytecode" not in a] == []

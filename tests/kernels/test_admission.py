"""Which requests a kernel server forks for (issue 35): only those whose kernel it can make
exactly what a bare start would be; the rest get the ordinary start, with the reason."""

from __future__ import annotations

import os
import sqlite3  # noqa: F401  # loaded, as in every server: a sqlite3.py beside a kernel shadows it
import sys
from pathlib import Path

import pytest

from bootstrap.kernels import admission

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


@pytest.fixture
def server(tmp_path: Path) -> admission.Server:
    config = tmp_path / "kernel-bootstrap.toml"
    config.write_text("")
    return admission.Server.now("/v/venv", "/v/.venv.gen-1", str(config), dict(os.environ), None)


LAUNCH = ["-m", "ipykernel_launcher", "-f", "/k/kernel-1.json"]


def request(server: admission.Server, **changes: object) -> dict[str, object]:
    return {"kind": "kernel", "argv": LAUNCH, "venv": server.venv,
            "generation": server.generation, "config": server.config, "securebits": 0,
            **changes}


def refusal(server: admission.Server, cwd: Path, message: dict[str, object] | None = None,
            env: dict[str, str] | None = None) -> str | None:
    reason, context = admission.refusal(server, message or request(server),
                                        dict(os.environ) if env is None else env, str(cwd),
                                        os.getpid())
    assert (context is None) == (reason is not None)
    return reason


def test_a_request_like_the_server_is_served(server: admission.Server, tmp_path: Path) -> None:
    assert refusal(server, tmp_path) is None


@pytest.mark.parametrize("entry", ["sqlite3.py", "sqlite3.pyc", "sqlite3/__init__.py",
                                   "sqlite3.cpython-311-x86_64-linux-gnu.so"])
def test_a_module_beside_the_kernel_that_shadows_a_loaded_one_gets_the_ordinary_start(
        server: admission.Server, tmp_path: Path, entry: str) -> None:
    # A bare `python -m ipykernel_launcher` started here imports this file, not the server's.
    (tmp_path / entry).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / entry).write_text("raise ImportError('shadowed')\n")
    assert refusal(server, tmp_path) == \
        f"{entry.split('/')[0]} in its directory would shadow the module sqlite3"


def test_what_shadows_nothing_is_served(server: admission.Server, tmp_path: Path) -> None:
    (tmp_path / "sqlite3").mkdir()  # no __init__: a namespace portion, found after the real one
    (tmp_path / "notes.sqlite3.txt").write_text("")
    (tmp_path / "kb_not_loaded_anywhere.py").write_text("")
    assert refusal(server, tmp_path) is None


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("venv", "/other/venv", "the kernel server serves another venv"),
    ("generation", "/v/.venv.gen-2", "the kernel server serves another generation"),
    ("config", "/other/kernel-bootstrap.toml", "the kernel server serves another config"),
    ("securebits", None, "the request carries no securebits"),
])
def test_a_request_for_another_venv_generation_or_config_gets_the_ordinary_start(
        server: admission.Server, tmp_path: Path, field: str, value: object,
        reason: str) -> None:
    assert refusal(server, tmp_path, request(server, **{field: value})) == reason


@pytest.mark.parametrize("argv", [["-c", "pass"], ["-m", "ipykernel_launcher"],
                                  ["-X", "dev", *LAUNCH], ["-m", "http.server", "-f", "x"]])
def test_what_is_no_ipykernel_launch_is_never_forked(server: admission.Server, tmp_path: Path,
                                                     argv: list[str]) -> None:
    # The server asks it itself: the native stand-in sends whatever follows the gate's `--`.
    assert refusal(server, tmp_path, request(server, argv=argv)) == "not an ipykernel launch"


def test_a_server_that_does_not_serve_refuses_everything(tmp_path: Path) -> None:
    config = tmp_path / "k.toml"
    config.write_text("")
    server = admission.Server.now("/v", "/g", str(config), dict(os.environ), "a thread")
    assert refusal(server, tmp_path) == "a thread"


def test_a_start_variable_that_differs_gets_the_ordinary_start(server: admission.Server,
                                                                tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": "/elsewhere"}
    assert refusal(server, tmp_path, env=env) == "PYTHONPATH differs from the kernel server's"

"""Which host the reachability check asks (bootstrap.env.network.index_host): the one uv would go
to for its default index, or its proxy; none when no index is on the network."""

from __future__ import annotations

import socket

import pytest

from bootstrap.env import network


@pytest.fixture(autouse=True)
def no_index_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "HTTPS_PROXY", "https_proxy",
                 "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("uv_args", "host"), [
    ([], ("pypi.org", 443)),
    (["--index-url", "https://mirror.example:8443/simple"], ("mirror.example", 8443)),
    (["--index-url=http://10.0.0.5/simple"], ("10.0.0.5", 80)),
    (["-i", "https://a.example/simple", "--default-index", "https://b.example/s"],
     ("b.example", 443)),
    (["--extra-index-url", "https://extra.example/simple"], ("pypi.org", 443)),
    (["--no-index", "--find-links", "/wheels"], None),
    (["--default-index", "file:///srv/index"], None),
])
def test_the_default_index_of_uv_args(uv_args: list[str], host: tuple[str, int] | None) -> None:
    assert network.index_host(uv_args) == host


def test_uvs_environment_and_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_DEFAULT_INDEX", "https://env.example/simple")
    assert network.index_host([]) == ("env.example", 443)
    assert network.index_host(["--index-url", "https://args.example/s"]) == ("args.example", 443)
    monkeypatch.setenv("HTTPS_PROXY", "proxy.example:3128")
    assert network.index_host([]) == ("proxy.example", 3128)


def test_a_refused_port_is_unreachable_and_a_listening_one_is_not() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert network.unreachable("127.0.0.1", port) is None
    problem = network.unreachable("127.0.0.1", port)
    assert problem is not None and f"127.0.0.1:{port}" in problem


def test_offline_in_uv_args_is_offline_and_never_doubled() -> None:
    session = network.Network(False, ["--offline"])
    assert session.offline and session.args() == ("--offline",)
    assert session.args(["pip", "install", "--offline"]) == ()

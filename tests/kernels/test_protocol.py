"""Which launches a server may serve, and which environments it cannot give a forked kernel."""

from __future__ import annotations

import pytest

from bootstrap.kernels import protocol


@pytest.mark.parametrize("args, module", [
    (["-m", "ipykernel_launcher", "-f", "/tmp/k.json"], "ipykernel_launcher"),
    (["-m", "ipykernel", "--debug", "-f", "/tmp/k.json"], "ipykernel"),
    (["-m", "ipykernel_launcher", "--f=/tmp/k.json"], "ipykernel_launcher"),
    # An interpreter option before -m acts at interpreter start: the ordinary start.
    (["-X", "frozen_modules=off", "-m", "ipykernel_launcher", "-f", "/tmp/k.json"], None),
    (["-m", "ipykernel_launcher"], None),  # no connection file
    (["-m", "mykernel", "-f", "/tmp/k.json"], None),
    (["-c", "pass", "-m", "ipykernel", "-f", "x"], None),
])
def test_only_a_plain_ipykernel_launch_is_served(args: list[str], module: str | None) -> None:
    assert protocol.served_module(args) == module


def test_a_variable_read_only_at_interpreter_start_that_differs_means_the_ordinary_start() -> None:
    started = {"PATH": "/bin", "LANG": "C.UTF-8", "HOME": "/h", "PYTHONDONTWRITEBYTECODE": "1"}
    same = dict(started, PATH="/usr/bin", JPY_PARENT_PID="7")  # read at run time: served
    assert protocol.ordinary_reason(same, started) is None
    assert protocol.ordinary_reason(dict(started, PYTHONPATH="/x"), started) == \
        "PYTHONPATH differs from the kernel server's"
    unset = dict(started)
    del unset["PYTHONDONTWRITEBYTECODE"]
    assert protocol.ordinary_reason(unset, started) == \
        "PYTHONDONTWRITEBYTECODE differs from the kernel server's"
    assert protocol.ordinary_reason(dict(started, LANG="C"), started) is not None
    assert protocol.ordinary_reason(dict(started, HOME="/other"), started) is not None


def test_lines_are_split_across_chunks_and_bounded() -> None:
    lines = protocol.Lines()
    assert lines.feed(b'{"a": 1}\n{"b"') == [b'{"a": 1}']
    assert lines.feed(b': 2}\n') == [b'{"b": 2}']
    assert protocol.decode(b'{"b": 2}') == {"b": 2}
    assert protocol.decode(b"[1]") is None and protocol.decode(b"{") is None
    with pytest.raises(ValueError):
        lines.feed(b"x" * (protocol.MAX_MESSAGE + 1))


def test_a_request_is_checked_field_by_field() -> None:
    good: dict[str, object] = {"argv": ["-m", "ipykernel"], "cwd": "/w", "env": {"A": "1"}}
    assert protocol.valid_request(good) == (["-m", "ipykernel"], "/w", {"A": "1"})
    bads: list[dict[str, object]] = [{"cwd": "relative"}, {"argv": [1]}, {"env": {"A": 1}},
                                     {"env": []}]
    for bad in bads:
        assert protocol.valid_request({**good, **bad}) is None

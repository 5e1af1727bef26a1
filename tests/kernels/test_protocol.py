"""Which launches a server may serve, and which environments it cannot give a forked kernel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.kernels import protocol

PACKAGE_PARENT = Path(protocol.__file__).resolve().parents[2]


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


_MESSAGES: list[dict[str, object]] = [
    {"kind": "kernel", "argv": ["-m", "ipykernel_launcher", "-f", "/tmp/ü.json"],
     "env": {"A": "é\n\"\\\x01\U0001f600", "B": ""}, "securebits": 0, "big": 2**70,
     "f": 1.5, "t": True, "x": None, "nested": {"a": [1, {"b": []}]}},
    {}, {"pid": 3}, {"exit": 256}, {"ordinary": "PYTHONPATH differs"},
]


@pytest.mark.parametrize("message", _MESSAGES)
def test_messages_are_json_as_the_json_module_writes_and_reads_it(
        message: dict[str, object]) -> None:
    import json

    line = protocol.encode(message)
    assert line == json.dumps(message, separators=(",", ":")).encode() + b"\n"
    assert protocol.decode(line) == json.loads(line) == message
    assert protocol.decode(b"  " + line + b"\r\n") == message


@pytest.mark.parametrize("line", [b"[1]", b"{", b"", b" ", b'{"a":1} x', b'{"a":1}{}', b"\xff",
                                  b'"s"', b'{"a":"\x01"}', b'{"a": 01}', b"nul"])
def test_a_line_that_is_no_json_object_decodes_to_none(line: bytes) -> None:
    assert protocol.decode(line) is None


def test_what_json_refuses_to_write_is_refused_alike() -> None:
    circular: dict[str, object] = {}
    circular["c"] = circular
    with pytest.raises(ValueError, match="Circular"):
        protocol.encode(circular)
    with pytest.raises(TypeError, match="not JSON serializable"):
        protocol.encode({"a": object()})


def test_the_messages_need_no_json_package() -> None:
    # The stand-in's hand-off: importing json (re, enum) would cost it ~8 ms (bootstrap.cli).
    # (A malformed message may import it: on 3.10 and 3.11 only json raises the error.)
    code = ("import sys; from bootstrap.kernels import protocol as p\n"
            "assert p.decode(p.encode({'a': [1, 'x']})) == {'a': [1, 'x']}\n"
            "print(sorted({'json', 're', 'enum'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c",
                           f"import sys; sys.path.append({str(PACKAGE_PARENT)!r})\n{code}"],
                          capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n"

"""A process's title as ``ps`` and ``/proc/PID/cmdline`` show it (issue 35, item 9): the
arguments NUL-separated, cut to the argument area the process started with."""

from __future__ import annotations

import sys

import pytest

from tests.kernels.test_standin_exit import python

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernel server is Linux's")


def test_a_title_is_what_proc_and_ps_show_cut_to_the_argument_area() -> None:
    done = python(
        "import os\n"
        "from bootstrap.kernels.title import set_title\n"
        "def shown():\n"
        "    return open('/proc/self/cmdline', 'rb').read().rstrip(b'\\0').split(b'\\0')\n"
        "assert set_title(['kernel-bootstrap', 'kernel', 'server', '/v e/nv'])\n"
        "print(shown())\n"
        "assert set_title(['x' * 100000])\n"
        "title = shown()\n"
        "print(len(title), len(title[0]) < 100000)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[b'kernel-bootstrap', b'kernel', b'server', b'/v e/nv']",
                                        "1 True"]

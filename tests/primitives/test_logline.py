"""The one renderer of the CLI's lines (primitives/logline.py), which the warm path uses too:
its JSON lines are the bytes ``json.dumps(fields, default=str)`` wrote before it, and its
timestamps are ISO 8601 UTC to the microsecond."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bootstrap.primitives import logline

EVENTS: list[dict[str, object]] = [
    {"skill": "beta", "failures": 2, "retry_at": "2026-12-02T06:02:23Z", "event": "e",
     "level": "warning"},
    {"error": "line one\n  cause: \"quoted\" \\ tab\there", "path": Path("/tmp/x y"),
     "why": ["requirements: +six", "uv_args: [] -> ['--offline']"], "count": 0},
    {"none": None, "yes": True, "no": False, "big": 10**30, "neg": -1.5, "tiny": 1e-300,
     "inf": math.inf, "ninf": -math.inf, "nan": math.nan},
    {"unicode": "é ü 日本 \u2028", "surrogate": "bad\udcff name", "nul": "a\x00b",
     "nested": {"a": [1, {"b": None}], "c": (1, 2)}, "set": {"only"}},
]


@pytest.mark.parametrize("fields", EVENTS)
def test_a_json_line_is_what_json_dumps_writes(fields: dict[str, object]) -> None:
    line = logline.render_json(fields, now_ns=1_764_000_000_123_456_789)
    expected = json.dumps({**fields, "timestamp": "2025-11-24T16:00:00.123456Z"}, default=str)
    assert line == expected


def test_the_timestamp_keeps_its_microseconds_at_a_whole_second() -> None:
    assert logline.timestamp(1_764_000_000_000_000_000) == "2025-11-24T16:00:00.000000Z"

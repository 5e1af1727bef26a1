"""The kill matrix: SIGKILL ``ensure`` at every step boundary, then check from outside that the
next run finishes with nothing redone (the points and the checks: testing/killmatrix/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testing.killmatrix import POINTS, run_matrix, sweep, table


def test_a_kill_at_any_step_leaves_a_valid_state_that_the_next_ensure_finishes(
    tmp_path: Path,
) -> None:
    rows, failed = run_matrix(tmp_path)
    print(f"\n\nkill matrix ({len(rows)} of {len(POINTS)} kill points passed)\n{table(rows)}")
    assert not failed, "\n".join(f"{k}: {type(e).__name__}: {e}" for k, e in failed.items())


@pytest.mark.skipif(not os.environ.get("KB_STRESS"), reason="KB_STRESS=1: 58 more points")
def test_a_kill_before_or_after_every_replace_rename_and_exchange(tmp_path: Path) -> None:
    rows, failed = sweep(tmp_path)
    print(f"\n\nkill sweep ({len(rows)} kill points passed)\n{table(rows)}")
    assert not failed, "\n".join(f"{k}: {type(e).__name__}: {e}" for k, e in failed.items())

"""The clock a test's children read: ``$KERNEL_BOOTSTRAP_TEST_NOW`` (``warm.now``)."""

from __future__ import annotations

import time
from typing import Final

from bootstrap.warm import CLOCK_ENV

# "now" for backoff tests: ten days past the real clock, so that a record the real clock wrote
# can never pass for one of the test's own.
T0: Final = time.time() + 10 * 86400


def at(seconds: float, **env: str) -> dict[str, str]:
    """The environment of a child that sees the clock at ``T0 + seconds``."""
    return {CLOCK_ENV: repr(T0 + seconds), **env}

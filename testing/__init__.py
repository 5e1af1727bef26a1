"""The test kit: what tests/ and scripts/ share to build worlds and watch them.

One concept per module: ``skills`` (the skill factory), ``uvlog`` (the uv shims and the reader
of their call log), ``world`` (a throwaway config + skills + fake uv, and the CLI as a child),
``seams`` (killing or failing one syscall of a run), ``processes`` (children: start, wait,
kill, terminal, peak memory, sampling), ``counting`` (an exec prefix that counts calls and
keeps the bytes each got on stdin), ``s3server`` (moto's S3 API server on 127.0.0.1 and
the environment a child needs to reach it), ``killmatrix`` (the kill matrix: worlds, points,
checks, the run), ``kernels`` (kernels through jupyter_client: the readiness probe, many at
once, the orphan check), ``reaper`` (killing what a test left running), ``homeguard`` (the person's
state in the real home, out of the suite's reach), ``innerpytest`` (a pytest of its own, to
test those two). It lives in the checkout only; the wheel ships ``bootstrap`` alone.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

"""The kill matrix's engine (the tests in tests/test_kill_matrix.py and scripts/kill_matrix.py
run it): SIGKILL the whole ``ensure`` process group at every step boundary.

In four parts: ``worlds`` (each path's starting state), ``points`` (the steps and how each
is reached), ``checks`` (what must hold after a kill, one row of the table) and ``matrix``
(killing, and running every point).

Each row starts ``kernel-bootstrap ensure`` as a child in its own process group and kills the
group at one step of the cold path, of a staged rebuild (runtime change; with RENAME_EXCHANGE
and with the rename-aside fallback) or of the skills-only path. Steps inside uv are reached by
making the fake uv hang; steps between two syscalls (the base marker, the swap, each marker
merge, the final write) by a seam in the child that SIGKILLs its group just before or just
after the Nth replace/rename/exchange of the run (N found from a trace of the same run).

After each kill, from outside: the marker is valid or absent (never torn); where there was a
venv, its interpreter still runs; the next ``ensure`` succeeds, reinstalls no skill that the
marker records for the current runtime, and builds no venv when the marker already had the
current runtime; afterwards the environment is ready and nothing is left beside the venv.
(One exception, asserted as such: a kill inside the final marker write leaves its temp file,
and the next ensure is warm, which takes no lock and writes nothing; the next locked run or
``gc`` removes it.) Run with ``-s`` (or ``scripts/kill_matrix.py``) to see the table;
``KB_STRESS=1`` adds a sweep that kills just before and just after every replace, rename and
exchange of each path's run (58 points, 45-85 s here).
"""

from __future__ import annotations

from testing.killmatrix.checks import Row, table
from testing.killmatrix.matrix import run_matrix, sweep
from testing.killmatrix.points import POINTS, Point

__all__ = ["POINTS", "Point", "Row", "run_matrix", "sweep", "table"]
